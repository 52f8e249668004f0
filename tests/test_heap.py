"""GcPauses: the garbage collector's collections and pauses by generation, while entered; the
young generation's threshold an engine core sets."""

from __future__ import annotations

import gc

import pytest

from resident.config import EngineConfig
from resident.heap import GENERATIONS, GcPauses, set_young_threshold


def test_gc_pauses_count_each_collection_by_generation_and_only_while_entered():
    with GcPauses() as pauses:
        gc.collect(2)
        gc.collect(0)
    assert pauses.collections[2] >= 1 and pauses.collections[0] >= 1
    assert pauses.seconds_by_generation[2] > 0
    assert pauses.seconds == sum(pauses.seconds_by_generation[g] for g in GENERATIONS)
    counted = dict(pauses.collections)
    gc.collect()
    assert pauses.collections == counted  # its callback is gone
    assert all(callback.__self__ is not pauses for callback in gc.callbacks
               if hasattr(callback, "__self__"))


def test_an_engines_stats_and_metrics_carry_the_cores_collections():
    """engine.gc_pauses (the core sets it): stats and /metrics count a collection by its
    generation; an engine without the record reports none."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from resident.engine.engine import build_engine
    from resident.model.config import load_model_config
    from resident.server.metrics import EngineCollector

    engine = build_engine(load_model_config("tiny"), EngineConfig(), "cpu")
    assert engine.stats()["gc_collections"] == {}
    engine.gc_pauses = GcPauses().start()
    try:
        gc.collect(2)
        stats = engine.stats()
    finally:
        engine.gc_pauses.stop()
    assert stats["gc_collections"]["2"] >= 1 and stats["gc_pause_seconds"]["2"] > 0
    collector = EngineCollector()
    collector.stats = stats
    registry = CollectorRegistry()
    registry.register(collector)
    families = {f.name: f for f in text_string_to_metric_families(
        generate_latest(registry).decode())}
    samples = {s.labels["kind"]: s.value for s in families["resident_gc_collections"].samples}
    assert set(samples) == {"0", "1", "2"} and samples["2"] == stats["gc_collections"]["2"]
    assert families["resident_gc_pause_seconds"].type == "counter"


def test_a_raised_young_threshold_leaves_a_steps_churn_uncollected():
    """At gc_young_threshold's default a loop that holds 1,500 short-lived containers at a
    time (about two c=256 steps' worth) runs no young collection, where Python's 700 runs one
    every pass; the older generations keep their thresholds; 0 (no collection at all) is
    refused."""
    saved = gc.get_threshold()

    def young_collections_over_churn() -> int:
        gc.collect()
        with GcPauses() as pauses:
            for _ in range(50):
                held = [[i] for i in range(1500)]
                del held
        return pauses.collections[0]

    try:
        set_young_threshold(700)
        assert young_collections_over_churn() >= 40
        set_young_threshold(EngineConfig().gc_young_threshold)
        assert gc.get_threshold() == (20_000, *saved[1:])
        assert young_collections_over_churn() == 0
    finally:
        gc.set_threshold(*saved)
    with pytest.raises(ValueError, match="gc_young_threshold: must be >= 1, got 0"):
        EngineConfig(gc_young_threshold=0)
