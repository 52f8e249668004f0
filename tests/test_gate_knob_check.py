"""The knobs each resident arm's servers would start with, resolved by the arm's own tree
before any server starts (gate/run/knob_check.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate.run.arms import Arm
from gate.run.knob_check import check_arm_knobs

ROOT = Path(__file__).resolve().parents[1]


def _arm(name: str, tree: Path) -> Arm:
    return Arm(name, f"path:{tree}", "resident", tree=tree)


def test_a_refused_knob_names_its_arm_and_the_engines_message():
    good, bad = _arm("main", ROOT), _arm("head", ROOT)
    check_arm_knobs([(good, [{"page_size": "16"}]), (bad, [{"fused_decode": "off"}])],
                    "tiny", "cpu")
    with pytest.raises(ValueError, match=r"arm head .* knob page_size: must be a power of two"):
        check_arm_knobs([(good, [{"page_size": "16"}]), (bad, [{}, {"page_size": "7"}])],
                        "tiny", "cpu")


def test_a_tree_without_the_check_and_a_cmd_arm_are_left_to_their_servers(tmp_path):
    """An arm at a commit from before check_knobs_for_model, or any other failure of the
    check itself, is not refused: its server's start tells, as before."""
    old = tmp_path / "old"
    (old / "resident").mkdir(parents=True)
    (old / "resident" / "__init__.py").write_text("")
    (old / "resident" / "config.py").write_text("")
    broken = tmp_path / "broken"
    (broken / "resident").mkdir(parents=True)
    (broken / "resident" / "__init__.py").write_text("raise RuntimeError('not a tree')\n")
    command = Arm("vllm", "cmd:x {port}", "cmd", command="x {port}")
    check_arm_knobs([(_arm("old", old), [{"page_size": "7"}]),
                     (_arm("broken", broken), [{"page_size": "7"}]),
                     (command, [{"page_size": "7"}])], "tiny", "cpu")
