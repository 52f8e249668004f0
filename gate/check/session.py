"""`resident-gate check`: the correctness gate a change passes before its throughput means
anything.

The arms are `run`'s (specs, placement, the per-session Inductor cache, the identity checks of
Session.check_identity: each arm's package from its own tree, one weights fingerprint, one
source digest an arm across its servers), plus the yardstick: the gate's A/A arm, a second
server of the baseline, always on. The sweeps (check/config.py) run as launches, one server per
arm and knob set, each serving the launch's loads of the same prompts; each server's
/debug/rowcheck is read after its loads. check/judge.py gives the verdict; check/report.py
writes check.json, check.md and answers.jsonl beside manifest.json and the servers' logs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from gate.check.config import CheckConfig, Launch, PromptSet, load_prompts, plan_launches
from gate.check.judge import PASS, Roles, judge
from gate.check.load import Answer, complete_all, gives_logprobs
from gate.check.report import CHECK_JSON, write_check
from gate.manifest import Manifest
from gate.run.arms import Arm
from gate.run.server import Server, ServerFailed, clean_environment
from gate.run.session import INDUCTOR, Session, make_out


@dataclass
class CheckSession(Session):
    """A Session whose arms serve the check's launches instead of rounds of timed runs."""

    check: CheckConfig = field(default_factory=CheckConfig)

    def __post_init__(self) -> None:
        self.config = dataclasses.replace(self.config, aa=True)  # the yardstick
        super().__post_init__()
        for arm in self.arms:
            if arm.kind != "resident":
                raise ValueError(f"--arm {arm.name}={arm.spec}: the check needs resident arms "
                                 "(it sets the sweeps' knobs and reads /debug/rowcheck)")
        names = [arm.name for arm in self.arms]
        self.roles = Roles(names[0], names[1], tuple(names[2:]))
        self.prompts: PromptSet = load_prompts(self.repo, self.check)
        self.launches = plan_launches(self.check)
        self.answers: dict[str, dict[str, list[Answer]]] = {}  # load -> arm -> by prompt
        self.launched: dict[str, dict[str, dict[str, Any]]] = {}  # launch -> arm -> record
        self.report: dict[str, Any] = {}

    def run(self, resume: bool = False) -> int:
        """Runs every launch, judges and writes the outputs; returns 0 for pass, 1 for fail."""
        if (self.out / CHECK_JSON).exists():
            raise ValueError(f"--out {self.out} already holds a check; choose another --out")
        self.check_knobs()
        make_out(self.out)
        self.manifest = self._check_manifest(clean_environment()[1])
        self.manifest.write(self.out)
        cache = (self.repo / INDUCTOR / self.out.name / "check").resolve()
        cache.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        try:
            for launch in self.launches:
                for arm in self._arms_of(launch):
                    asyncio.run(self._serve(arm, launch, cache))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        self.report = self._report(time.monotonic() - started)
        self.manifest.write(self.out)
        write_check(self.out, self.report, self.manifest, self.answers)
        return 0 if self.report["verdict"] == PASS else 1

    def _check_manifest(self, removed_env: list[str]) -> Manifest:
        """`run`'s manifest without its rounds and cells (Manifest.to_dict leaves a check's
        out), with the check's options, prompts and yardstick."""
        return dataclasses.replace(
            self._base_manifest(removed_env), command_kind="check",
            yardstick=self.roles.yardstick, check=self.check.to_dict(),
            prompts=self.prompts.to_dict(), timing=None)

    def arm_knob_sets(self, arm: Arm) -> list[dict[str, str]]:
        """The `--set` mappings of `arm`'s servers: one a launch it serves."""
        return [self._launch_knobs(arm, launch) for launch in self.launches
                if arm in self._arms_of(launch)]

    def _launch_knobs(self, arm: Arm, launch: Launch) -> dict[str, str]:
        """A server's knobs: the arm's (server_knobs), then the launch's, then its heads'."""
        return {**self.server_knobs(arm), **launch.knobs,
                **(launch.head_knobs if arm.name in self.roles.heads else {})}

    def _arms_of(self, launch: Launch) -> list[Arm]:
        return [arm for arm in self.arms
                if launch.yardstick or arm.name != self.roles.yardstick]

    async def _serve(self, arm: Arm, launch: Launch, cache: Path) -> None:
        """One server: the arm's knobs, then the launch's; the identity checks; the launch's
        loads; its row-check counts. A server that fails fails its loads' requests."""
        spec = self.launch_spec(cache)
        knobs = self._launch_knobs(arm, launch)
        record: dict[str, Any] = {"knobs": knobs, "error": None}
        self.launched.setdefault(launch.name, {})[arm.name] = record
        self.console.log(f"{launch.name}: starting {arm.name} ({arm.spec})")
        server = Server(arm, spec, knobs, self.out / "logs" / f"{arm.name}-{launch.name}.log")
        try:
            await server.wait_ready()
            await self.check_identity(arm, server)
            record |= await self._run_loads(arm, launch, server)
        except ServerFailed as err:
            record["error"] = str(err)
            self.failures.append(f"{arm.name} under {launch.name}: {err}")
            self.console.log(f"[red]{arm.name} under {launch.name}: {err}[/red]")
        finally:
            server.stop()
            self.record_server(0, arm, server, launch.name)
        for load in launch.loads:  # a server that failed answered nothing
            answers = self.answers.setdefault(load.name, {})
            answers.setdefault(arm.name, [Answer(False, error=f"server: {record['error']}")]
                               * len(self.prompts.texts))

    async def _run_loads(self, arm: Arm, launch: Launch, server: Server) -> dict[str, Any]:
        entry = self.manifest.arm(arm.name)
        try:
            logprobs = self.check.logprobs if await gives_logprobs(server.url) else None
        except (RuntimeError, aiohttp.ClientError, TimeoutError) as err:
            raise ServerFailed(f"{arm.name}: {err}", server.log_tail()) from None
        for load in launch.loads:
            started = time.monotonic()
            texts = self.prompts.with_preamble() if load.preamble else self.prompts.texts
            answers = await complete_all(server.url, texts, load.concurrency,
                                         load.caps(self.check.max_tokens, len(texts)), logprobs,
                                         seeded=load.seeded)
            self.answers.setdefault(load.name, {})[arm.name] = answers
            self.console.log(f"{launch.name}: {arm.name} {load.name} c={load.concurrency}: "
                             f"{sum(a.ok for a in answers)}/{len(answers)} ok, "
                             f"{sum(len(a.token_ids) for a in answers)} tokens in "
                             f"{time.monotonic() - started:.1f} s")
        if not server.alive():
            raise ServerFailed(f"server died (code {server.process.returncode})",
                               server.log_tail())
        status, health = await server.request_json("GET", "/health")
        if status != 200:  # the API process outlives a dead engine core for a moment
            raise ServerFailed(f"engine core failed: /health {status} {health}",
                               server.log_tail())
        metrics = await server.metrics()
        return {"planning_mode": (entry.debug_config or {}).get("planning_mode"),
                "logprobs": logprobs is not None,
                "rowcheck": await server.get_json("/debug/rowcheck"),
                "prefix_hits": int(metrics.get("resident_prefix_cache_hits_total", 0)),
                "prefix_saved_tokens": int(
                    metrics.get("resident_prefix_cache_saved_tokens_total", 0))}

    def _report(self, wall_s: float) -> dict[str, Any]:
        report = judge(self.check, self.roles, self.answers, self.launched)
        return {**report, "check": self.check.to_dict(), "prompts": self.prompts.to_dict(),
                "wall_s": round(wall_s, 1),
                "loads": {load.name: load.concurrency for launch in self.launches
                          for load in launch.loads},
                "varied_loads": [load.name for launch in self.launches for load in launch.loads
                                 if load.varied],
                "launches": {launch.name: {"knobs": launch.knobs, "head_knobs": launch.head_knobs,
                                           "arms": self.launched.get(launch.name, {})}
                             for launch in self.launches}}
