"""The gate's version: that of the `resident` distribution it ships in.

The gate stands apart from the engine (tests/test_layers.py lets it import resident.config
only), so it reads the version itself rather than through resident.cli, which does the same for
`resident --version`.
"""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path


def package_version() -> str:
    """The installed distribution's version (pyproject.toml's); when it is not installed, read
    from the pyproject.toml of the tree this package sits in."""
    try:
        return importlib.metadata.version("resident")
    except importlib.metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        if pyproject.is_file():
            return tomllib.loads(pyproject.read_text())["project"]["version"]
        return "unknown"
