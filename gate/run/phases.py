"""`resident-gate phases`: where each arm's step time goes, per cell, by the engine's own phase
timing (GET /debug/phases; resident/engine/phases.py).

One server per arm at a time, started with `phase_timing=on` and placed as `run` places it; per
cell a warm-up load, then POST /debug/phases/reset, a steady load of the cell's requests, and
GET /debug/phases. With --rounds N each arm's server starts N times, in alternated order as
`run`'s rounds, and a cell's phases are the rounds' means weighted by their steps: in two
one-round sessions on an H100 host the parts neither arm changed differed by up to 30% between
the arms, the sign flipping between sessions (results/2026-12-05-h100-token-ring), a drift the
alternation spreads over both arms. The session's `results` become phases.json and phases.md
(gate/report/phases.py). The manifest records the session as `run` does, with
`"command_kind": "phases"`.
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
        self.session.by_round.setdefault(f"c={concurrency}", {}).setdefault(arm.name, []).append({
            "kinds": report.get("kinds", {}), "enabled": report.get("enabled", False),
            "output_throughput": metrics.output_throughput, "failed": metrics.failed,
            "planner_off": live.planner_off})
        self.console.log(f"{arm.name} c={concurrency}: {metrics.output_throughput} tok/s, "
                         f"{report.get('kinds', {}).get('decode', {}).get('steps', 0)} "
                         f"decode steps timed")
        self.console.advance()
        return int(metrics.completed == 0)


class PhasesSession(Session):
    """A Session whose cells read /debug/phases instead of recording runs: one server at a
    time (PhasesRound.cell measures the server alone; an interleaved round has none), one run a
    cell, its --rounds as given (no verdicts: nothing is judged)."""

    round_type: ClassVar[type[Round]] = PhasesRound

    def __post_init__(self) -> None:
        self.config = dataclasses.replace(self.config, runs=1, interleave=False,
                                          parallel_start=False, until_verdict=False,
                                          max_rounds=None)
        super().__post_init__()
        self.arms = [dataclasses.replace(a, knobs={**a.knobs, "phase_timing": "on"})
                     if a.kind == "resident" else a for a in self.arms]
        # "c=N" -> arm -> each round's measurement, and their merge (`merged`)
        self.by_round: dict[str, dict[str, list[dict[str, Any]]]] = {}
        self.results: dict[str, dict[str, Any]] = {}

    def run(self, resume: bool = False) -> int:
        if resume:
            raise ValueError("--resume: a phases session runs in one go")
        if (self.out / PHASES_JSON).exists():
            raise ValueError(f"--out {self.out} already holds a phases session; choose "
                             f"another --out")
        failed = super().run()
        self.results = {cell: {arm: merged(rounds) for arm, rounds in arms.items()}
                        for cell, arms in self.by_round.items()}
        self.manifest = dataclasses.replace(self.manifest, command_kind="phases")
        self._save_manifest()
        return failed


def _weighted(key: str, timed: list[dict[str, float]]) -> float:
    """key's mean over the rounds that report it, weighted by their steps (a round of a tree
    without the phase is not a round where it took 0 ms)."""
    having = [kind for kind in timed if key in kind]
    return round(sum(kind[key] * kind["steps"] for kind in having)
                 / sum(kind["steps"] for kind in having), 4)


def merged(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """An arm's measurements of one cell over the rounds as one: each step kind's ms a step
    weighted by its steps in each round (its `steps` their sum), the rounds' mean tok/s, their
    failures summed; `by_round` keeps each round's as it was read."""
    kinds: dict[str, dict[str, float]] = {}
    for name in dict.fromkeys(kind for one in rounds for kind in one["kinds"]):
        timed = [one["kinds"][name] for one in rounds if one["kinds"].get(name, {}).get("steps")]
        steps = sum(kind["steps"] for kind in timed)
        if not steps:
            continue
        keys = dict.fromkeys(key for kind in timed for key in kind if key != "steps")
        kinds[name] = {key: _weighted(key, timed) for key in keys} | {"steps": steps}
    rates = [one["output_throughput"] for one in rounds if one["output_throughput"]]
    return {"kinds": kinds, "enabled": all(one["enabled"] for one in rounds),
            "output_throughput": sum(rates) / len(rates) if rates else None,
            "failed": sum(one["failed"] for one in rounds),
            "planner_off": rounds[0]["planner_off"], "by_round": rounds}
