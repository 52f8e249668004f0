"""Each resident arm's knobs resolved by its own tree's engine config before any server starts.

A bad value (`--set head.page_size=7`) otherwise shows only when that arm's server fails to
start: after the arms before it have started, on a GPU host minutes into the session.
`check_arm_knobs` runs `resident.config.check_knobs_for_model` once an arm, in a child process
with the arm's tree first on PYTHONPATH (an arm at another commit may have other knobs), the
arms side by side (~0.2 s each: the config imports no torch); the first refusal fails the
session naming the arm and the engine's message. A tree from before that function, or a check
that fails any other way, is left to its server's start, as before.
"""

from __future__ import annotations

import json
import subprocess
import sys

from gate.run.arms import Arm
from gate.run.server import clean_environment, put_tree_first

# the child's exit status for a refusal: any other failure is not the knobs' to judge
REFUSED = 3
CHECK_TIMEOUT_S = 60
_CHECK = f"""
import json, sys
try:
    from resident.config import check_knobs_for_model
except ImportError:
    sys.exit(0)
model, device, knob_sets = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
for knobs in knob_sets:
    try:
        check_knobs_for_model(model, device, knobs)
    except ValueError as error:
        print(error, file=sys.stderr)
        sys.exit({REFUSED})
"""


def check_arm_knobs(knob_sets: list[tuple[Arm, list[dict[str, str]]]], model: str,
                    device: str) -> None:
    """Raises ValueError naming the first resident arm whose tree refuses one of its knob
    sets (each a server's whole `--set` mapping) for `model` on `device`."""
    children = [(arm, _start(arm, sets, model, device)) for arm, sets in knob_sets
                if arm.kind == "resident" and sets]
    refusals = [(arm, _refusal(child)) for arm, child in children]
    for arm, refusal in refusals:
        if refusal:
            raise ValueError(f"--set: arm {arm.name} ({arm.spec}) cannot start with its "
                             f"knobs: {refusal}")


def _start(arm: Arm, knob_sets: list[dict[str, str]], model: str,
           device: str) -> subprocess.Popen:
    env = clean_environment()[0]
    put_tree_first(env, arm)
    return subprocess.Popen([sys.executable, "-c", _CHECK, model, device, json.dumps(knob_sets)],
                            cwd=arm.tree, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _refusal(child: subprocess.Popen) -> str | None:
    """The engine's message where the child refused the knobs, else None."""
    try:
        _, stderr = child.communicate(timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return None
    if child.returncode != REFUSED:
        return None
    lines = stderr.strip().splitlines()
    return lines[-1] if lines else "refused"
