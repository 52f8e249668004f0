"""The prefix cache on the tiny model in float64: greedy tokens with the cache on (first pass,
then the same prompts again, now hits) equal the cache off, under KV and slot pressure, with
the row check finding nothing; a hit's restored GDN state equals a fresh prefill's; a planted
wrong snapshot offset is caught; eviction under pressure; everything returns."""

from __future__ import annotations

import pytest
import torch

from resident.config import EngineConfig
from resident.engine.engine import Engine, build_engine
from resident.engine.prefix import PrefixHit
from resident.model.config import load_model_config
from resident.resources.page_cache import page_keys

from model_driver import ModelDriver, run_engine

TINY = load_model_config("tiny")
PAGE = 16


def make_engine(**knobs) -> Engine:
    return build_engine(TINY, EngineConfig(dtype="float64", **knobs), "cpu")


def cached_engine(**knobs) -> Engine:
    return make_engine(prefix_cache="on", prefix_snapshot_interval=2, **knobs)


def _tokens(generator: torch.Generator, count: int) -> list[int]:
    return torch.randint(0, TINY.vocab_size, (count,), generator=generator).tolist()


def shared_prompts() -> dict[str, tuple[list[int], int]]:
    """Prompts that share nothing, one page, several pages, a partial page, or all of another
    prompt (a repeat), each with its own tail; max_tokens vary so rows leave out of order."""
    generator = torch.Generator().manual_seed(3)
    shared = _tokens(generator, 5 * PAGE + 7)
    shares = [0, PAGE, 3 * PAGE, PAGE + 9, 5 * PAGE + 7, 2 * PAGE, 4 * PAGE, 0]
    requests = {}
    for i, share in enumerate(shares):
        tail = _tokens(generator, 3 + 5 * i)
        requests[f"r{i}"] = (shared[:share] + tail, 3 + i % 4)
    requests["same"] = (shared[:4 * PAGE], 4)  # page aligned: a repeat restores 3 pages
    return requests


def both_passes(engine: Engine, requests, concurrency: int | None = None):
    first = run_engine(engine, requests, concurrency=concurrency)
    again = run_engine(engine, {f"{rid}+": value for rid, value in requests.items()},
                       concurrency=concurrency)
    return first, {rid[:-1]: tokens for rid, tokens in again.items()}


def assert_all_returned(engine: Engine) -> None:
    """Every page and slot is free again (idle cached pages count as free), no page is
    held, and the snapshots stay within their pool."""
    assert engine.kv.num_free == engine.kv.num_pages - 1
    assert engine.states.num_free == engine.states.num_slots - 1
    assert not engine.kv.cache.refs and not engine.kv.streams
    assert engine.prefixes.index.num_used <= engine.config.prefix_snapshots
    assert not engine.prefixes._keys


@pytest.fixture(scope="module")
def expected():
    requests = shared_prompts()
    return requests, run_engine(make_engine(), requests)


@pytest.mark.parametrize("tail", ["off", "on"])
@pytest.mark.parametrize("concurrency", [None, 1])
def test_greedy_tokens_equal_the_cache_off_on_both_passes(expected, concurrency, tail):
    requests, off = expected
    engine = cached_engine(row_check="on", prefix_snapshot_tail=tail)
    first, again = both_passes(engine, requests, concurrency)
    assert first == off and again == off
    stats = engine.stats()
    # the second pass hits on every prompt with a full page before its last token
    assert stats["prefix_hits"] >= 7 and stats["prefix_cached_tokens"] >= 7 * PAGE
    assert engine.rowcheck_counts()["mismatches"] == 0
    assert engine.rowcheck_counts()["steps"] > 0
    assert_all_returned(engine)


def test_under_kv_pressure_offloads_evict_and_tokens_hold(expected):
    requests, off = expected
    engine = cached_engine(num_kv_pages=14, prefill_token_budget=32, row_check="on")
    first, again = both_passes(engine, requests)
    assert first == off and again == off
    assert engine.scheduler.num_offloads > 0
    assert engine.scheduler.num_reloads == engine.scheduler.num_offloads
    assert engine.kv.cache.num_evicted > 0  # idle cached pages gave way
    assert engine.rowcheck_counts()["mismatches"] == 0
    assert_all_returned(engine)


def test_under_slot_pressure_the_row_check_finds_nothing(expected):
    requests, off = expected
    engine = cached_engine(decode_buckets=(1, 2), decode_order="turns", row_check="on")
    first, again = both_passes(engine, requests)
    assert first == off and again == off
    counts = engine.rowcheck_counts()
    assert counts["displaced"] > 0 and counts["mismatches"] == 0
    assert_all_returned(engine)


def test_a_full_snapshot_pool_replaces_the_least_recently_used(expected):
    requests, off = expected
    engine = cached_engine(prefix_snapshots=2)
    first, again = both_passes(engine, requests, concurrency=2)
    assert first == off and again == off
    stats = engine.stats()
    assert stats["prefix_snapshots_evicted"] > 0 and stats["prefix_snapshots_used"] == 2
    assert_all_returned(engine)


def _fresh_state(engine: Engine, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The GDN state after a fresh prefill of `prompt` by the model alone."""
    driver = ModelDriver(engine.model)
    driver.step({"a": prompt})
    slot = driver.seqs["a"].slot
    return driver.cache.conv[:, slot].clone(), driver.cache.recurrent[:, slot].clone()


def _restored_states(engine: Engine) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Records each hit's request prompt prefix and its slot's state right after restore."""
    restored = []
    restore = engine.prefixes.restore

    def recording(request, hit: PrefixHit) -> None:
        restore(request, hit)
        slot = engine.states.slots[request.request_id]
        restored.append((request.prompt_ids[:hit.num_tokens],
                         engine.cache.conv[:, slot].clone(),
                         engine.cache.recurrent[:, slot].clone()))

    engine.prefixes.restore = recording
    return restored


def _max_state_error(engine: Engine, restored) -> float:
    error = 0.0
    for prefix, conv, recurrent in restored:
        fresh_conv, fresh_recurrent = _fresh_state(engine, prefix)
        error = max(error, (conv - fresh_conv).abs().max().item(),
                    (recurrent - fresh_recurrent).abs().max().item())
    return error


def test_a_hits_restored_state_equals_a_fresh_prefill(expected):
    requests, _ = expected
    engine = cached_engine()
    run_engine(engine, requests)
    restored = _restored_states(engine)
    run_engine(engine, {f"{rid}+": value for rid, value in requests.items()})
    assert len(restored) >= 7
    assert _max_state_error(engine, restored) < 1e-12


def test_a_planted_wrong_snapshot_offset_is_caught(expected):
    """A hit that resumes one page before where its snapshot was taken: the state check and
    the tokens both see it."""
    requests, off = expected
    engine = cached_engine()
    run_engine(engine, requests)
    match = engine.prefixes.match

    def one_page_short(request):
        hit = match(request)
        if hit is None or len(hit.pages) < 2:
            return hit
        return PrefixHit(hit.num_tokens - PAGE, hit.pages[:-1], hit.snapshot)

    engine.prefixes.match = one_page_short
    restored = _restored_states(engine)
    again = run_engine(engine, {f"{rid}+": value for rid, value in requests.items()})
    assert restored and _max_state_error(engine, restored) > 1e-6
    assert {rid[:-1]: tokens for rid, tokens in again.items()} != off


@pytest.mark.parametrize(("tail", "prefill_steps", "restored"),
                         [("off", 2, 2 * PAGE), ("on", 3, 3 * PAGE)])
def test_the_tail_point_costs_a_step_and_deepens_a_repeats_hit(tail, prefill_steps, restored):
    """A 3-page-and-5-token prompt, snapshots every 2 pages: its prefill ends a chunk at 2 pages,
    and with the tail point also at 3 (its last page boundary), one more step; a repeat of it
    restores as deep as the last snapshot, and the tokens are the cache off's either way."""
    prompt = _tokens(torch.Generator().manual_seed(11), 3 * PAGE + 5)
    off = run_engine(make_engine(), {"p": (prompt, 4)})
    engine = cached_engine(prefix_snapshot_tail=tail)
    first = run_engine(engine, {"p": (prompt, 1)})
    assert engine.stats()["steps"].get("prefill", 0) == prefill_steps
    again = run_engine(engine, {"p+": (prompt, 4)})
    assert engine.stats()["prefix_cached_tokens"] == restored
    assert first["p"] == off["p"][:1] and again["p+"] == off["p"]
    assert_all_returned(engine)


def test_a_long_fresh_prompt_is_cut_once_a_chunk():
    """250 tokens, a snapshot point every 2 pages (32 tokens), a 128-token budget: each chunk
    ends at the furthest point it reaches (128, then 224), so the prefill takes 3 steps (2
    with the cache off), not one a point it passes (8); a repeat restores 224 tokens."""
    prompt = _tokens(torch.Generator().manual_seed(12), 250)
    off_engine = make_engine(prefill_token_budget=128)
    off = run_engine(off_engine, {"p": (prompt, 3)})
    assert off_engine.stats()["steps"]["prefill"] == 2
    engine = cached_engine(prefill_token_budget=128)
    first = run_engine(engine, {"p": (prompt, 3)})
    assert engine.stats()["steps"]["prefill"] == 3
    again = run_engine(engine, {"p+": (prompt, 3)})
    assert engine.stats()["prefix_cached_tokens"] == 224
    assert first["p"] == off["p"] and again["p+"] == off["p"]
    assert_all_returned(engine)


def test_page_keys_chain_their_parents():
    first = page_keys(list(range(40)), PAGE)
    assert len(first) == 2  # the partial third page has no key
    other = page_keys([1] + list(range(1, 40)), PAGE)
    assert first[0] != other[0] and first[1] != other[1]  # page 1 differs through its parent
    assert page_keys(list(range(32)) + [7] * 8, PAGE) == first


@pytest.mark.parametrize("knobs", [{"prefix_cache": "yes"}, {"prefix_snapshots": 0},
                                   {"prefix_snapshot_tail": "1"},
                                   {"prefix_snapshot_interval": 0}])
def test_bad_prefix_knobs_fail_naming_the_knob(knobs):
    with pytest.raises(ValueError, match=next(iter(knobs))):
        EngineConfig(**knobs)
