"""One round of a session: every arm's server started once, in the round's order, on the
round's Inductor cache, serving each cell's warm-up, timed runs and profile window; one after
another, or (--interleave) all up at once with their runs alternating. A server that fails is
closed out alone: its remaining runs of the round are recorded failed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

from gate.config import GateConfig
from gate.records import RUNS_FILE, RunRecord, append_profile, append_run, read_runs
from gate.run.arms import Arm
from gate.run.load import LoadSpec
from gate.run.measure import RunPlace, measure_run, warmed_load
from gate.run.placement import Placement
from gate.run.profiling import profile_cell
from gate.run.progress import SessionLog
from gate.run.server import LaunchSpec, Server, ServerFailed


class RoundHost(Protocol):
    """What a round uses of its session (gate/run/session.py: Session)."""

    config: GateConfig
    placement: Placement
    out: Path
    console: SessionLog
    arms: list[Arm]
    failures: list[str]
    never_started: list[str]  # arms whose server never became ready

    def launch_spec(self, inductor_cache: Path) -> LaunchSpec: ...

    async def check_identity(self, arm: Arm, server: Server) -> bool: ...

    def record_server(self, round_index: int, arm: Arm, server: Server,
                      launch: str | None = None) -> None: ...


@dataclass
class LiveServer:
    """An arm's server in a round, and what the session learned of it."""

    arm: Arm
    round_index: int
    position: int  # its place in the round's start order
    server: Server
    ready: bool = False
    failed: bool = False  # it failed: no further step on it
    planner_off: bool = False  # it asked for the planner and did not get it
    vocab: int = 0
    spec: LoadSpec | None = None  # the cell being measured


def round_order(arms: list[Arm], round_index: int) -> list[Arm]:
    """ABBA for two arms; in general each round reverses the one before."""
    return list(arms) if round_index % 2 == 0 else list(reversed(arms))


@dataclass
class Round:
    """Round `index` (0-based) of `session`, its servers on the Inductor cache `cache`."""

    session: RoundHost
    index: int
    cache: Path

    @property
    def order(self) -> list[Arm]:
        return round_order(self.session.arms, self.index)

    @property
    def config(self) -> GateConfig:
        return self.session.config

    @property
    def placement(self) -> Placement:
        return self.session.placement

    @property
    def out(self) -> Path:
        return self.session.out

    @property
    def console(self) -> SessionLog:
        return self.session.console

    async def sequential(self) -> int:
        """Every arm's server in turn, each serving every cell; the number of failed runs."""
        failed = 0
        for position, arm in enumerate(self.order):
            failed += await self.serve_arm(arm, position)
        return failed

    async def serve_arm(self, arm: Arm, position: int) -> int:
        """Starts the arm's server for the round, measures each cell on it, stops it; returns
        the number of failed runs."""
        live = self._launch(arm, position)
        try:
            failed = await self._guarded(live, partial(self._ready, live))
            for concurrency in self.config.concurrency:
                failed += await self._guarded(live, partial(self.cell, live, concurrency))
            return failed
        finally:
            self._close(live)

    async def cell(self, live: LiveServer, concurrency: int) -> int:
        """One cell on a server of its own: warmed, its timed runs, its profile window."""
        await self._warm(live, concurrency)
        failed = 0
        for run in range(1, self.config.runs + 1):
            failed += await self._run(live, run)
        return failed + await self._profile(live)

    async def interleaved(self) -> int:
        """--interleave: every arm's server started before any run (one after another, so each
        start is timed alone and the first fills the round's Inductor cache; all at once with
        --parallel-start); then in each cell every server is warmed, and slot by slot run j
        of every arm back to back, in the round's order on odd slots and reversed on even ones
        (a drift over the round then weighs on no arm's position); the servers stop after the
        last cell. A server that fails is closed out alone (its remaining runs failed) and the
        others go on."""
        lives: list[LiveServer] = []
        try:
            failed = await self._start_all(lives)
            for concurrency in self.config.concurrency:
                for live in lives:
                    failed += await self._guarded(live, partial(self._warm, live, concurrency))
                for run in range(1, self.config.runs + 1):
                    for live in lives if run % 2 else reversed(lives):
                        failed += await self._guarded(live, partial(self._run, live, run))
                for live in lives:
                    failed += await self._guarded(live, partial(self._profile, live))
            return failed
        finally:
            for live in lives:
                self._close(live)

    async def _start_all(self, lives: list[LiveServer]) -> int:
        """Launches the round's servers into `lives` (the caller closes them) and waits for
        each to be ready: one after another, or together with --parallel-start."""
        if not self.config.parallel_start:
            failed = 0
            for position, arm in enumerate(self.order):
                lives.append(self._launch(arm, position))
                failed += await self._guarded(lives[-1], partial(self._ready, lives[-1]))
            return failed
        lives.extend(self._launch(arm, position)
                     for position, arm in enumerate(self.order))
        known = len(self.session.failures)
        ready = [self._guarded(live, partial(self._ready, live)) for live in lives]
        failed = sum(await asyncio.gather(*ready))
        if any("out of memory" in failure.lower()
               for failure in self.session.failures[known:]):
            self.session.failures.append(
                f"{len(lives)} servers started together on one device and ran out of its "
                "memory: start them in turn (leave out --parallel-start) or give each less "
                "(--set kv_cache_gib=N)")
            self.console.warn(f"[red]round {self.index + 1}: {self.session.failures[-1]}[/red]")
        return failed

    def _launch(self, arm: Arm, position: int) -> LiveServer:
        knobs = self.session.server_knobs(arm)
        log_path = self.out / "logs" / f"{arm.name}-round{self.index + 1}.log"
        self.console.log(f"round {self.index + 1}: starting {arm.name} ({arm.spec})")
        server = Server(arm, self.session.launch_spec(self.cache), knobs, log_path)
        return LiveServer(arm, self.index, position, server)

    async def _guarded(self, live: LiveServer, step: Callable[[], Awaitable[int]]) -> int:
        """One step on a live server: its failed runs. A server that fails (ServerFailed) takes
        no further step: its remaining runs of the round are recorded failed."""
        if live.failed:
            return 0
        try:
            return await step()
        except ServerFailed as err:
            live.failed = True
            self.console.warn(f"[red]round {self.index + 1}: {err}[/red]")
            self.session.failures.append(str(err))
            if not live.ready:
                self.session.never_started.append(live.arm.name)
            return self._record_all_failed(live, str(err), err.log_tail)

    async def _ready(self, live: LiveServer) -> int:
        """Waits for /health, checks the server is the arm and learns its vocabulary."""
        models = await live.server.wait_ready()
        live.ready = True
        live.planner_off = await self.session.check_identity(live.arm, live.server)
        live.vocab = live.server.vocab_of(models)
        return 0

    async def _warm(self, live: LiveServer, concurrency: int) -> int:
        # warmed before the first run's counters are read, so its server step times and GPU
        # samples cover its own requests only
        live.spec = await warmed_load(live.server, self.config, concurrency, live.vocab,
                                      live.round_index, len(self.placement.client_cpus))
        return 0

    async def _run(self, live: LiveServer, run: int) -> int:
        """One timed run of the live server's current cell, appended to runs.jsonl."""
        arm, server = live.arm, live.server
        if not server.alive():
            raise ServerFailed(f"{arm.name}: server died (code {server.process.returncode})",
                               server.log_tail())
        record = await measure_run(server, self.placement,
                                   dataclasses.replace(live.spec, run=run),
                                   RunPlace(arm.name, live.round_index, live.position, run),
                                   live.planner_off)
        append_run(self.out, record)
        metrics = record.metrics
        self.console.advance()
        self.console.log(f"round {live.round_index + 1} {arm.name} c={live.spec.concurrency} "
                         f"run {run}: {metrics.output_throughput} tok/s, {metrics.failed} "
                         "failed requests")
        return int(not record.ok)

    def _close(self, live: LiveServer) -> None:
        live.server.stop()
        self.session.record_server(live.round_index, live.arm, live.server)

    async def _profile(self, live: LiveServer) -> int:
        """With --profile, in round 0: the cell's profile window after its timed runs
        (profiling.py)."""
        if not (self.config.profile and live.round_index == 0):
            return 0
        spec, name = live.spec, live.arm.name
        self.console.log(f"{name} c={spec.concurrency}: profiling "
                         f"{self.config.profile_steps} steps")
        record = await profile_cell(live.server, spec, self.config.profile_steps, self.out,
                                    name, 0)
        if record["error"]:
            self.console.log(f"[yellow]{name} c={spec.concurrency}: {record['error']}"
                             "[/yellow]")
        append_profile(self.out, record)
        return 0

    def _record_all_failed(self, live: LiveServer, error: str, log_tail: str) -> int:
        """A server that failed to start or died: its remaining runs are failed runs."""
        arm, position = live.arm, live.position
        done = {(r.concurrency, r.run) for r in read_runs(self.out)
                if r.arm == arm.name and r.round == self.index} \
            if (self.out / RUNS_FILE).exists() else set()
        count = 0
        for concurrency in self.config.concurrency:
            for run in range(1, self.config.runs + 1):
                if (concurrency, run) in done:
                    continue
                append_run(self.out, RunRecord(
                    round=self.index, arm=arm.name, position=position, concurrency=concurrency,
                    run=run, ok=False, error=error, log_tail=log_tail, started_at=time.time()))
                count += 1
        self.console.advance(count)
        return count

