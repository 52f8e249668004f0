"""Arms: what each side of the gate runs.

`NAME=SPEC`, SPEC one of:
    git:<ref>   that commit, checked out as a worktree under .gate/worktrees/ (git-ignored)
    path:<dir>  a source tree on disk
    .           the working tree the gate runs from
    cmd:<cmd>   any OpenAI-compatible server command, with {host} and {port} filled in
A resident arm is launched as `<this python> -m resident serve` with its tree first on PYTHONPATH,
so every arm runs its own code. Knobs: `--set NAME.knob=value` for one arm, `--set knob=value` for
all of them.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


@dataclass(frozen=True)
class Arm:
    name: str
    spec: str
    kind: str  # resident | cmd
    tree: Path | None = None
    ref: str | None = None
    sha: str | None = None
    dirty: bool = False
    command: str | None = None
    knobs: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, "spec": self.spec, "kind": self.kind,
                "tree": str(self.tree) if self.tree else None, "ref": self.ref, "sha": self.sha,
                "dirty": self.dirty, "command": self.command, "knobs": dict(self.knobs)}

    @property
    def asks_for_planner(self) -> bool:
        return self.kind == "resident" and self.knobs.get("resident_planning", "auto") == "auto"


def split_arm(text: str) -> tuple[str, str]:
    name, sep, spec = text.partition("=")
    if not sep or not _NAME.match(name) or not spec:
        raise ValueError(f"--arm {text!r}: expected NAME=SPEC with NAME like main or head and "
                         "SPEC git:<ref>, path:<dir>, . or cmd:<command>")
    return name, spec


def split_knobs(options: list[str], arm_names: list[str]) -> dict[str, dict[str, str]]:
    """`--set` options -> knobs per arm name ('' holds the ones for every arm)."""
    knobs: dict[str, dict[str, str]] = {name: {} for name in ["", *arm_names]}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {option!r}: expected knob=value or ARM.knob=value")
        arm, dot, knob = key.partition(".")
        if dot and arm not in arm_names:
            raise ValueError(f"--set {option!r}: no arm named {arm!r} "
                             f"(arms: {', '.join(arm_names)})")
        knobs[arm if dot else ""][knob if dot else key] = value
    return knobs


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if out.returncode:
        raise ValueError(f"git {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout.strip()


def resolve_arm(name: str, spec: str, repo: Path, worktrees: Path,
                knobs: dict[str, str]) -> Arm:
    """Makes an arm runnable: a git ref becomes a worktree at that commit."""
    if spec.startswith("cmd:"):
        command = spec[4:].strip()
        if "{port}" not in command:
            raise ValueError(f"--arm {name}={spec}: the command needs a {{port}} placeholder")
        return Arm(name, spec, "cmd", command=command, knobs=knobs)
    if spec.startswith("git:"):
        ref = spec[4:]
        sha = _git(repo, "rev-parse", "--verify", f"{ref}^{{commit}}")
        tree = worktrees / f"{name}-{sha[:12]}"
        if not (tree / "resident").is_dir():
            worktrees.mkdir(parents=True, exist_ok=True)
            _git(repo, "worktree", "add", "--detach", "--force", str(tree), sha)
        return Arm(name, spec, "resident", tree=tree.resolve(), ref=ref, sha=sha, knobs=knobs)
    tree = repo if spec == "." else Path(spec.removeprefix("path:")).expanduser()
    if spec != "." and not spec.startswith("path:"):
        raise ValueError(f"--arm {name}={spec}: SPEC must be git:<ref>, path:<dir>, . or "
                         "cmd:<command>")
    if not (tree / "resident" / "__init__.py").is_file():
        raise ValueError(f"--arm {name}={spec}: {tree} is not a resident source tree")
    sha, dirty = _tree_commit(tree.resolve())
    return Arm(name, spec, "resident", tree=tree.resolve(), ref=spec, sha=sha, dirty=dirty,
               knobs=knobs)


def _tree_commit(tree: Path) -> tuple[str | None, bool]:
    """(HEAD, whether tracked files changed) of the repository whose root `tree` is; (None,
    False) for a tree that is not one: a copy inside another repository (say under
    .gate/worktrees/) would otherwise report that repository's commit as its own, and a copied
    tree may carry .git without its history."""
    try:
        if Path(_git(tree, "rev-parse", "--show-toplevel")).resolve() != tree:
            return None, False
        return (_git(tree, "rev-parse", "HEAD"),
                bool(_git(tree, "status", "--porcelain", "--untracked-files=no")))
    except ValueError:
        return None, False
