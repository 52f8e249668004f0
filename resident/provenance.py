"""Which code a server ran: the git commit of its tree, whether the tree differs from it, and
a digest of the package's source that does not depend on git at all.

    python -m resident.provenance [DIR]   # DIR: a checkout (default: this package's)

A tree copied with stale git metadata (a remote machine's copy) reports the stale commit, and
`git_dirty` true: the digest is what pins the code. Run this on a checkout of the commit you
think ran; the digests match when the package sources do.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import subprocess
import sys
import tomllib
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def package_version() -> str:
    """The version of the `resident` distribution (pyproject.toml's, as installed), which
    resident and resident-gate both report; when it is not installed, read from the
    pyproject.toml of the tree this package sits in."""
    try:
        return importlib.metadata.version("resident")
    except importlib.metadata.PackageNotFoundError:
        pyproject = PACKAGE_DIR.parent / "pyproject.toml"
        if pyproject.is_file():
            return tomllib.loads(pyproject.read_text())["project"]["version"]
        return "unknown"


def _git(directory: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(directory), *args], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def git_commit(directory: Path) -> str | None:
    """HEAD of the checkout holding `directory`, or None outside git."""
    return (_git(directory, "rev-parse", "HEAD") or "").strip() or None


def git_dirty(directory: Path) -> bool | None:
    """Whether tracked files differ from HEAD (None outside git)."""
    status = _git(directory, "status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status.strip())


def source_digest(package_dir: Path = PACKAGE_DIR) -> str:
    """sha256 over every .py file below package_dir: its relative path and its bytes."""
    digest = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        digest.update(path.relative_to(package_dir).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def describe(package_dir: Path = PACKAGE_DIR) -> dict[str, object]:
    """The package path, its tree's commit and dirtiness, and its source digest."""
    return {"resident_package_path": str(package_dir),
            "git_commit": git_commit(package_dir.parent),
            "git_dirty": git_dirty(package_dir.parent),
            "source_digest": source_digest(package_dir)}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    package_dir = Path(args[0]).resolve() / "resident" if args else PACKAGE_DIR
    if not (package_dir / "__init__.py").is_file():
        print(f"resident.provenance: no resident package in {package_dir.parent}",
              file=sys.stderr)
        return 2
    print(json.dumps(describe(package_dir), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
