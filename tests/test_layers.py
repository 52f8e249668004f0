"""The package's import graph runs one way: kernels at the bottom, then the model and the
resources, the backends and the planner, the engine, the server, and the tools and CLI on top;
the gate stands apart (it measures other trees' engines over HTTP and imports only the knob
parsing, the profile reading, the version, the CLI flags, the table rendering, the tools'
option types and the event loop's choice it shares), and
its own packages run one way too (GATE_LAYERS), with no cycle. Function-level imports count."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# lowest first; a module may import its own layer or any below
LAYERS = [
    ("resident.kernels", "resident.provenance", "resident.render", "resident.profiling",
     "resident.cli_flags", "resident.heap", "resident.tool_args", "resident.lifecycle",
     "resident.interpreter", "resident.eventloop"),
    ("resident.model", "resident.resources", "resident.parallel"),
    ("resident.config", "resident.info"),
    ("resident.backends", "resident.planner"),
    ("resident.engine",),
    ("resident.server",),
    ("resident.tools", "resident.cli", "resident.__main__"),
]
GATE_MAY_IMPORT = ("resident.config", "resident.profiling", "resident.provenance",
                   "resident.cli_flags", "resident.render", "resident.tool_args",
                   "resident.lifecycle", "resident.eventloop")


def _layer(module: str) -> int:
    for index, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# every module of the two packages
MODULES = {_module(path) for package in ("resident", "gate")
           for path in (ROOT / package).rglob("*.py")}


def _imports(path: Path) -> set[str]:
    """The resident and gate modules `path` imports (`from resident import eventloop` imports
    resident.eventloop)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names}
            found |= (submodules & MODULES) or {node.module}
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] in ("resident", "gate")}


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    upward = []
    for path in sorted((ROOT / "resident").rglob("*.py")):
        module = _module(path)
        for imported in _imports(path):
            outside = imported == "resident" or imported.startswith("gate")
            if outside or _layer(imported) > _layer(module):
                upward.append(f"{module} imports {imported}")
    assert not upward, "\n".join(upward)


# the gate's packages, lowest first; a module may import its own layer or any below. The records
# (runs, manifest, metrics) are the one contract between running a session and reporting it:
# the verdicts read them and neither runs nor reports; reports never import the running code;
# the check may use the running code's pieces; the commands sit on top.
GATE_LAYERS = [
    ("gate.records", "gate.manifest", "gate.metrics"),
    ("gate.verdict",),
    ("gate.config",),
    ("gate.report", "gate.run"),
    ("gate.check",),
    ("gate.commands", "gate.cli", "gate.__main__", "gate.tools"),
]
# pairs within one layer that must not meet
GATE_APART = [("gate.report", "gate.run"), ("gate.run", "gate.report")]


def _gate_layer(module: str) -> int:
    for index, prefixes in enumerate(GATE_LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"{module} is in no layer: add it to GATE_LAYERS")


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _gate_imports() -> dict[str, set[str]]:
    """Each gate module and the gate modules it imports."""
    return {_module(path): {name for name in _imports(path) if _within(name, "gate")}
            for path in sorted((ROOT / "gate").rglob("*.py"))}


def test_the_gates_packages_import_downwards_only():
    wrong = []
    for module, imported in _gate_imports().items():
        if module in ("gate", "gate.__main__"):
            continue
        for name in imported:
            if name == "gate":
                wrong.append(f"{module} imports the gate package itself")
            elif _gate_layer(name) > _gate_layer(module) or any(
                    _within(module, a) and _within(name, b) for a, b in GATE_APART):
                wrong.append(f"{module} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_the_gates_import_graph_has_no_cycle():
    graph = _gate_imports()
    modules = set(graph)
    edges = {m: {n for n in graph[m] if n in modules and n != m} for m in graph}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for name in sorted(edges[module]):
            if state.get(name) == 1:
                return [*path, module, name]
            if name not in state and (cycle := visit(name, [*path, module])):
                return cycle
        state[module] = 2
        return None

    for module in sorted(modules):
        if module not in state and (cycle := visit(module, [])):
            raise AssertionError("import cycle: " + " -> ".join(cycle))


def test_the_gate_imports_no_engine():
    reaching = [f"{_module(path)} imports {imported}"
                for path in sorted((ROOT / "gate").rglob("*.py"))
                for imported in _imports(path)
                if imported.startswith("resident") and not any(
                    imported == allowed or imported.startswith(allowed + ".")
                    for allowed in GATE_MAY_IMPORT)]
    assert not reaching, "\n".join(reaching)
