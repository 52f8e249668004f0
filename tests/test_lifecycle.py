"""resident/lifecycle.py: a spawned process whose parent died while it started (the engine core
importing torch for seconds) exits instead of living on under its new parent."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the parent spawns a child that binds itself to its spawner only after 1 s (its imports), and
# exits at once; the child writes its pid, then its mark if it outlived the binding
_PARENT = """
import multiprocessing, os, sys, time
from resident.lifecycle import die_with_spawner

def child(pid_file, mark):
    open(pid_file, "w").write(str(os.getpid()))
    time.sleep(1.0)
    die_with_spawner()
    open(mark, "w").write("outlived its parent")

if __name__ == "__main__":
    multiprocessing.get_context("spawn").Process(target=child, args=sys.argv[1:]).start()
    os._exit(0)
"""


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_child_whose_spawner_died_while_it_started_exits(tmp_path):
    script, pid_file, mark = tmp_path / "parent.py", tmp_path / "pid", tmp_path / "mark"
    script.write_text(_PARENT)
    subprocess.run([sys.executable, str(script), str(pid_file), str(mark)], cwd=ROOT,
                   check=True, timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    child = int(pid_file.read_text())
    while _alive(child) and not mark.exists():  # until it exits or outlives the binding
        assert time.monotonic() < deadline, "the child neither exited nor wrote its mark"
        time.sleep(0.05)
    assert not mark.exists()
