"""gate/run/bytecode.py: when the gate gives its servers a bytecode cache of its own."""

from __future__ import annotations

import importlib
import importlib.util
import os
import py_compile
from pathlib import Path

import pytest

from gate.run.bytecode import (
    NO_WRITE_VARIABLE,
    PREFIX_VARIABLE,
    bytecode_is_stale,
    server_pycache,
)


def _package(root: Path, name: str) -> Path:
    """A package `name` under `root` (on sys.path for the test); returns its __init__.py."""
    source = root / name / "__init__.py"
    source.parent.mkdir(parents=True)
    source.write_text("VALUE = 1\n")
    return source


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(PREFIX_VARIABLE, raising=False)
    monkeypatch.delenv(NO_WRITE_VARIABLE, raising=False)
    importlib.invalidate_caches()
    return tmp_path


def test_fresh_bytecode_is_not_stale_and_a_changed_source_makes_it_stale(tmp_path):
    source = _package(tmp_path, "fresh")
    assert bytecode_is_stale(source)  # nothing compiled yet
    py_compile.compile(str(source), cfile=importlib.util.cache_from_source(str(source)))
    assert not bytecode_is_stale(source)
    source.write_text("VALUE = 22\n")  # another size
    os.utime(source, (1, 1))  # and another mtime
    assert bytecode_is_stale(source)


def test_bytecode_of_another_python_is_stale(tmp_path):
    source = _package(tmp_path, "other")
    cached = Path(importlib.util.cache_from_source(str(source)))
    py_compile.compile(str(source), cfile=str(cached))
    cached.write_bytes(b"\0\0\0\0" + cached.read_bytes()[4:])  # another magic number
    assert bytecode_is_stale(source)


def test_stale_and_unwritable_bytecode_gets_the_kept_cache(on_path):
    _package(on_path, "frozen_pkg")
    (on_path / "frozen_pkg" / "__pycache__").write_text("")  # a file: no bytecode goes there
    kept = on_path / "kept"
    assert server_pycache(kept, ("frozen_pkg",)) == kept.resolve()
    assert kept.is_dir()


def test_stale_bytecode_under_dont_write_gets_the_kept_cache(on_path, monkeypatch):
    _package(on_path, "writable_pkg")
    monkeypatch.setenv(NO_WRITE_VARIABLE, "1")  # servers would compile it at every start
    assert server_pycache(on_path / "kept", ("writable_pkg",)) == (on_path / "kept").resolve()


def test_writable_or_fresh_bytecode_and_a_set_prefix_keep_pythons_default(on_path,
                                                                          monkeypatch):
    kept = on_path / "kept"
    _package(on_path, "writable_pkg")  # no bytecode yet, but Python can write it
    assert server_pycache(kept, ("writable_pkg", "no_such_package_here")) is None
    _package(on_path, "frozen_pkg")
    (on_path / "frozen_pkg" / "__pycache__").write_text("")
    monkeypatch.setenv(PREFIX_VARIABLE, str(on_path / "theirs"))  # inherited by the servers
    assert server_pycache(kept, ("frozen_pkg",)) is None
    assert not kept.exists()


def test_this_environment_needs_no_cache_of_the_gates():
    # CI and this machine install torch with its bytecode: a prefix there would only make
    # the first server of every checkout compile torch again
    if os.environ.get(PREFIX_VARIABLE):
        pytest.skip("the environment sets a bytecode cache of its own")
    assert server_pycache(Path("/nonexistent/kept")) is None
