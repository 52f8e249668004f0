"""One gate session: rounds of alternated arms, each round with a fresh Inductor cache shared by
its arms and its own prompt seed; each arm's server started once a round and serving all its
cells' runs; every run appended to runs.jsonl as it finishes. A fixed design runs --rounds;
with --until-verdict, rounds are added until every arm has a verdict in every cell (judged
after each round as the report judges) or --max-rounds ran.

A session can be resumed (`--resume`): the rounds runs.jsonl holds whole stay, a partial round
is dropped and run again, and the remaining rounds run, up to --rounds or --max-rounds (which
may be raised to add rounds). Every resumed server must report the weights fingerprint and, for
a resident arm, the package source digest that the manifest recorded, so rounds run days or
machines apart still measure the same code and weights; each resumption is logged in the
manifest.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from gate.config import GateConfig
from gate.manifest import ArmEntry, HostLoad, Manifest, ServerTiming, Stop, Timing
from gate.records import RUNS_FILE, read_runs
from gate.run.arms import Arm, resolve_arm, split_arm, split_knobs
from gate.run.bytecode import server_pycache
from gate.run.host import gather_versions, host_info
from gate.run.knob_check import check_arm_knobs
from gate.run.measure import check_package, check_source
from gate.run.placement import Placement, host_placement
from gate.run.profiling import profile_tool
from gate.run.progress import SessionLog
from gate.run.resume import first_fingerprint, resume_manifest
from gate.run.rounds import Round
from gate.run.server import LaunchSpec, Server, clean_environment
from gate.verdict.rule import FIRST_LOOK
from gate.verdict.stats import measure_of, runs_frame, undecided

WORKTREES = Path(".gate/worktrees")
# One Inductor cache per round, shared by its arms (so they replay the same kernel choices) and
# removed after it; one Triton cache for every server the gate starts, kept: compiled kernels
# (ours, fla's, Inductor's) and Triton's autotuning results, keyed by source, device and
# shapes, which no arm can bias, and which a fresh cache would redo in every round. Where
# site-packages keep no usable bytecode, one kept bytecode cache too (gate/run/bytecode.py).
INDUCTOR = Path(".gate/inductor")
TRITON = Path(".gate/triton")
PYCACHE = Path(".gate/pycache")


def make_out(out: Path) -> None:
    """--out and its parents; one that cannot be made is a ValueError naming it (a usage
    error, not a traceback)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"--out {out}: cannot create it ({err.strerror or err})") from None


def triton_cache(repo: Path) -> Path:
    """The gate's Triton cache under `repo` (TRITON above), made if missing."""
    path = (repo / TRITON).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class Session:
    """A `run` session: its arms, placement and manifest, and its rounds (gate/run/rounds.py,
    `round_type`), run, resumed or stopped early as the module docstring says."""

    round_type: ClassVar[type[Round]] = Round
    config: GateConfig
    repo: Path
    command_line: list[str]
    console: SessionLog = field(default_factory=SessionLog)
    failures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.out = self.config.out_dir()
        self.arms = self._resolve_arms()
        self.placement = self._placement()
        self.manifest = Manifest()
        self._fingerprint: str | None = None
        self._clock = time.monotonic()  # this invocation's start
        self._wall_before = 0.0  # the wall time of the invocations this one resumes
        self.never_started: list[str] = []  # arms whose server never became ready
        self._pycache = server_pycache(self.repo / PYCACHE)  # the same for every server

    # -- setup ------------------------------------------------------------------------------

    def _resolve_arms(self) -> list[Arm]:
        pairs = [split_arm(text) for text in self.config.arms]
        if self.config.aa:  # a second copy of the baseline measures the noise floor
            pairs.insert(1, (f"{pairs[0][0]}-aa", pairs[0][1]))
        names = [name for name, _ in pairs]
        if len(set(names)) != len(names):
            raise ValueError(f"--arm: arm names must differ, got {', '.join(names)}")
        knobs = split_knobs(list(self.config.knobs), names)
        if self.config.aa:
            knobs[names[1]] = {**knobs[names[0]], **knobs[names[1]]}
        worktrees = (self.repo / WORKTREES).resolve()
        return [resolve_arm(name, spec, self.repo, worktrees, {**knobs[""], **knobs[name]})
                for name, spec in pairs]

    def _placement(self) -> Placement:
        config = self.config
        return host_placement(config.device, config.server_cpus, config.step_cores,
                              config.api_core, config.client_cpus, config.gpu)

    def _base_manifest(self, removed_env: list[str]) -> Manifest:
        config = self.config
        return Manifest(
            name=config.name, command=tuple(self.command_line),
            created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            baseline=self.arms[0].name,
            aa_arm=self.arms[1].name if config.aa else None,
            arms=tuple(ArmEntry.from_dict(arm.to_dict()) for arm in self.arms),
            model=config.model, device=config.device, cells=config.concurrency,
            prompt_len=config.prompt_len, output_len=config.output_len,
            shared_prefix_len=config.shared_prefix_len, rounds=config.planned_rounds,
            until_verdict=config.until_verdict,
            max_rounds=config.max_rounds, min_effect=config.min_effect,
            rounds_run=0, runs=config.runs, interleave=config.interleave,
            parallel_start=config.parallel_start,
            requests={f"c={c}": config.requests_for(c) for c in config.concurrency},
            seed=config.seed, sampling=config.sampling, request_rate=config.request_rates,
            placement=self.placement.to_dict(),
            removed_env=tuple(removed_env), host=host_info(), versions=gather_versions(),
            profile=({**profile_tool(config.device), "steps": config.profile_steps}
                     if config.profile else None),
            timing=Timing())

    # -- the session ------------------------------------------------------------------------

    def run(self, resume: bool = False) -> int:
        """Runs every round (with resume, those runs.jsonl does not hold whole); returns the
        number of failed runs."""
        removed_env = clean_environment()[1]
        self.check_knobs()
        first = self._resume(removed_env) if resume else self._start(removed_env)
        try:
            return self._run_rounds(first)
        finally:
            self.console.close()

    def _run_rounds(self, first: int) -> int:
        """Rounds `first` (0-based) on, as `run` says; the number of failed runs."""
        failed = 0
        last = self.config.planned_rounds
        self.console.start((last - first) * self.runs_a_round, f"round {first + 1} of {last}")
        for round_index in range(first, last):
            if self._every_cell_decided(round_index):
                break
            failed += self._run_round(round_index)
            if round_index == 0 and self.never_started:
                self._note_stop(1, f"{', '.join(self.never_started)} could not start in the "
                                "first round, and later rounds would start the same tree")
                break
        else:
            if not (self.config.until_verdict and self._every_cell_decided(last)):
                self._note_stop(last, "the planned rounds ran")
        self._save_manifest()
        return failed

    def _run_round(self, round_index: int) -> int:
        """Every arm's server once, in the round's order, on the round's Inductor cache: one
        after another, or (--interleave) all up at once with their runs alternating; returns
        the number of failed runs."""
        cache = (self.repo / INDUCTOR / self.out.name / f"round-{round_index}").resolve()
        cache.mkdir(parents=True, exist_ok=True)
        self.console.describe(f"round {round_index + 1} of {self.config.planned_rounds}")
        this_round = self.round_type(self, round_index, cache)
        load_before = os.getloadavg()
        failed = asyncio.run(this_round.interleaved() if self.config.interleave
                             else this_round.sequential())
        host_load = HostLoad(round_index, load_before, os.getloadavg(), os.cpu_count() or 1)
        shutil.rmtree(cache, ignore_errors=True)
        self.manifest = dataclasses.replace(self.manifest, rounds_run=round_index + 1,
                                            host_load=(*self.manifest.host_load, host_load))
        self._save_manifest()
        return failed

    def _every_cell_decided(self, rounds_done: int) -> bool:
        """With --until-verdict: whether every arm has a verdict in every cell after
        `rounds_done` rounds (judged as the report judges them); logs what is still open."""
        if not self.config.until_verdict or rounds_done < FIRST_LOOK:
            return False
        open_cells = undecided(runs_frame(read_runs(self.out), measure_of(self.manifest)),
                               self.manifest)
        if open_cells:
            self.console.log(f"after {rounds_done} rounds no verdict yet for "
                             f"{', '.join(open_cells)}")
            return False
        self._note_stop(rounds_done, "every cell had a verdict")
        return True

    def _note_stop(self, rounds: int, reason: str) -> None:
        self.manifest = dataclasses.replace(self.manifest, stopped=Stop(rounds, reason))
        self.console.warn(f"stopping after {rounds} rounds: {reason}")

    def _start(self, removed_env: list[str]) -> int:
        if (self.out / RUNS_FILE).exists():
            raise ValueError(f"--out {self.out} already holds a session: pass --resume to "
                             f"continue it, or choose another --out")
        make_out(self.out)
        self.console.open(self.out)
        self.manifest = self._base_manifest(removed_env)
        self._save_manifest()
        return 0

    def _resume(self, removed_env: list[str]) -> int:
        """Continues the session in --out (resume.py); returns the first round to run."""
        first, self.manifest = resume_manifest(self.out, self._base_manifest(removed_env),
                                               self.config, self.command_line)
        self._fingerprint = first_fingerprint(self.manifest)
        self._wall_before = self.manifest.timing.wall_s if self.manifest.timing else 0.0
        self._save_manifest()
        self.console.open(self.out)
        self.console.log(f"resuming {self.out} at round {first + 1} of "
                         f"{self.config.planned_rounds}")
        return first

    def check_knobs(self) -> None:
        """Fails (ValueError) before any server starts where an arm's own tree refuses the
        knobs its servers would start with (knob_check.py)."""
        check_arm_knobs([(arm, self.arm_knob_sets(arm)) for arm in self.arms],
                        self.config.model, self.config.device)

    def arm_knob_sets(self, arm: Arm) -> list[dict[str, str]]:
        """The `--set` mappings `arm`'s servers start with: one, in a `run` session."""
        return [self.server_knobs(arm)]

    def server_knobs(self, arm: Arm) -> dict[str, str]:
        """A resident arm's server knobs: the placement's pinning, then the arm's own."""
        return {**self.placement.server_knobs(), **arm.knobs} if arm.kind == "resident" else {}

    @property
    def runs_a_round(self) -> int:
        """The runs a round records: each arm's in each cell."""
        return len(self.arms) * len(self.config.concurrency) * self.config.runs

    def launch_spec(self, inductor_cache: Path) -> LaunchSpec:
        """How this session starts a server: its model, device, CPUs and GPU, the given
        Inductor cache, the gate's kept Triton cache and, where needed, its bytecode cache."""
        config, placement = self.config, self.placement
        return LaunchSpec(config.model, config.device, placement.server_cpus, inductor_cache,
                          triton_cache(self.repo), placement.gpu, config.startup_timeout,
                          self._pycache)

    def record_server(self, round_index: int, arm: Arm, server: Server,
                       launch: str | None = None) -> None:
        self.manifest = self.manifest.with_server(ServerTiming(
            round=round_index, arm=arm.name, launched_at=server.launched_at,
            health_s=server.health_s, stop_s=server.stop_s, startup=server.startup,
            caches=server.caches, launch=launch))
        self._save_manifest()

    def _save_manifest(self) -> None:
        """Writes the manifest with the session's wall time so far (earlier invocations'
        included), so a session killed mid-way still says how long it ran."""
        wall_s = round(self._wall_before + time.monotonic() - self._clock, 3)
        self.manifest = self.manifest.with_wall(wall_s)
        self.manifest.write(self.out)

    async def check_identity(self, arm: Arm, server: Server) -> bool:
        """Records the arm's /debug/config and fails a server that is not the arm
        (measure.check_source and check_package). Returns whether it asked for the planner and
        did not get it."""
        if arm.kind != "resident":
            return False
        debug = await server.get_json("/debug/config") or {}
        server.startup, server.caches = debug.get("startup"), debug.get("caches")
        check_source(arm, self.manifest.arm(arm.name), debug, server.log_tail())
        self.manifest = self.manifest.with_arm(arm.name, debug_config=debug)
        try:
            self._fingerprint = check_package(arm, debug, self._fingerprint, server.log_tail())
        finally:
            self._save_manifest()
        planner_off = arm.asks_for_planner and debug.get("planning_mode") != "resident"
        if planner_off:
            self.manifest = self.manifest.with_arm(arm.name, planner_off=True)
            self._save_manifest()
        return planner_off

