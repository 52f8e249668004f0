"""The ranks of a tensor-parallel engine core (knob `tensor_parallel`, docs/parallel.md).

The engine-core process the API spawned is rank 0: the only one that hears the API and sends
outputs. It starts ranks 1..N-1 as processes of their own (`python -m resident.server.ranks`,
their arguments pickled on stdin: the core is a daemonic multiprocessing child, which may not
have multiprocessing children), joins their process group, and at each step boundary sends them
a Beat (parallel/lockstep.py) with the adds and aborts it took, in its order. A follower builds
the same engine on its own device, applies each beat, steps when told and discards its outputs.

Failures: a follower that exits (killed, out of memory, left lockstep) is found by rank 0 before
each beat and after a step whose collective failed; rank 0 raises RankDied naming it, which the
core reports as Fatal, so the server fails with that line, never hangs. A follower dies with rank
0 (PR_SET_PDEATHSIG) and exits on its parent's stop beat.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from resident.config import EngineConfig
from resident.model.config import ModelConfig
from resident.parallel.group import RankGroup, free_port, init_group
from resident.parallel.lockstep import Beat, Lockstep, step_digest

log = logging.getLogger("resident.ranks")
STARTUP_POLL_S = 0.2
EXIT_GRACE_S = 10.0
DEATH_NOTICE_S = 2.0  # after a failed collective, how long a dead peer's exit may take to show
WATCH_S = 0.5


class RankDied(RuntimeError):
    """A tensor-parallel rank's process is gone."""


@dataclass(frozen=True)
class RankArgs:
    """What a follower is started with."""

    model_config: ModelConfig
    config: EngineConfig
    device: str
    rank: int
    port: int
    log_level: str


class Followers:
    """Rank 0's view of ranks 1..N-1: their processes, the group, the beats."""

    def __init__(self, processes: list[subprocess.Popen], group: RankGroup) -> None:
        self.processes = processes
        self.group = group
        self.lockstep = Lockstep(group)
        self._stopping = threading.Event()
        threading.Thread(target=self._watch, name="rank-watch", daemon=True).start()

    def _watch(self) -> None:
        """Aborts the group when a follower dies: gloo fails a collective whose peer closed
        its sockets, but NCCL would wait for a dead peer until its timeout, with rank 0's step
        blocked on the device; aborted, the collective raises and `step` names the rank."""
        while not self._stopping.wait(WATCH_S):
            if self.dead() is not None:
                time.sleep(DEATH_NOTICE_S)  # rank 0's own check, or gloo, usually comes first
                if not self._stopping.is_set():
                    log.error("%s: aborting the rank group", self.dead())
                    self.group.abort()
                return

    def dead(self) -> str | None:
        """Why a follower is gone, or None while all run."""
        return dead_reason(self.processes)

    def check(self) -> None:
        check_alive(self.processes)

    def beat(self, inputs: list[tuple[str, Any]], step: bool, gather_rowcheck: bool = False,
             stop: bool = False) -> None:
        self.check()
        with self._blaming():
            self.lockstep.send(Beat(inputs, step, stop=stop, gather_rowcheck=gather_rowcheck))

    def step(self, engine) -> list:
        """engine.step(); a collective that fails because a follower died says which."""
        with self._blaming():
            outputs = engine.step()
        self.lockstep.stepped(step_digest(engine.last_step_kind, outputs,
                                          engine.slot_holders()))
        return outputs

    def gather_rowcheck(self, counts: dict) -> list[dict]:
        """Every rank's row-check counts, rank 0's `counts` first."""
        with self._blaming():
            return self.group.gather(counts)

    @contextlib.contextmanager
    def _blaming(self):
        """A collective that fails because a follower died raises RankDied naming it (the
        failure can show before the exit does: waits up to DEATH_NOTICE_S for it)."""
        try:
            yield
        except Exception as error:
            deadline = time.monotonic() + DEATH_NOTICE_S
            while time.monotonic() < deadline:
                reason = self.dead()
                if reason is not None:
                    raise RankDied(f"{reason}; rank 0 failed: {error}") from error
                time.sleep(0.05)
            raise

    def stop(self) -> None:
        """The stop beat (best effort: a follower may be gone), then each exits or is killed."""
        self._stopping.set()
        if self.dead() is None:
            try:
                self.lockstep.send(Beat(stop=True))
            except Exception:  # noqa: BLE001 - stopping anyway
                log.warning("the stop beat did not reach every rank")
        deadline = time.monotonic() + EXIT_GRACE_S
        for process in self.processes:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()


def start_followers(model_config: ModelConfig, config: EngineConfig, device: str,
                    log_level: str) -> Followers | None:
    """Rank 0: starts ranks 1..N-1 and joins their group; None without tensor parallelism."""
    ranks = config.tensor_parallel
    if ranks == 1:
        return None
    port = free_port()
    processes = []
    for rank in range(1, ranks):
        args = RankArgs(model_config, config, device, rank, port, log_level)
        process = subprocess.Popen([sys.executable, "-m", "resident.server.ranks"],
                                   stdin=subprocess.PIPE)
        process.stdin.write(pickle.dumps(args))
        process.stdin.close()
        log.info("tensor-parallel rank %d started (pid %d)", rank, process.pid)
        processes.append(process)
    return Followers(processes, _join_watching(processes, ranks, port, device))


def dead_reason(processes: list[subprocess.Popen]) -> str | None:
    """Why a follower (rank 1 first) is gone, or None while all run."""
    for rank, process in enumerate(processes, start=1):
        code = process.poll()
        if code is not None:
            return f"tensor-parallel rank {rank} (pid {process.pid}) exited with code {code}"
    return None


def check_alive(processes: list[subprocess.Popen]) -> None:
    reason = dead_reason(processes)
    if reason is not None:
        raise RankDied(reason)


def _join_watching(processes: list[subprocess.Popen], ranks: int, port: int,
                   device: str) -> RankGroup:
    """init_group for rank 0, failing at once if a follower exits before every rank joined
    (the rendezvous itself would wait for it until its timeout)."""
    joined: dict[str, Any] = {}

    def join() -> None:
        try:
            joined["group"] = init_group(0, ranks, port, device)
        except Exception as error:  # noqa: BLE001 - handed to the watching thread
            joined["error"] = error

    thread = threading.Thread(target=join, name="rank-join", daemon=True)
    thread.start()
    while thread.is_alive():
        check_alive(processes)
        thread.join(STARTUP_POLL_S)
    if "error" in joined:
        raise joined["error"]
    return joined["group"]


def run_follower(args: RankArgs) -> None:
    """A follower rank: joins the group, builds its engine, then applies beats until stop."""
    from resident.engine.startup import StartupTimes
    from resident.lifecycle import die_with_spawner
    from resident.server.core import build_core_engine

    logging.basicConfig(level=args.log_level,
                        format=f"%(asctime)s rank{args.rank} %(name)s %(levelname)s %(message)s")
    die_with_spawner()
    group = init_group(args.rank, args.config.tensor_parallel, args.port, args.device)
    engine = build_core_engine(args.model_config, args.config, args.device, StartupTimes(),
                               group)
    lockstep = Lockstep(group)
    while True:
        beat = lockstep.receive()
        if beat.stop:
            break
        apply_inputs(engine, beat.inputs)
        if beat.step:
            outputs = engine.step()
            lockstep.stepped(step_digest(engine.last_step_kind, outputs,
                                         engine.slot_holders()))
        if beat.gather_rowcheck:
            group.gather(engine.rowcheck_counts())
    group.close()


def apply_inputs(engine, inputs: list[tuple[str, Any]]) -> None:
    """A beat's adds and aborts, in rank 0's order (a failed add fails here as it did there)."""
    for kind, value in inputs:
        if kind == "add":
            try:
                engine.add_request(value)
            except Exception:  # noqa: BLE001 - rank 0's add failed alike; its output said why
                log.debug("adding %s failed here as on rank 0", value.request_id)
        else:
            engine.abort(value)


def main() -> None:
    args = pickle.load(sys.stdin.buffer)
    try:
        run_follower(args)
    except Exception:
        logging.getLogger("resident.ranks").exception("tensor-parallel rank %d failed",
                                                      args.rank)
        os._exit(1)


if __name__ == "__main__":
    main()
