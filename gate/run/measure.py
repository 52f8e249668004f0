"""One cell on a running server: its warm-up, each timed run as a RunRecord (the load's metrics,
the server's step counters over it, sibling CPUs, GPU samples, log scan), and the check that
a server is the arm it claims to be (its package's tree, weights and source digest)."""

from __future__ import annotations

import dataclasses
import os
import time

from gate.config import GateConfig
from gate.manifest import ArmEntry
from gate.records import RunRecord
from gate.run.arms import Arm
from gate.run.load import LoadSpec, RunResult, num_warmup_for, run_load, warm_up
from gate.run.placement import Placement
from gate.run.server import (
    WINDOW_ARRIVALS,
    EngineSteps,
    Server,
    ServerFailed,
    core_latency_ms,
    counter_delta,
    gc_pause_s,
    prefix_counts,
)
from gate.run.telemetry import GpuSampler, ProcessCpu, SiblingBusy, scan_log


async def warmed_load(server: Server, config: GateConfig, concurrency: int, vocab: int,
                      round_index: int, num_client_cpus: int) -> LoadSpec:
    """Runs the cell's warm-up (one request a slot, two with a shared prefix:
    load.num_warmup_for); returns the cell's measured load."""
    spec = LoadSpec(concurrency=concurrency, num_requests=config.requests_for(concurrency),
                    prompt_len=config.prompt_len, output_len=config.output_len,
                    shared_prefix_len=config.shared_prefix_len,
                    vocab_size=vocab, seed=config.seed * 1000 + round_index,
                    num_warmup=num_warmup_for(concurrency, config.shared_prefix_len),
                    num_clients=config.clients_for(concurrency, num_client_cpus),
                    request_rate=config.rate_for(concurrency), **config.sampling)
    await warm_up(server.url, spec)
    return dataclasses.replace(spec, num_warmup=0)


@dataclasses.dataclass(frozen=True)
class RunPlace:
    """Where a run sits in the session: its arm, round, the arm's position in the round's
    order, and the run's number in its cell."""

    arm: str
    round: int
    position: int
    run: int


async def measure_run(server: Server, placement: Placement, spec: LoadSpec, place: RunPlace,
                      planner_off: bool) -> RunRecord:
    """One timed run of the cell's load, with what the server and the machine did meanwhile."""
    siblings = SiblingBusy(set(placement.server_cpus) | set(placement.client_cpus),
                           set(os.sched_getaffinity(0)))
    gpu = GpuSampler(placement.gpu)
    server_cpu = ProcessCpu(server.process.pid)
    metrics_before = await server.metrics()
    started = time.time()
    siblings.start()
    server_cpu.start()
    gpu.start()
    result: RunResult = await run_load(server.url, spec)
    gpu_sample, busy, (api_cpu_s, core_cpu_s) = gpu.stop(), siblings.stop(), server_cpu.stop()
    metrics_after = await server.metrics()
    steps, step_ms = EngineSteps.parse(metrics_after).since(EngineSteps.parse(metrics_before))
    tracebacks, recompiles = scan_log(server.log_path)
    metrics = result.metrics
    ok = metrics.completed > 0 and server.alive()
    return RunRecord(
        round=place.round, arm=place.arm, position=place.position,
        concurrency=spec.concurrency, run=place.run, ok=ok,
        # a run's failure, or the first errors of the requests that failed in a run that ran
        error="; ".join(result.errors) or (None if ok else "server died"),
        metrics=metrics, steps=steps, step_ms=step_ms,
        prefix=prefix_counts(metrics_before, metrics_after),
        window_arrivals=counter_delta(metrics_before, metrics_after, WINDOW_ARRIVALS),
        core_gc_s=gc_pause_s(metrics_before, metrics_after),
        core_ms=core_latency_ms(metrics_before, metrics_after), sibling_busy_cpus=busy,
        api_cpu_s=api_cpu_s, core_cpu_s=core_cpu_s, client_cpu_s=result.client_cpu_s,
        num_clients=spec.num_clients, num_waited=result.num_waited,
        gpu=gpu_sample, server_tracebacks=tracebacks, recompile_limit_lines=recompiles,
        planner_off=planner_off, log_tail=None if ok else server.log_tail(),
        started_at=started,
    )


def check_source(arm: Arm, entry: ArmEntry, debug: dict, log_tail: str) -> None:
    """Fails (ServerFailed) a resident arm's server whose /debug/config (`debug`) gives a source
    digest other than the one its manifest `entry` recorded in an earlier round."""
    recorded = entry.source_digest
    if recorded and debug.get("source_digest") != recorded:
        raise ServerFailed(f"{arm.name}: its package's source digest "
                           f"{debug.get('source_digest')} differs from {recorded}, which "
                           f"the session's earlier rounds ran", log_tail)


def check_package(arm: Arm, debug: dict, fingerprint: str | None, log_tail: str) -> str | None:
    """Fails (ServerFailed) a resident arm's server whose /debug/config (`debug`) shows a
    package from outside the arm's tree, or weights other than `fingerprint` (the first arm's;
    None: this is the first). Returns the weights fingerprint."""
    expected = str((arm.tree / "resident").resolve())
    if debug.get("resident_package_path") != expected:
        raise ServerFailed(f"{arm.name}: its resident package came from "
                           f"{debug.get('resident_package_path')}, not its tree {expected}",
                           log_tail)
    found = debug.get("weights_fingerprint")
    if fingerprint is not None and found != fingerprint:
        raise ServerFailed(f"{arm.name}: weights fingerprint {found} differs from "
                           f"{fingerprint} of the first arm measured", log_tail)
    return fingerprint if fingerprint is not None else found
