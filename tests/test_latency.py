"""The engine core's request latency histograms (engine/latency.py), in process on the tiny
model, and their Prometheus exposition."""

from __future__ import annotations

import time

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from resident.config import EngineConfig
from resident.engine.engine import build_engine
from resident.engine.latency import BOUNDS_S, Histogram
from resident.engine.types import EngineRequest, SamplingParams
from resident.model.config import load_model_config
from resident.server.metrics import EngineCollector

from model_driver import run_engine

TINY = load_model_config("tiny")


def test_a_value_on_a_bound_falls_in_that_bounds_bucket():
    histogram = Histogram()
    for value in (BOUNDS_S[0], BOUNDS_S[0] * 1.01, 0.0, BOUNDS_S[-1] * 2):
        histogram.observe(value)
    assert histogram.counts[0] == 2  # 0 and the first bound itself (Prometheus' `le`)
    assert histogram.counts[1] == 1
    assert histogram.counts[-1] == 1  # above every bound: +Inf only
    assert histogram.total == pytest.approx(BOUNDS_S[0] * 2.01 + BOUNDS_S[-1] * 2)


def test_a_histogram_has_a_count_for_each_of_its_own_bounds_and_one_above():
    histogram = Histogram((1.0, 2.0))
    for value in (0.5, 2.0, 3.0):
        histogram.observe(value)
    assert histogram.counts == [1, 1, 1]


def _prompts(count: int, length: int = 12) -> list[list[int]]:
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(0, TINY.vocab_size, (length,), generator=generator).tolist()
            for _ in range(count)]


def test_each_request_is_timed_once_and_the_parts_add_up():
    engine = build_engine(TINY, EngineConfig(), "cpu")
    lengths = [1, 3, 6, 9]  # max_tokens; the first has no time per output token
    requests = {f"r{i}": (prompt, n) for i, (prompt, n) in enumerate(
        zip(_prompts(len(lengths)), lengths, strict=True))}
    run_engine(engine, requests)
    latency = engine.stats()["latency"]
    counts = {name: sum(histogram["counts"]) for name, histogram in latency.items()}
    assert counts == {"queue": 4, "prefill": 4, "ttft": 4, "e2e": 4, "tpot": 3}
    sums = {name: histogram["sum"] for name, histogram in latency.items()}
    assert sums["queue"] + sums["prefill"] == pytest.approx(sums["ttft"])
    assert 0 < sums["ttft"] < sums["e2e"]
    assert sums["tpot"] > 0


def test_a_request_waiting_for_a_slot_is_timed_in_the_queue():
    """With one sequence at a time the second request waits for the first to release its
    slot, after the step that samples the first's last token: its queue time is the first's
    end to end less about a step (past half of its decode, whatever the machine's load)."""
    engine = build_engine(TINY, EngineConfig(max_num_seqs=1), "cpu")
    first, second = _prompts(2)
    for rid, prompt in (("a", first), ("b", second)):
        engine.add_request(EngineRequest(rid, prompt, SamplingParams(max_tokens=8,
                                                                     ignore_eos=True)))
    ended = {}
    while engine.has_work():
        for output in engine.step():
            if output.finished:
                ended[output.request_id] = engine.stats()["latency"]
    queue = engine.stats()["latency"]["queue"]
    assert sum(queue["counts"]) == 2
    first_ttft, first_e2e = ended["a"]["ttft"]["sum"], ended["a"]["e2e"]["sum"]
    assert (first_ttft + first_e2e) / 2 < queue["sum"] < first_e2e


def test_a_request_stamped_on_arrival_is_timed_from_that_stamp():
    """The API stamps a request's arrival (EngineRequest.arrived_s, the host's monotonic
    clock): its queue time counts from there, not from the core's intake."""
    engine = build_engine(TINY, EngineConfig(), "cpu")
    prompt, = _prompts(1)
    early = time.monotonic() - 0.5
    engine.add_request(EngineRequest("a", prompt, SamplingParams(max_tokens=2), early))
    while engine.has_work():
        engine.step()
    latency = engine.stats()["latency"]
    assert latency["queue"]["sum"] >= 0.5
    assert latency["ttft"]["sum"] == pytest.approx(latency["queue"]["sum"]
                                                   + latency["prefill"]["sum"])


def test_an_aborted_request_has_a_first_token_and_no_end():
    engine = build_engine(TINY, EngineConfig(), "cpu")
    prompt, = _prompts(1)
    engine.add_request(EngineRequest("a", prompt, SamplingParams(max_tokens=50,
                                                                 ignore_eos=True)))
    while not any(output.new_token_ids for output in engine.step()):
        pass
    engine.abort("a")
    while engine.has_work():
        engine.step()
    latency = engine.stats()["latency"]
    assert sum(latency["ttft"]["counts"]) == 1
    assert sum(latency["e2e"]["counts"]) == sum(latency["tpot"]["counts"]) == 0


def test_the_histograms_are_exposed_with_cumulative_buckets():
    engine = build_engine(TINY, EngineConfig(), "cpu")
    run_engine(engine, {f"r{i}": (p, 4) for i, p in enumerate(_prompts(3))})
    collector = EngineCollector()
    collector.stats = engine.stats()
    registry = CollectorRegistry()
    registry.register(collector)
    families = {f.name: f for f in text_string_to_metric_families(
        generate_latest(registry).decode())}
    ttft = families["resident_time_to_first_token_seconds"]
    assert ttft.type == "histogram"
    samples = {(s.name, s.labels.get("le")): s.value for s in ttft.samples}
    buckets = [samples[("resident_time_to_first_token_seconds_bucket", le)]
               for le in [repr(b) for b in BOUNDS_S] + ["+Inf"]]
    assert buckets == sorted(buckets) and buckets[-1] == 3
    assert samples[("resident_time_to_first_token_seconds_count", None)] == 3
    assert samples[("resident_time_to_first_token_seconds_sum", None)] == pytest.approx(
        engine.stats()["latency"]["ttft"]["sum"])
    for name in ("resident_request_queue_seconds", "resident_request_prefill_seconds",
                 "resident_e2e_request_latency_seconds",
                 "resident_time_per_output_token_seconds"):
        assert families[name].type == "histogram"


def test_the_gates_core_latency_names_are_the_servers():
    """The gate reads the server's TTFT parts from /metrics by name, as a client of any tree's
    server (it imports no server code): its names are the ones the server exposes."""
    from gate.run.server import CORE_LATENCIES
    from resident.server.metrics import LATENCY_METRICS

    assert {key: LATENCY_METRICS[key][0] for key in CORE_LATENCIES} == CORE_LATENCIES
