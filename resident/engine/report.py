"""What an engine reports: its stats (GET /metrics, /debug/rowcheck) and its info
(/debug/config, /v1/models)."""

from __future__ import annotations

import os
import sys
from collections import Counter
from typing import Any, Protocol

import torch

from resident.backends import StepKernels
from resident.config import EngineConfig
from resident.engine.inputs import StepInputs
from resident.engine.latency import RequestLatency
from resident.engine.planning import StepPlanning
from resident.engine.prefix import NoPrefixCache
from resident.engine.runner import StepRunner
from resident.engine.scheduler import Scheduler
from resident.engine.startup import StartupTimes
from resident.heap import GcPauses
from resident.model.config import ModelConfig
from resident.provenance import describe
from resident.resources.kv import KVPool
from resident.resources.recurrent import StatePool


class Engine(Protocol):
    """What the reports read of an engine (engine.py: Engine). A protocol, so that engine.py
    imports this module and this module does not import engine.py."""

    config: EngineConfig
    model_config: ModelConfig
    device: torch.device
    scheduler: Scheduler
    kv: KVPool
    states: StatePool
    planning: StepPlanning
    runner: StepRunner
    inputs: StepInputs
    kernels: StepKernels
    counters: Counter[str]
    step_seconds: Counter[str]
    fingerprint: str
    startup: StartupTimes
    prefixes: NoPrefixCache
    latency: RequestLatency

STEP_KINDS = ("decode", "prefill", "mixed")


def engine_stats(engine: Engine) -> dict[str, Any]:
    """Counters and gauges for /metrics (server/metrics.py names them)."""
    scheduler = engine.scheduler
    return {
        "num_running": len(scheduler.running),
        "num_waiting": len(scheduler.waiting),
        "num_offloaded": len(scheduler.offloaded),
        "kv_pages_used": engine.kv.num_used,
        "kv_pages_free": engine.kv.num_free,
        "gdn_slots_used": engine.states.num_used,
        "gdn_slots_free": engine.states.num_free,
        "steps": {kind: engine.counters[f"steps_{kind}"] for kind in STEP_KINDS},
        "steps_launched_ahead": {kind: engine.counters[f"launched_ahead_{kind}"]
                                 for kind in STEP_KINDS},
        "step_seconds": {kind: engine.step_seconds[kind] for kind in STEP_KINDS},
        "prefills_padded": engine.runner.num_padded_prefills,
        "generated_tokens": engine.counters["generated_tokens"],
        "offloads": scheduler.num_offloads,
        "reloads": scheduler.num_reloads,
        "aborts": engine.counters["aborts"],
        "failed_requests": engine.counters["failed_requests"],
        "rows_after_finish": engine.counters["rows_after_finish"],
        "window_arrivals": engine.counters["window_arrivals"],
        "rowcheck": rowcheck_counts(engine),
        "latency": engine.latency.snapshot(),
        **prefix_stats(engine),
        **gc_stats(engine.gc_pauses),
    }


def gc_stats(pauses: GcPauses | None) -> dict[str, dict[str, float]]:
    """The collector's collections and pause seconds by generation (empty without a record)."""
    if pauses is None:
        return {"gc_collections": {}, "gc_pause_seconds": {}}
    return pauses.stats()


PREFIX_STATS = ("hits", "cached_tokens", "snapshots_taken", "snapshots_evicted",
                "snapshots_used", "pages_cached", "pages_idle", "pages_evicted")


def prefix_stats(engine: Engine) -> dict[str, int]:
    """The prefix cache's counters and gauges, `prefix_<name>` (all 0 while it is off)."""
    stats = engine.prefixes.stats() if engine.prefixes.enabled else {}
    return {f"prefix_{key}": stats.get(key, 0) for key in PREFIX_STATS}


def rowcheck_counts(engine: Engine) -> dict[str, int]:
    """/debug/rowcheck: the row check's steps, rows and mismatches (0 while off), the
    planner's displacements and slot releases, and the scheduler's offloads."""
    counts = engine.planning.counters()
    keys = ("steps", "rows", "mismatches", "displaced", "slot_releases",
            "offloads_without_slot", "slots_freed")
    return {"enabled": engine.config.row_check == "on" and engine.planning.mode == "resident",
            **{key: counts.get(key, 0) for key in keys},
            "offloads": engine.scheduler.num_offloads}


def engine_info(engine: Engine) -> dict[str, Any]:
    """What /debug/config and /v1/models report: the model, the resolved knobs, the planning
    mode and why, the captured buckets, the provenance of the code and weights."""
    planning = engine.planning
    default = EngineConfig().resolve(engine.model_config, engine.device.type)
    return {
        "model": engine.model_config.name,
        "max_model_len": engine.config.max_model_len,
        "vocab_size": engine.model_config.vocab_size,
        "eos_token_ids": list(engine.model_config.eos_token_ids),
        "knobs": engine.config.to_dict(),
        "knobs_changed": engine.config.changed_from(default),
        "planning_mode": planning.mode,
        "planning_reason": planning.reason,
        # the prefix cache's GDN snapshot pool on the device (0 while prefix_cache is off)
        "prefix_snapshot_bytes": engine.prefixes.snapshot_bytes,
        "attention_backend": engine.config.attention_backend,
        "cuda_graphs": engine.runner.graphs.buckets if engine.runner.graphs else [],
        # the decode buckets captured again with the draw after the forward (sampled steps)
        "drawing_graphs": (engine.runner.drawing_graphs.buckets
                           if engine.runner.drawing_graphs else []),
        # every decode step's logits, and a varlen step's for its draw (runner.logits_gpu)
        "logits_buffer_bytes": (engine.runner.logits_gpu.numel()
                                * engine.runner.logits_gpu.element_size()),
        "prefill_graphs": _padded_graphs(engine),
        # decode buckets whose attention reads pages and lengths on the device
        "host_plan_free": not engine.kernels.decode.host_plan,
        # the measured table the small buckets' projections follow (gemv_table), if any
        "gemv_table": engine.kernels.decode.gemv_table,
        "dtype": engine.config.dtype,
        "device": str(engine.device),
        **describe(),  # the package path, its commit, git_dirty, source_digest
        "weights_fingerprint": engine.fingerprint,
        "torch_version": str(torch.__version__),  # a str, not a TorchVersion (test_engine.py)
        "torch_num_threads": torch.get_num_threads(),
        "startup": engine.startup.to_dict(),  # seconds per span (startup.py)
        # where compiled kernels and autotuning results went (None: the library's default)
        "caches": {"inductor": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
                   "triton": os.environ.get("TRITON_CACHE_DIR"),
                   "bytecode": sys.pycache_prefix},
    }


def _padded_graphs(engine: Engine) -> list[dict[str, int]]:
    """The padded prefill buckets captured as graphs: tokens and row capacities."""
    graphs = engine.runner.prefill_graphs
    return [{"tokens": bucket.tokens, "decode_rows": bucket.decode_rows,
             "prefill_rows": bucket.prefill_rows}
            for bucket in engine.inputs.varlen.buckets if graphs and graphs.has(bucket.index)]
