"""Served against in-process throughput of one load, in one call: the ratio issue 35 asks for.

    python -m gate.tools.served_ratio [--model tiny] [--device cpu] [--concurrency 64]
        [--prompt-len 512] [--shared-prefix-len 0] [--output-len 256] [--requests N]
        [--request-rate R] [--clients N] [--seed 0]
        [--set knob=value ...] [--server-cpus LIST] [--client-cpus LIST] [--gpu N]
        [--startup-timeout 900] [--logs DIR] [--inductor-cache DIR] [--format table|json]

One load (prompts of --prompt-len random token ids after a --shared-prefix-len prefix common
to all, as the gate's shared-prefix workload; exactly --output-len tokens each, greedy,
ignore_eos, --requests of them in a closed loop of --concurrency in flight, or with
--request-rate open loop, arriving as the gate's `--request-rate` sends them, at most
--concurrency in flight; after a warm-up of one request a slot, two with a shared prefix) runs
twice on the same engine, one half after the other:

- served: `resident serve` launched as the gate launches an arm's server (gate/run/server.py:
  clean environment, server CPUs, pinning knobs), driven by the gate's load client as a gate
  run drives it (gate/run/measure.py: warm-up, then measure_run with the server's step
  counters, API/core/client CPU and GPU samples over the measured requests);
- in process: `python -m resident.tools.closed_loop` in the server's environment and CPUs,
  the engine built as the engine core builds it, given the same warm-up and measured prompt
  ids and arrivals (gate/run/load.py: warmup_prompts, measured_prompts, arrival_offsets), no
  HTTP and no API process.

Both halves' requests become the gate's ServeMetrics (load.summarize: output tok/s = output
tokens over the first send to the last token), and the served/in-process ratio is printed
with where the gap goes: output tok/s = tokens a step x steps a second of step time x the
share of the wall inside steps (each half's step counters over its measured requests), so
the three factors' served/in-process ratios multiply to the tok/s ratio; beside them TTFT,
TPOT, ITL and ms a step by kind. The in-process engine's /debug/config equivalent is checked
against the server's (knobs, weights, planning mode, source, graphs); a difference, or a
failed request in either half, is reported and the exit code is 1.

This lives in the gate, not in resident.tools.bench: the served half needs the gate's load
client, launcher and prompts, and resident may not import the gate; the in-process loop is
resident's (resident/tools/closed_loop.py).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate.config import clients_for
from gate.metrics import ServeMetrics
from gate.records import RunRecord
from gate.run.arms import Arm, resolve_arm
from gate.run.bytecode import server_pycache
from gate.run.load import (
    LoadSpec,
    RequestResult,
    arrival_offsets,
    measured_prompts,
    num_warmup_for,
    summarize,
    warm_up,
    warmup_prompts,
)
from gate.run.measure import RunPlace, measure_run
from gate.run.placement import Placement, host_placement
from gate.run.server import (
    EngineSteps,
    LaunchSpec,
    Server,
    ServerFailed,
    launch_environment,
    pinned_child,
    prefix_counts,
)
from gate.run.session import PYCACHE, WORKTREES, triton_cache
from resident.config import check_knobs_for_model, parse_set_options
from resident.render import OutputFormat, render
from resident.tool_args import add_format, count, non_negative

TREE = Path(__file__).resolve().parents[2]  # the tree whose engine both halves run
ARM = "served"
STARTUP_TIMEOUT_S = 900.0  # a CUDA engine compiles and captures its graphs first
REQUESTS_PER_SLOT = 4  # the gate's default requests a run
# the prefix cache's counters in the in-process engine's stats (closed_loop's STEP_STATS), by
# the key a half keeps them under, as the served half's from /metrics (server.PREFIX_COUNTERS)
ENGINE_PREFIX_STATS = {"hits": "prefix_hits", "saved_tokens": "prefix_cached_tokens"}
# what must match between the served engine's /debug/config and the in-process engine.info(),
# beside every knob
SAME_ENGINE = ("weights_fingerprint", "planning_mode", "source_digest", "attention_backend",
               "cuda_graphs", "prefill_graphs", "host_plan_free", "dtype", "torch_num_threads")


@dataclass(frozen=True)
class Half:
    """One half's measurement: the load's numbers over its measured requests, its engine's
    steps by kind and mean ms a step by kind over them, its prefix cache's hits and restored
    prompt tokens over them (`hits`, `saved_tokens`), its first errors."""

    metrics: ServeMetrics
    steps: dict[str, int]
    step_ms: dict[str, float]
    prefix: dict[str, int]
    errors: tuple[str, ...] = ()
    num_waited: int = 0  # open loop: requests that arrived with every slot busy

    @property
    def busy_s(self) -> float:
        """Seconds inside the engine's steps over the measured requests."""
        return sum(self.steps[kind] * ms for kind, ms in self.step_ms.items()) / 1e3

    def factors(self) -> dict[str, float | None]:
        """tokens a step x steps a second of step time x the wall's share inside steps =
        output tok/s (None where a half ran no step)."""
        tokens, num_steps = self.metrics.total_output_tokens, sum(self.steps.values())
        if not num_steps or not self.busy_s or not self.metrics.duration:
            return dict.fromkeys(FACTORS)
        return {"tokens_a_step": tokens / num_steps,
                "steps_a_busy_second": num_steps / self.busy_s,
                "busy_share": self.busy_s / self.metrics.duration}

    def outside_ms_a_step(self) -> float | None:
        """The wall outside the engine's steps, ms a step: the core loop's intake and
        outputs and its idle waits (served), the loop's bookkeeping (in process)."""
        num_steps = sum(self.steps.values())
        return (self.metrics.duration - self.busy_s) * 1e3 / num_steps if num_steps else None


FACTORS = ("tokens_a_step", "steps_a_busy_second", "busy_share")


class HalfFailed(ServerFailed):
    """A half could not be measured; carries its log's tail (as the gate's ServerFailed)."""


@dataclass(frozen=True)
class Setup:
    """Where and what both halves run: the arm (this tree, the user's knobs), how its
    processes launch, the knobs they get (pinning ones first), the placement, where their logs
    go and a scratch directory (the prompts, the in-process answer, the Inductor cache)."""

    arm: Arm
    launch: LaunchSpec
    knobs: dict[str, str]
    placement: Placement
    logs: Path
    work: Path


async def served_half(setup: Setup, spec: LoadSpec) -> tuple[Half, LoadSpec, dict, RunRecord]:
    """The served half: (its measurement, the load with the server's vocabulary, the server's
    /debug/config, the gate's record of the run); the server is stopped before it returns."""
    server = Server(setup.arm, setup.launch, setup.knobs, setup.logs / "server.log")
    try:
        models = await server.wait_ready()
        debug = await server.get_json("/debug/config") or {}
        spec = dataclasses.replace(spec, vocab_size=server.vocab_of(models))
        await warm_up(server.url, spec)
        planner_off = setup.arm.asks_for_planner and debug.get("planning_mode") != "resident"
        record = await measure_run(server, setup.placement,
                                   dataclasses.replace(spec, num_warmup=0),
                                   RunPlace(ARM, 0, 0, 1), planner_off)
    finally:
        server.stop()
    if not record.ok or record.metrics is None:
        raise HalfFailed(f"served: {record.error}", record.log_tail or "")
    errors = (record.error,) if record.error else ()
    return (Half(record.metrics, record.steps, record.step_ms, record.prefix, errors,
                 record.num_waited), spec, debug, record)


def in_process_half(setup: Setup, spec: LoadSpec) -> tuple[Half, dict]:
    """The in-process half (resident.tools.closed_loop, in the server's environment and
    CPUs, on `spec`'s warm-up and measured prompts): (its measurement, its engine.info())."""
    prompts, answer = setup.work / "prompts.json", setup.work / "in_process.json"
    measured_ids = measured_prompts(spec)
    prompts.write_text(json.dumps({"warmup": warmup_prompts(spec), "measured": measured_ids,
                                   "arrivals": arrival_offsets(spec, len(measured_ids))}))
    launch = setup.launch
    command = [sys.executable, "-m", "resident.tools.closed_loop", launch.model, "--device",
               launch.device, "--prompts", str(prompts), "--output-len", str(spec.output_len),
               "--concurrency", str(spec.concurrency), "--json", str(answer)]
    command += [arg for knob, value in setup.knobs.items() for arg in ("--set", f"{knob}={value}")]
    env, _ = launch_environment(setup.arm, launch)
    log_path = setup.logs / "in_process.log"
    limit_s = launch.startup_timeout_s + spec.timeout_s
    try:
        with log_path.open("w") as log:
            code = subprocess.run(command, env=env, cwd=setup.arm.tree, stdout=log,
                                  stderr=subprocess.STDOUT,
                                  preexec_fn=pinned_child(set(launch.cpus), os.getpid()),
                                  timeout=limit_s).returncode
    except subprocess.TimeoutExpired:  # run() has killed it
        raise HalfFailed(f"in process: not done in {limit_s:g} s",
                         log_path.read_text()[-4000:]) from None
    if code:
        raise HalfFailed(f"in process: exited {code}", log_path.read_text()[-4000:])
    data = json.loads(answer.read_text())
    measured = summarize(dataclasses.replace(spec, num_warmup=0),
                         [RequestResult(**result) for result in data["requests"]],
                         data["wall_s"])
    before, after = data["stats_before"], data["stats_after"]
    steps, step_ms = _steps(after).since(_steps(before))
    prefix = prefix_counts(before, after, ENGINE_PREFIX_STATS)
    return (Half(measured.metrics, steps, step_ms, prefix, measured.errors, data["num_waited"]),
            data["info"])


def _steps(stats: dict) -> EngineSteps:
    return EngineSteps({k: int(v) for k, v in stats["steps"].items()},
                       {k: float(v) for k, v in stats["step_seconds"].items()})


def engine_differences(served: dict, in_process: dict) -> dict[str, dict[str, Any]]:
    """What differs between the served engine (/debug/config) and the in-process one
    (engine.info()): its knobs, each by its name, and SAME_ENGINE by theirs."""
    differ: dict[str, dict[str, Any]] = {}
    knobs_served, knobs_in = served.get("knobs") or {}, in_process.get("knobs") or {}
    for knob in sorted(set(knobs_served) | set(knobs_in)):
        if knobs_served.get(knob) != knobs_in.get(knob):
            differ[f"knob {knob}"] = {"served": knobs_served.get(knob),
                                      "in_process": knobs_in.get(knob)}
    for key in SAME_ENGINE:
        if json.dumps(served.get(key), default=str) != json.dumps(in_process.get(key),
                                                                   default=str):
            differ[key] = {"served": served.get(key), "in_process": in_process.get(key)}
    return differ


def _ratio(served: float | None, in_process: float | None) -> float | None:
    if served is None or not in_process:
        return None
    return round(served / in_process, 4)


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def comparison(in_process: Half, served: Half) -> list[dict[str, Any]]:
    """The comparison table: a row a measure, each half's value and served / in process."""
    rows: list[tuple[str, Any, Any]] = []
    for name, label in (("output_throughput", "output tok/s"), ("completed", "completed"),
                        ("failed", "failed"), ("total_output_tokens", "output tokens"),
                        ("duration", "wall s"), ("median_ttft_ms", "TTFT p50 ms"),
                        ("mean_ttft_ms", "TTFT mean ms"), ("p99_ttft_ms", "TTFT p99 ms"),
                        ("median_tpot_ms", "TPOT p50 ms"), ("median_itl_ms", "ITL p50 ms")):
        rows.append((label, getattr(in_process.metrics, name), getattr(served.metrics, name)))
    for kind in sorted(set(in_process.steps) | set(served.steps)):
        rows.append((f"{kind} steps", in_process.steps.get(kind, 0), served.steps.get(kind, 0)))
        rows.append((f"{kind} ms a step", in_process.step_ms.get(kind),
                     served.step_ms.get(kind)))
    in_factors, served_factors = in_process.factors(), served.factors()
    rows += [(factor.replace("_", " "), in_factors[factor], served_factors[factor])
             for factor in FACTORS]
    rows.append(("ms outside steps a step", in_process.outside_ms_a_step(),
                 served.outside_ms_a_step()))
    rows += [(f"prefix {key.replace('_', ' ')}", in_process.prefix.get(key),
              served.prefix.get(key)) for key in ("hits", "saved_tokens")]
    rows.append(("requests that waited for a slot", in_process.num_waited, served.num_waited))
    return [{"what": label, "in_process": _round(a, 4), "served": _round(b, 4),
             "served_over_in_process": _ratio(b, a)} for label, a, b in rows]


def gap(in_process: Half, served: Half) -> dict[str, Any]:
    """The tok/s ratio and its three factors' ratios (they multiply to it), the factor that
    loses most, and the TTFT the served path adds."""
    ratio = _ratio(served.metrics.output_throughput, in_process.metrics.output_throughput)
    in_factors, served_factors = in_process.factors(), served.factors()
    ratios = {factor: _ratio(served_factors[factor], in_factors[factor]) for factor in FACTORS}
    known = {factor: r for factor, r in ratios.items() if r is not None}
    losing = min(known, key=known.get) if known and min(known.values()) < 1 else "none"
    ttft = (None if None in (served.metrics.median_ttft_ms, in_process.metrics.median_ttft_ms)
            else round(served.metrics.median_ttft_ms - in_process.metrics.median_ttft_ms, 3))
    product = math.prod(known.values()) if len(known) == len(FACTORS) else None
    return {"tok_s_ratio": ratio, **{f"{f}_ratio": r for f, r in ratios.items()},
            "factors_product": _round(product, 4), "largest_loss": losing,
            "ttft_p50_added_ms": ttft}


def served_cpu(record: RunRecord) -> dict[str, Any]:
    """The served half's CPU µs a streamed token over the measured requests (measure_run): the
    launched process (the first API process), its descendants (the engine core and any
    further API processes) and the load client (this process and its client processes)."""
    tokens = record.metrics.total_output_tokens if record.metrics else 0
    cpu = {"first_api": record.api_cpu_s, "core_and_other_api": record.core_cpu_s,
           "client": record.client_cpu_s}
    return {**{f"{who}_us_per_token": None if seconds is None or not tokens
               else round(seconds * 1e6 / tokens, 2) for who, seconds in cpu.items()},
            "client_processes": record.num_clients,
            "server_tracebacks": record.server_tracebacks}


def measure(setup: Setup, spec: LoadSpec) -> tuple[dict[str, Any], bool]:
    """Both halves, served first (it learns the vocabulary the prompts are drawn below);
    (the sections to render, whether the comparison holds: no failed request, the same
    engine)."""
    served, spec, debug, record = asyncio.run(served_half(setup, spec))
    in_process, info = in_process_half(setup, spec)
    differ = engine_differences(debug, info)
    summary = {
        "model": setup.launch.model, "device": setup.launch.device,
        "concurrency": spec.concurrency, "shared_prefix_len": spec.shared_prefix_len,
        "prompt_len": spec.prompt_len, "output_len": spec.output_len, "requests": spec.num_requests,
        "request_rate": spec.request_rate or None,
        "warmup_requests": spec.num_warmup, "clients": spec.num_clients,
        "in_process_tok_s": in_process.metrics.output_throughput,
        "served_tok_s": served.metrics.output_throughput,
        "ratio": _ratio(served.metrics.output_throughput, in_process.metrics.output_throughput),
        "same_engine": not differ, "planning_mode": debug.get("planning_mode"),
        "logs": str(setup.logs)}
    sections: dict[str, Any] = {"served_ratio": summary, "gap": gap(in_process, served),
                                "comparison": comparison(in_process, served),
                                "served_cpu": served_cpu(record)}
    if differ:
        sections["engine_differences"] = [{"what": key, **values}
                                          for key, values in differ.items()]
    errors = [{"arm": name, "error": error} for name, half in
              (("in_process", in_process), ("served", served)) for error in half.errors]
    if errors:
        sections["errors"] = errors
    failed = in_process.metrics.failed or served.metrics.failed
    return sections, not (differ or failed)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--concurrency", type=count, default=64)
    parser.add_argument("--prompt-len", type=count, default=512)
    parser.add_argument("--shared-prefix-len", type=non_negative, default=0,
                        help="tokens of one prefix every prompt opens with (the gate's "
                             "shared-prefix workload)")
    parser.add_argument("--output-len", type=count, default=256)
    parser.add_argument("--request-rate", type=float, default=0.0,
                        help="open loop: measured requests a second (0: a closed loop)")
    parser.add_argument("--requests", type=non_negative, default=0,
                        help=f"measured requests (0: {REQUESTS_PER_SLOT} a slot, at least 8)")
    parser.add_argument("--clients", type=non_negative, default=0,
                        help="load client processes (0: the gate's rule, one a 128 slots)")
    parser.add_argument("--seed", type=int, default=0, help="the prompts' seed")
    parser.add_argument("--set", dest="knobs", action="append", default=[],
                        help="an engine knob for both halves, knob=value")
    parser.add_argument("--server-cpus", help="CPU list for the server and the in-process "
                        "engine (default: the gate's placement)")
    parser.add_argument("--client-cpus", help="CPU list for the load client")
    parser.add_argument("--gpu", help="GPU index (default 0 on cuda)")
    parser.add_argument("--startup-timeout", type=float, default=STARTUP_TIMEOUT_S)
    parser.add_argument("--logs", type=Path, default=None,
                        help="directory for the server's and the in-process run's logs "
                             "(default: a fresh one under the temp directory)")
    parser.add_argument("--inductor-cache", type=Path, default=None,
                        help="Inductor cache for both halves (default: a fresh one; a kept "
                             "one spares later calls the compile)")
    add_format(parser)
    return parser


def _setup(args: argparse.Namespace, parser: argparse.ArgumentParser, work: Path) -> Setup:
    """The halves' setup from checked options (a bad one is a parser error naming it), with
    `work` for scratch."""
    try:
        knobs = parse_set_options(args.knobs)
        check_knobs_for_model(args.model, args.device, knobs)
        placement = host_placement(args.device, args.server_cpus, None, None,
                                   args.client_cpus, args.gpu)
        arm = resolve_arm(ARM, ".", TREE, TREE / WORKTREES, dict(knobs))
    except (ValueError, OSError) as err:
        parser.error(str(err))
    logs = args.logs or Path(tempfile.mkdtemp(prefix="served-ratio-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    # one cache for both halves, as a gate round's arms share one
    inductor = args.inductor_cache or work / "inductor"
    inductor.mkdir(parents=True, exist_ok=True)
    launch = LaunchSpec(args.model, args.device, placement.server_cpus, inductor.resolve(),
                        triton_cache(TREE), placement.gpu, args.startup_timeout,
                        server_pycache(TREE / PYCACHE))
    return Setup(arm, launch, {**placement.server_knobs(), **arm.knobs}, placement,
                 logs.resolve(), work)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not 0 <= args.request_rate < math.inf:
        parser.error(f"--request-rate must be >= 0 and finite, got {args.request_rate}")
    if args.startup_timeout <= 0:
        parser.error(f"--startup-timeout must be > 0, got {args.startup_timeout}")
    with tempfile.TemporaryDirectory(prefix="served-ratio-") as work:
        return _run(_setup(args, parser, Path(work)), args)


def _run(setup: Setup, args: argparse.Namespace) -> int:
    """Both halves of the load the options describe; renders them; the exit code."""
    spec = LoadSpec(args.concurrency,
                    args.requests or max(8, REQUESTS_PER_SLOT * args.concurrency),
                    args.prompt_len, args.output_len, seed=args.seed,
                    shared_prefix_len=args.shared_prefix_len,
                    num_warmup=num_warmup_for(args.concurrency, args.shared_prefix_len),
                    num_clients=clients_for(args.concurrency,
                                            len(setup.placement.client_cpus), args.clients),
                    request_rate=args.request_rate)
    allowed = os.sched_getaffinity(0)
    if setup.placement.client_cpus:  # as the gate pins itself: the load client's CPUs
        os.sched_setaffinity(0, setup.placement.client_cpus)
    try:
        sections, holds = measure(setup, spec)
    except ServerFailed as err:  # a HalfFailed too
        print(f"served_ratio: {err}\n{err.log_tail}", file=sys.stderr)
        return 1
    finally:
        os.sched_setaffinity(0, allowed)
    render(sections, OutputFormat(args.format))
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
