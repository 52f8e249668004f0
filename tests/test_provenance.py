"""resident.provenance: the commit, dirtiness and source digest a server reports."""

from __future__ import annotations

import json
import subprocess

from resident import provenance


def _package(root, text: str):
    package = root / "resident"
    (package / "model").mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "model" / "layer.py").write_text(text)
    return package


def _git(root, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_digest_follows_the_sources_only(tmp_path):
    first = provenance.source_digest(_package(tmp_path / "a", "x = 1\n"))
    assert first == provenance.source_digest(_package(tmp_path / "b", "x = 1\n"))
    (tmp_path / "b" / "resident" / "notes.txt").write_text("not code")
    assert first == provenance.source_digest(tmp_path / "b" / "resident")
    assert first != provenance.source_digest(_package(tmp_path / "c", "x = 2\n"))


def test_a_tree_that_differs_from_its_commit_says_so(tmp_path):
    package = _package(tmp_path, "x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    clean = provenance.describe(package)
    assert clean["git_commit"] == _git(tmp_path, "rev-parse", "HEAD")
    assert clean["git_dirty"] is False
    (package / "model" / "layer.py").write_text("x = 2\n")  # a copy with stale git metadata
    dirty = provenance.describe(package)
    assert dirty["git_commit"] == clean["git_commit"] and dirty["git_dirty"] is True
    assert dirty["source_digest"] != clean["source_digest"]


def test_outside_git_the_commit_is_unknown(tmp_path):
    described = provenance.describe(_package(tmp_path, "x = 1\n"))
    assert described["git_commit"] is None and described["git_dirty"] is None


def test_cli(tmp_path, capsys):
    _package(tmp_path, "x = 1\n")
    assert provenance.main([str(tmp_path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["source_digest"] == provenance.source_digest(tmp_path / "resident")
    assert provenance.main([str(tmp_path / "nowhere")]) == 2
    assert "no resident package" in capsys.readouterr().err
