"""The package's import graph runs one way: kernels at the bottom, then the model and the
resources, the backends and the planner, the engine, the server, and the tools and CLI on top;
the gate stands apart (it measures other trees' engines over HTTP and imports only the knob
parsing, the profile reading, the version and the CLI flags it shares). Function-level imports
count."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# lowest first; a module may import its own layer or any below
LAYERS = [
    ("resident.kernels", "resident.provenance", "resident.render", "resident.profiling",
     "resident.cli_flags"),
    ("resident.model", "resident.resources"),
    ("resident.config", "resident.info"),
    ("resident.backends", "resident.planner"),
    ("resident.engine",),
    ("resident.server",),
    ("resident.tools", "resident.cli", "resident.__main__"),
]
GATE_MAY_IMPORT = ("resident.config", "resident.profiling", "resident.provenance",
                   "resident.cli_flags")


def _layer(module: str) -> int:
    for index, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] in ("resident", "gate")}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    upward = []
    for path in sorted((ROOT / "resident").rglob("*.py")):
        module = _module(path)
        for imported in _imports(path):
            outside = imported == "resident" or imported.startswith("gate")
            if outside or _layer(imported) > _layer(module):
                upward.append(f"{module} imports {imported}")
    assert not upward, "\n".join(upward)


def test_the_gate_imports_no_engine():
    reaching = [f"{_module(path)} imports {imported}"
                for path in sorted((ROOT / "gate").rglob("*.py"))
                for imported in _imports(path)
                if imported.startswith("resident") and not any(
                    imported == allowed or imported.startswith(allowed + ".")
                    for allowed in GATE_MAY_IMPORT)]
    assert not reaching, "\n".join(reaching)
