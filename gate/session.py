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

from rich.console import Console

from gate.arms import Arm, resolve_arm, split_arm, split_knobs
from gate.config import GateConfig
from gate.load import LoadSpec, RunResult, run_load, warm_up
from gate.placement import (
    Placement,
    default_placement,
    parse_placement,
    read_topology,
    resolve_placement,
)
from gate.profiling import append_profile, profile_cell, profile_tool
from gate.records import (
    RUNS_FILE,
    RunRecord,
    append_run,
    read_manifest,
    read_runs,
    rewrite_runs,
    write_manifest,
)
from gate.rule import FIRST_LOOK, MIN_EFFECT
from gate.server import EngineSteps, LaunchSpec, Server, ServerFailed, clean_environment
from gate.stats import runs_frame, undecided
from gate.telemetry import GpuSampler, SiblingBusy, gather_versions, host_info, scan_log
from gate.timing import server_entry

WORKTREES = Path(".gate/worktrees")
INDUCTOR = Path(".gate/inductor")


# what must match between a session's manifest and a run that resumes it, and the value of those
# an older manifest lacks
RESUME_KEYS = ("baseline", "aa_arm", "model", "device", "cells", "prompt_len", "output_len",
               "runs", "requests", "seed", "until_verdict", "min_effect")
RESUME_DEFAULTS = {"until_verdict": False, "min_effect": MIN_EFFECT}


def completed_rounds(records: list[RunRecord], arms: list[str], cells: tuple[int, ...],
                     runs: int) -> int:
    """How many leading rounds hold a record (ok or failed) of every arm, cell and run."""
    have = {(r.round, r.arm, r.concurrency, r.run) for r in records}
    count = 0
    while all((count, arm, cell, run) in have for arm in arms for cell in cells
              for run in range(1, runs + 1)):
        count += 1
    return count


def round_order(arms: list[Arm], round_index: int) -> list[Arm]:
    """ABBA for two arms; in general each round reverses the one before."""
    return list(arms) if round_index % 2 == 0 else list(reversed(arms))


@dataclass
class Session:
    config: GateConfig
    repo: Path
    command_line: list[str]
    console: Console = field(default_factory=lambda: Console(stderr=True))
    failures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.out = self.config.out_dir()
        self.arms = self._resolve_arms()
        self.placement = self._placement()
        self.manifest: dict = {}
        self._fingerprint: str | None = None
        self._clock = time.monotonic()  # this invocation's start
        self._wall_before = 0.0  # the wall time of the invocations this one resumes
        self._never_started: list[str] = []  # arms whose server never became ready

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
        gpu = int(config.gpu) if config.gpu not in (None, "") else (
            0 if config.device == "cuda" else None)
        default = default_placement(read_topology(), gpu)
        overrides = parse_placement(config.server_cpus, config.step_cores, config.api_core,
                                    config.client_cpus, config.gpu,
                                    set(os.sched_getaffinity(0)))
        return resolve_placement(default, overrides)

    def _base_manifest(self, removed_env: list[str]) -> dict:
        config = self.config
        return {
            "name": config.name, "command": self.command_line,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "baseline": self.arms[0].name,
            "aa_arm": self.arms[1].name if config.aa else None,
            "arms": [{**arm.to_dict(), "planner_off": False, "debug_config": None}
                     for arm in self.arms],
            "model": config.model, "device": config.device, "cells": list(config.concurrency),
            "prompt_len": config.prompt_len, "output_len": config.output_len,
            "rounds": config.planned_rounds, "until_verdict": config.until_verdict,
            "max_rounds": config.max_rounds, "min_effect": config.min_effect,
            "rounds_run": 0, "runs": config.runs,
            "requests": {f"c={c}": config.requests_for(c) for c in config.concurrency},
            "seed": config.seed, "placement": self.placement.to_dict(),
            "removed_env": removed_env, "host": host_info(), "versions": gather_versions(),
            "profile": ({**profile_tool(config.device), "steps": config.profile_steps}
                        if config.profile else None),
        }

    # -- the session ------------------------------------------------------------------------

    def run(self, resume: bool = False) -> int:
        """Runs every round (with resume, those runs.jsonl does not hold whole); returns the
        number of failed runs."""
        removed_env = clean_environment()[1]
        first = self._resume(removed_env) if resume else self._start(removed_env)
        failed = 0
        last = self.config.planned_rounds
        for round_index in range(first, last):
            if self._every_cell_decided(round_index):
                break
            failed += self._run_round(round_index)
            if round_index == 0 and self._never_started:
                self._note_stop(1, f"{', '.join(self._never_started)} could not start in the "
                                "first round, and later rounds would start the same tree")
                break
        else:
            if not (self.config.until_verdict and self._every_cell_decided(last)):
                self._note_stop(last, "the planned rounds ran")
        self._save_manifest()
        return failed

    def _run_round(self, round_index: int) -> int:
        """Every arm's server once, in the round's order, on the round's Inductor cache;
        returns the number of failed runs."""
        cache = (self.repo / INDUCTOR / self.out.name / f"round-{round_index}").resolve()
        cache.mkdir(parents=True, exist_ok=True)
        failed = 0
        for position, arm in enumerate(round_order(self.arms, round_index)):
            failed += asyncio.run(self._serve_arm(arm, round_index, position, cache))
        shutil.rmtree(cache, ignore_errors=True)
        self.manifest["rounds_run"] = round_index + 1
        self._save_manifest()
        return failed

    def _every_cell_decided(self, rounds_done: int) -> bool:
        """With --until-verdict: whether every arm has a verdict in every cell after
        `rounds_done` rounds (judged as the report judges them); logs what is still open."""
        if not self.config.until_verdict or rounds_done < FIRST_LOOK:
            return False
        open_cells = undecided(runs_frame(read_runs(self.out)), self.manifest)
        if open_cells:
            self.console.log(f"after {rounds_done} rounds no verdict yet for "
                             f"{', '.join(open_cells)}")
            return False
        self._note_stop(rounds_done, "every cell had a verdict")
        return True

    def _note_stop(self, rounds: int, reason: str) -> None:
        self.manifest["stopped"] = {"after_rounds": rounds, "reason": reason}
        self.console.log(f"stopping after {rounds} rounds: {reason}")

    def _start(self, removed_env: list[str]) -> int:
        if (self.out / RUNS_FILE).exists():
            raise ValueError(f"--out {self.out} already holds a session: pass --resume to "
                             f"continue it, or choose another --out")
        self.out.mkdir(parents=True, exist_ok=True)
        self.manifest = self._base_manifest(removed_env)
        self._save_manifest()
        return 0

    def _resume(self, removed_env: list[str]) -> int:
        """Checks the session in --out is this one; keeps its whole rounds, drops a partial
        one. Returns the first round to run."""
        if not (self.out / RUNS_FILE).exists():
            raise ValueError(f"--resume: {self.out} holds no session to resume")
        manifest = read_manifest(self.out)
        fresh = self._base_manifest(removed_env)
        for key in RESUME_KEYS + ("arms",):
            ours, theirs = fresh[key], manifest.get(key, RESUME_DEFAULTS.get(key))
            if key == "arms":  # the code itself is checked by digest as each server starts
                ours, theirs = ([[a["name"], a["spec"], a["knobs"]] for a in arms]
                                for arms in (ours, theirs))
            if ours != theirs:
                raise ValueError(f"--resume: {key} is {ours} here but {theirs} in {self.out}")
        records = read_runs(self.out)
        first = completed_rounds(records, [a.name for a in self.arms],
                                 self.config.concurrency, self.config.runs)
        rewrite_runs(self.out, [r for r in records if r.round < first])
        fingerprints = [a["debug_config"].get("weights_fingerprint")
                        for a in manifest["arms"] if a.get("debug_config")]
        self._fingerprint = fingerprints[0] if fingerprints else None
        manifest["rounds"] = self.config.planned_rounds
        manifest["max_rounds"] = self.config.max_rounds
        manifest.setdefault("resumed", []).append({
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "from_round": first,
            "command": self.command_line, "host": fresh["host"],
            "versions": fresh["versions"], "removed_env": removed_env})
        self.manifest = manifest
        self._wall_before = (manifest.get("timing") or {}).get("wall_s") or 0.0
        self._save_manifest()
        self.console.log(f"resuming {self.out} at round {first} of "
                         f"{self.config.planned_rounds}")
        return first

    async def _serve_arm(self, arm: Arm, round_index: int, position: int, cache: Path) -> int:
        """Starts the arm's server for the round, measures each cell on it, stops it; returns
        the number of failed runs."""
        config = self.config
        launch = LaunchSpec(config.model, config.device, self.placement.server_cpus, cache,
                            self.placement.gpu, config.startup_timeout)
        knobs = {**self.placement.server_knobs(), **arm.knobs} if arm.kind == "resident" \
            else {}
        log_path = self.out / "logs" / f"{arm.name}-round{round_index}.log"
        self.console.log(f"round {round_index}: starting {arm.name} ({arm.spec})")
        server = Server(arm, launch, knobs, log_path)
        ready = False
        try:
            models = await server.wait_ready()
            ready = True
            planner_off = await self._check_identity(arm, server)
            vocab = int(models["data"][0].get("vocab_size", 0) or 0) if "data" in models else 0
            if vocab < 1:
                raise ServerFailed(f"{arm.name}: /v1/models gives no vocab_size",
                                   server.log_tail())
            failed = 0
            for concurrency in config.concurrency:
                failed += await self._cell(server, arm, round_index, position, concurrency, vocab,
                                           planner_off)
            return failed
        except ServerFailed as err:
            self.console.log(f"[red]{err}[/red]")
            self.failures.append(str(err))
            if not ready:
                self._never_started.append(arm.name)
            return self._record_all_failed(arm, round_index, position, str(err), err.log_tail)
        finally:
            server.stop()
            self._record_server(round_index, arm, server)

    def _record_server(self, round_index: int, arm: Arm, server: Server) -> None:
        timing = self.manifest.setdefault("timing", {"wall_s": 0.0, "servers": []})
        timing["servers"].append(server_entry(round_index, arm.name, server.health_s,
                                              server.stop_s))
        self._save_manifest()

    def _save_manifest(self) -> None:
        """Writes the manifest with the session's wall time so far (earlier invocations'
        included), so a session killed mid-way still says how long it ran."""
        timing = self.manifest.setdefault("timing", {"wall_s": 0.0, "servers": []})
        timing["wall_s"] = round(self._wall_before + time.monotonic() - self._clock, 3)
        write_manifest(self.out, self.manifest)

    async def _check_identity(self, arm: Arm, server: Server) -> bool:
        """Records the arm's /debug/config; fails an arm whose package is not its own tree or
        whose weights differ from the baseline's. Returns whether it asked for the planner
        and did not get it."""
        entry = next(a for a in self.manifest["arms"] if a["name"] == arm.name)
        if arm.kind != "resident":
            return False
        debug = await server.get_json("/debug/config") or {}
        recorded = (entry.get("debug_config") or {}).get("source_digest")
        if recorded and debug.get("source_digest") != recorded:
            raise ServerFailed(f"{arm.name}: its package's source digest "
                               f"{debug.get('source_digest')} differs from {recorded}, which "
                               f"the session's earlier rounds ran", server.log_tail())
        entry["debug_config"] = debug
        expected = str((arm.tree / "resident").resolve())
        if debug.get("resident_package_path") != expected:
            raise ServerFailed(f"{arm.name}: its resident package came from "
                               f"{debug.get('resident_package_path')}, not its tree {expected}",
                               server.log_tail())
        fingerprint = debug.get("weights_fingerprint")
        if self._fingerprint is None:
            self._fingerprint = fingerprint
        elif fingerprint != self._fingerprint:
            raise ServerFailed(f"{arm.name}: weights fingerprint {fingerprint} differs from "
                               f"{self._fingerprint} of the first arm measured",
                               server.log_tail())
        planner_off = arm.asks_for_planner and debug.get("planning_mode") != "resident"
        entry["planner_off"] = entry["planner_off"] or planner_off
        self._save_manifest()
        return planner_off

    async def _cell(self, server: Server, arm: Arm, round_index: int, position: int,
                    concurrency: int, vocab: int, planner_off: bool) -> int:
        # warmed before the first run's counters are read, so its server step times and GPU
        # samples cover its own requests only
        spec = await self._warmed_load(server, concurrency, vocab, round_index)
        failed = 0
        for run in range(1, self.config.runs + 1):
            if not server.alive():
                raise ServerFailed(f"{arm.name}: server died (code {server.process.returncode})",
                                   server.log_tail())
            record = await self._measure(server, arm, spec, round_index, position, run,
                                         planner_off)
            append_run(self.out, record)
            failed += not record.ok
            metrics = record.metrics
            self.console.log(f"round {round_index} {arm.name} c={concurrency} run {run}: "
                             f"{metrics.output_throughput} tok/s, {metrics.failed} failed "
                             "requests")
        if self.config.profile and round_index == 0:
            await self._profile(server, arm, spec)
        return failed

    async def _profile(self, server: Server, arm: Arm, spec: LoadSpec) -> None:
        """The cell's profile window, after its timed runs (profiling.py)."""
        self.console.log(f"{arm.name} c={spec.concurrency}: profiling "
                         f"{self.config.profile_steps} steps")
        record = await profile_cell(server, spec, self.config.profile_steps, self.out,
                                    arm.name, 0)
        if record["error"]:
            self.console.log(f"[yellow]{arm.name} c={spec.concurrency}: {record['error']}"
                             "[/yellow]")
        append_profile(self.out, record)

    async def _warmed_load(self, server: Server, concurrency: int, vocab: int,
                           round_index: int) -> LoadSpec:
        """Runs the cell's warm-up (one request per slot); returns the cell's measured load."""
        config = self.config
        spec = LoadSpec(concurrency=concurrency, num_requests=config.requests_for(concurrency),
                        prompt_len=config.prompt_len, output_len=config.output_len,
                        vocab_size=vocab, seed=config.seed * 1000 + round_index,
                        num_warmup=concurrency)
        await warm_up(server.url, spec)
        return dataclasses.replace(spec, num_warmup=0)

    async def _measure(self, server: Server, arm: Arm, spec: LoadSpec, round_index: int,
                       position: int, run: int, planner_off: bool) -> RunRecord:
        placement = self.placement
        siblings = SiblingBusy(set(placement.server_cpus) | set(placement.client_cpus),
                               set(os.sched_getaffinity(0)))
        gpu = GpuSampler(placement.gpu)
        before = EngineSteps.parse(await server.metrics())
        started = time.time()
        siblings.start()
        gpu.start()
        result: RunResult = await run_load(server.url, spec)
        gpu_sample, busy = gpu.stop(), siblings.stop()
        steps, step_ms = EngineSteps.parse(await server.metrics()).since(before)
        tracebacks, recompiles = scan_log(server.log_path)
        metrics = result.metrics
        ok = metrics.completed > 0 and server.alive()
        return RunRecord(
            round=round_index, arm=arm.name, position=position, concurrency=spec.concurrency,
            run=run, ok=ok, error=None if ok else "; ".join(result.errors) or "server died",
            metrics=metrics, steps=steps, step_ms=step_ms, sibling_busy_cpus=busy,
            gpu=gpu_sample, server_tracebacks=tracebacks, recompile_limit_lines=recompiles,
            planner_off=planner_off, log_tail=None if ok else server.log_tail(),
            started_at=started,
        )

    def _record_all_failed(self, arm: Arm, round_index: int, position: int, error: str,
                           log_tail: str) -> int:
        """A server that failed to start or died: its remaining runs are failed runs."""
        done = {(r.concurrency, r.run) for r in read_runs(self.out)
                if r.arm == arm.name and r.round == round_index} \
            if (self.out / RUNS_FILE).exists() else set()
        count = 0
        for concurrency in self.config.concurrency:
            for run in range(1, self.config.runs + 1):
                if (concurrency, run) in done:
                    continue
                append_run(self.out, RunRecord(
                    round=round_index, arm=arm.name, position=position, concurrency=concurrency,
                    run=run, ok=False, error=error, log_tail=log_tail, started_at=time.time()))
                count += 1
        return count

