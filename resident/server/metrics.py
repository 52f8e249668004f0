"""Prometheus exposition of the engine core's stats (`GET /metrics`)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)

from resident.server.validation import as_float

# stats key -> (metric name, kind, help). Counters get `_total` in the exposition.
_ENGINE_METRICS: dict[str, tuple[str, str, str]] = {
    "num_running": ("resident_requests_running", "gauge", "Requests being generated."),
    "num_waiting": ("resident_requests_waiting", "gauge", "Requests waiting to start."),
    "num_offloaded": ("resident_requests_offloaded", "gauge", "Requests offloaded to host."),
    "kv_pages_used": ("resident_kv_pages_used", "gauge", "KV cache pages in use."),
    "kv_pages_free": ("resident_kv_pages_free", "gauge", "KV cache pages free."),
    "gdn_slots_used": ("resident_gdn_slots_used", "gauge", "GDN state slots in use."),
    "gdn_slots_free": ("resident_gdn_slots_free", "gauge", "GDN state slots free."),
    "steps": ("resident_steps", "counter", "Engine steps by kind."),
    "steps_launched_ahead": ("resident_steps_launched_ahead", "counter",
                             "Steps launched before the step ahead of them was read back "
                             "(plan_ahead=launch), by kind."),
    "step_seconds": ("resident_step_seconds", "counter",
                     "Wall seconds of engine steps by kind, schedule to sampled tokens."),
    "prefills_padded": ("resident_prefills_padded", "counter",
                        "Prefill and mixed steps run padded to a prefill bucket."),
    "generated_tokens": ("resident_generated_tokens", "counter", "Tokens generated."),
    "offloads": ("resident_offloads", "counter", "Requests offloaded."),
    "reloads": ("resident_reloads", "counter", "Requests reloaded."),
    "aborts": ("resident_aborts", "counter", "Requests aborted."),
    "failed_requests": ("resident_failed_requests", "counter", "Requests that failed."),
    "prefix_hits": ("resident_prefix_cache_hits", "counter",
                    "Requests that started from a cached prefix (prefix_cache=on)."),
    "prefix_cached_tokens": ("resident_prefix_cache_saved_tokens", "counter",
                             "Prompt tokens restored from the prefix cache, not computed."),
    "prefix_snapshots_taken": ("resident_prefix_snapshots_taken", "counter",
                               "GDN state snapshots the prefix cache took."),
    "prefix_snapshots_evicted": ("resident_prefix_snapshots_evicted", "counter",
                                 "Snapshots replaced because the pool was full."),
    "prefix_snapshots_used": ("resident_prefix_snapshots_used", "gauge",
                              "GDN state snapshots held in the pool."),
    "prefix_pages_cached": ("resident_prefix_pages_cached", "gauge",
                            "KV pages cached by block hash (held or idle)."),
    "prefix_pages_idle": ("resident_prefix_pages_idle", "gauge",
                          "Cached KV pages no request holds (counted as free)."),
    "prefix_pages_evicted": ("resident_prefix_pages_evicted", "counter",
                             "Idle cached KV pages taken back under KV pressure."),
    "rows_after_finish": ("resident_rows_after_finish", "counter",
                          "Rows a step planned ahead ran for a request that finished or was "
                          "aborted meanwhile (released after that step)."),
    "window_arrivals": ("resident_window_arrivals", "counter",
                        "Requests late launch took into the step after the one running when "
                        "they arrived (late_launch=on)."),
    "gc_collections": ("resident_gc_collections", "counter",
                       "The engine core's garbage collections, by generation (kind)."),
    "gc_pause_seconds": ("resident_gc_pause_seconds", "counter",
                         "Seconds the engine core's garbage collector paused it (every row "
                         "of the step a pause falls in waits), by generation (kind)."),
}
# the core's request latency histograms (engine/latency.py), stats["latency"][key]
LATENCY_METRICS: dict[str, tuple[str, str]] = {
    "queue": ("resident_request_queue_seconds",
              "API arrival to admission (pages, a state slot, a first prompt row)."),
    "prefill": ("resident_request_prefill_seconds",
                "Admission to the first token leaving the engine core."),
    "ttft": ("resident_time_to_first_token_seconds",
             "API arrival to the first token leaving the engine core."),
    "e2e": ("resident_e2e_request_latency_seconds",
            "API arrival to the last token leaving the engine core (stop or length)."),
    "tpot": ("resident_time_per_output_token_seconds",
             "First to last token over the tokens between, a finished request."),
}
_METRIC_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_FAMILIES = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily,
             "unknown": UnknownMetricFamily}


def _latency_metrics(latency: dict[str, Any]) -> Iterator[Metric]:
    """stats["latency"]: {key: {"bounds", "counts" (per bucket, one past the bounds), "sum"}}
    as Prometheus histograms (cumulative `le` buckets ending in +Inf)."""
    for key, (name, doc) in LATENCY_METRICS.items():
        histogram = latency.get(key)
        if not isinstance(histogram, dict):
            continue
        bounds = [*(repr(float(b)) for b in histogram["bounds"]), "+Inf"]
        cumulative = list(itertools.accumulate(histogram["counts"]))
        yield HistogramMetricFamily(name, doc, buckets=list(zip(bounds, cumulative, strict=True)),
                                    sum_value=histogram["sum"])


def _stat_metric(key: str, value: Any) -> Metric | None:
    """One stat as a metric family; a dict becomes one sample per key, labelled `kind`.
    Stats without an entry in _ENGINE_METRICS are exposed untyped as `resident_<key>`."""
    name, kind, doc = _ENGINE_METRICS.get(key, (f"resident_{key}", "unknown", f"Engine {key}."))
    if not _METRIC_NAME.fullmatch(name):
        return None
    if isinstance(value, dict):
        family = _FAMILIES[kind](name, doc, labels=["kind"])
        for label, sample in value.items():
            if as_float(sample) is not None:
                family.add_metric([str(label)], sample)
        return family
    if as_float(value) is None:
        return None
    return _FAMILIES[kind](name, doc, value=value)


class EngineCollector:
    """Exposes the engine stats that the scrape handler fetched just before collecting."""

    def __init__(self) -> None:
        self.stats: dict[str, Any] = {}

    def collect(self) -> Iterator[Metric]:
        for key, value in self.stats.items():
            if key == "latency":
                yield from _latency_metrics(value)
                continue
            metric = _stat_metric(key, value)
            if metric is not None:
                yield metric
