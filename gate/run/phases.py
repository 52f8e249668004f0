"""`resident-gate phases`: where each arm's step time goes, per cell, by the engine's own phase
timing (GET /debug/phases; resident/engine/phases.py).

One server per arm, started with `phase_timing=on` and placed as `run` places it; per cell a
warm-up load, then POST /debug/phases/reset, a steady load of the cell's requests, and GET
/debug/phases. The session's `results` become phases.json and phases.md (gate/report/phases.py).
The manifest records the session as `run` does, with `"command_kind": "phases"`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from gate.records import PHASES_JSON
from gate.run.load import run_load
from gate.run.measure import warmed_load
from gate.run.rounds import LiveServer, Round
from gate.run.server import ServerFailed
from gate.run.session import Session


class PhasesRound(Round):
    """A round whose cells read /debug/phases instead of recording runs."""

    session: PhasesSession

    async def cell(self, live: LiveServer, concurrency: int) -> int:
        """The cell's phases on a server of its own, in the session's `results`."""
        server, arm = live.server, live.arm
        spec = await warmed_load(server, self.config, concurrency, live.vocab, live.round_index,
                                 len(self.placement.client_cpus))
        if await server.post_json("/debug/phases/reset") is None:
            raise ServerFailed(f"{arm.name}: POST /debug/phases/reset failed (not a resident "
                               f"server with /debug/phases?)", server.log_tail())
        metrics = (await run_load(server.url, spec)).metrics
        report = await server.get_json("/debug/phases") or {}
        self.session.results.setdefault(f"c={concurrency}", {})[arm.name] = {
            "kinds": report.get("kinds", {}), "enabled": report.get("enabled", False),
            "output_throughput": metrics.output_throughput, "failed": metrics.failed,
            "planner_off": live.planner_off}
        self.console.log(f"{arm.name} c={concurrency}: {metrics.output_throughput} tok/s, "
                         f"{report.get('kinds', {}).get('decode', {}).get('steps', 0)} "
                         f"decode steps timed")
        self.console.advance()
        return int(metrics.completed == 0)


class PhasesSession(Session):
    """A one-round Session whose cells read /debug/phases instead of recording runs: one
    server at a time (PhasesRound.cell measures the server alone; an interleaved round has
    none)."""

    round_type: ClassVar[type[Round]] = PhasesRound

    def __post_init__(self) -> None:
        self.config = dataclasses.replace(self.config, rounds=1, runs=1, interleave=False,
                                          parallel_start=False)
        super().__post_init__()
        self.arms = [dataclasses.replace(a, knobs={**a.knobs, "phase_timing": "on"})
                     if a.kind == "resident" else a for a in self.arms]
        self.results: dict[str, dict[str, Any]] = {}  # "c=N" -> arm -> measurement

    def run(self, resume: bool = False) -> int:
        if resume:
            raise ValueError("--resume: a phases session runs in one go")
        if (self.out / PHASES_JSON).exists():
            raise ValueError(f"--out {self.out} already holds a phases session; choose "
                             f"another --out")
        failed = super().run()
        self.manifest = dataclasses.replace(self.manifest, command_kind="phases")
        self._save_manifest()
        return failed
