"""tests/gpu/h200.sh, the H200 session's script, checked on CPU before a device call is spent
on it: it parses, every part its header documents has a case and every case is documented,
and every config, test file and module it runs exists."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "gpu" / "h200.sh"


def _text() -> str:
    return SCRIPT.read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_every_documented_part_has_a_case_and_every_case_is_documented():
    text = _text()
    header = text[:text.index("# Carry .whl/")]
    documented = set(re.findall(r"^#   ([a-z0-9][\w-]*)\s", header, re.M))
    labels = re.findall(r"^    ([a-z0-9][\w |-]*)\)", text, re.M)
    cases = {name.strip() for label in labels for name in label.split("|")}
    assert documented - cases == set(), "documented parts with no case"
    assert cases - documented == set(), "cases the header does not document"


def test_what_the_script_runs_exists():
    text = _text()
    paths = set(re.findall(r"((?:configs|tests)/[\w./-]+\.(?:yaml|py))", text))
    assert paths and not [path for path in paths if not (ROOT / path).exists()]
    modules = set(re.findall(r"python3 -m ((?:resident|gate)[\w.]*)", text))
    assert modules and not [name for name in modules if importlib.util.find_spec(name) is None]
