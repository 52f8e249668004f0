"""Whether the servers the gate starts need a bytecode cache of the gate's own.

Python compiles a module to bytecode at its first import and keeps the result beside the source
(`__pycache__/*.pyc`). Where those files are missing or stale and are not written (a read-only
site-packages, or PYTHONDONTWRITEBYTECODE), every process compiles every module it imports again.
The H200 host does both: its torch, triton, flashinfer and fla carry no bytecode and its
environment sets PYTHONDONTWRITEBYTECODE, so each server's engine core compiled ~2,600 modules
from source at start-up. There the gate points its servers' PYTHONPYCACHEPREFIX at a kept
directory (`.gate/pycache`) and lets them write there, so only the first server on the machine
compiles: a warm server's start went from 17-22 s to 11-13 s
(results/2026-12-02-h200-0.8b-bytecode). Elsewhere it leaves Python's default: a prefix set
everywhere would make the first server of every checkout compile again what site-packages
already holds. Bytecode is the source's whichever arm reads it, so keeping it biases no arm.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

PREFIX_VARIABLE = "PYTHONPYCACHEPREFIX"
NO_WRITE_VARIABLE = "PYTHONDONTWRITEBYTECODE"
# the heavy packages a resident server imports: the environment's bytecode is judged by theirs
PROBE_PACKAGES = ("torch", "triton", "flashinfer", "fla")


def bytecode_is_stale(source: Path) -> bool:
    """Whether the bytecode Python would read for `source` (importlib's path for it) is missing,
    from another Python, or recorded for another mtime or size of the source."""
    try:
        with open(importlib.util.cache_from_source(str(source)), "rb") as file:
            header = file.read(16)  # magic, flags, then source mtime and size (PEP 552)
    except OSError:
        return True
    if len(header) < 16 or header[:4] != importlib.util.MAGIC_NUMBER:
        return True
    if int.from_bytes(header[4:8], "little") & 1:  # hash-based: not tied to the mtime
        return False
    stat = source.stat()
    recorded = (int.from_bytes(header[8:12], "little"), int.from_bytes(header[12:16], "little"))
    return recorded != (int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF)


def _writable(directory: Path) -> bool:
    """Whether a server's Python would write bytecode into `directory` (made if missing)."""
    if os.environ.get(NO_WRITE_VARIABLE):
        return False
    if directory.exists():
        return directory.is_dir() and os.access(directory, os.W_OK)
    return os.access(directory.parent, os.W_OK)


def _compiles_at_every_start(package: str) -> bool:
    """Whether a server importing `package` would compile it from source: it is installed,
    its bytecode stale and not written beside it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    source = Path(spec.origin)
    cache_dir = Path(importlib.util.cache_from_source(str(source))).parent
    return bytecode_is_stale(source) and not _writable(cache_dir)


def server_pycache(kept: Path, packages: tuple[str, ...] = PROBE_PACKAGES) -> Path | None:
    """The PYTHONPYCACHEPREFIX for the gate's servers: `kept` (made here) when any of
    `packages` would be compiled at every start (the servers then also lose
    PYTHONDONTWRITEBYTECODE: the kept cache is the gate's own directory); None to leave
    Python's default, which is also the answer when the gate's environment sets a prefix (its
    servers inherit it)."""
    if os.environ.get(PREFIX_VARIABLE) or not any(map(_compiles_at_every_start, packages)):
        return None
    kept.mkdir(parents=True, exist_ok=True)
    return kept.resolve()
