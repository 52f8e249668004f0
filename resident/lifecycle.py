"""A child process's life bound to its parent's: what the server's processes (engine core, API
processes, ranks) and the gate's (servers, load clients) share."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal


def end_with_parent(parent_pid: int, sig: int) -> None:
    """This process gets `sig` when its parent dies (prctl PR_SET_PDEATHSIG, Linux), and exits
    at once if the parent (`parent_pid`) is already gone: a child that took seconds to start
    (importing torch) can outlive a parent killed meanwhile, and its new parent's death is not
    the one it waits for."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        os._exit(1)


def die_with_spawner() -> int:
    """end_with_parent (SIGTERM) for the process that spawned this one (multiprocessing's
    parent, whose pid the child knows whatever happened since; a process started otherwise:
    its parent now); returns that pid."""
    parent = multiprocessing.parent_process()
    parent_pid = parent.pid if parent is not None else os.getppid()
    end_with_parent(parent_pid, signal.SIGTERM)
    return parent_pid
