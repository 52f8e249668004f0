"""The prefix cache on the tiny model in float64: greedy tokens with the cache on (a first pass,
then the same prompts again: the second pass snapshots where the first one's pages end, the
third hits) equal the cache off, under KV and slot pressure, with the row check finding
nothing; a hit's restored GDN state equals a fresh prefill's; a planted wrong snapshot offset is
caught; eviction under pressure; a prompt nobody shared is not cut; everything returns."""

from __future__ import annotations

import array
import hashlib

import pytest
import torch

from resident.config import EngineConfig
from resident.engine.engine import Engine, build_engine
from resident.engine.prefix import PrefixHit
from resident.model.config import load_model_config
from resident.resources.page_cache import page_keys, salted_root

from model_driver import ModelDriver, run_engine

TINY = load_model_config("tiny")
PAGE = 16


def make_engine(**knobs) -> Engine:
    return build_engine(TINY, EngineConfig(dtype="float64", **knobs), "cpu")


def cached_engine(**knobs) -> Engine:
    return make_engine(**{"prefix_cache": "on", "prefix_snapshot_interval": 2, **knobs})


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


def passes(engine: Engine, requests, concurrency: int | None = None,
           times: int = 3) -> list[dict[str, list[int]]]:
    """Each pass's tokens, the same prompts `times` times (request ids made unique)."""
    result = []
    for n in range(times):
        suffix = "+" * n
        tokens = run_engine(engine, {rid + suffix: value for rid, value in requests.items()},
                            concurrency=concurrency)
        result.append({rid: tokens[rid + suffix] for rid in requests})
    return result


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
    assert all(tokens == off for tokens in passes(engine, requests, concurrency))
    stats = engine.stats()
    # the last pass hits on every prompt with a full page before its last token
    assert stats["prefix_hits"] >= 7 and stats["prefix_cached_tokens"] >= 7 * PAGE
    assert engine.rowcheck_counts()["mismatches"] == 0
    assert engine.rowcheck_counts()["steps"] > 0
    assert_all_returned(engine)


def test_under_kv_pressure_offloads_evict_and_tokens_hold(expected):
    requests, off = expected
    engine = cached_engine(num_kv_pages=14, prefill_token_budget=32, row_check="on")
    assert all(tokens == off for tokens in passes(engine, requests))
    assert engine.scheduler.num_offloads > 0
    assert engine.scheduler.num_reloads == engine.scheduler.num_offloads
    assert engine.kv.cache.num_evicted > 0  # idle cached pages gave way
    assert engine.rowcheck_counts()["mismatches"] == 0
    assert_all_returned(engine)


def test_under_slot_pressure_the_row_check_finds_nothing(expected):
    requests, off = expected
    engine = cached_engine(decode_buckets=(1, 2), decode_order="turns", row_check="on")
    assert all(tokens == off for tokens in passes(engine, requests))
    counts = engine.rowcheck_counts()
    assert counts["displaced"] > 0 and counts["mismatches"] == 0
    assert_all_returned(engine)


def test_a_full_snapshot_pool_replaces_the_least_recently_used(expected):
    requests, off = expected
    engine = cached_engine(prefix_snapshots=2)
    assert all(tokens == off for tokens in passes(engine, requests, concurrency=2))
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
    passes(engine, requests, times=2)
    restored = _restored_states(engine)
    run_engine(engine, {f"{rid}+": value for rid, value in requests.items()})
    assert len(restored) >= 7
    assert _max_state_error(engine, restored) < 1e-12


def test_a_planted_wrong_snapshot_offset_is_caught(expected):
    """A hit that resumes one page before where its snapshot was taken: the state check and
    the tokens both see it."""
    requests, off = expected
    engine = cached_engine()
    passes(engine, requests, times=2)
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


def _pass_stats(engine: Engine, requests) -> tuple[list[list[int]], int, int]:
    """One pass of `requests` (in turn) on `engine`: its tokens, and the prefill steps it took
    and the prompt tokens it restored."""
    before = engine.stats()
    tokens = run_engine(engine, requests, concurrency=1)
    after = engine.stats()
    return (list(tokens.values()),
            after["steps"].get("prefill", 0) - before["steps"].get("prefill", 0),
            after["prefix_cached_tokens"] - before["prefix_cached_tokens"])


@pytest.mark.parametrize(("tail", "expected_passes"),
                         [("off", [(1, 0), (2, 0), (1, 3 * PAGE)]),
                          ("on", [(2, 0), (1, 3 * PAGE), (1, 3 * PAGE)])])
def test_a_repeat_is_cut_at_its_last_page_boundary(tail, expected_passes):
    """A 3-page-and-5-token prompt three times, a snapshot point every 2 pages: the first
    pass is not cut (1 prefill step), the second (a repeat: the first's pages are cached) is
    cut at its last page boundary (48) and snapshots there, the third restores 48 tokens. With
    the tail on every prompt is cut there, so the second pass restores. (prefill steps,
    restored tokens) a pass; the tokens are the cache off's in every pass."""
    prompt = _tokens(torch.Generator().manual_seed(11), 3 * PAGE + 5)
    off = run_engine(make_engine(), {"p": (prompt, 4)})["p"]
    engine = cached_engine(prefix_snapshot_tail=tail)
    measured = []
    for n in range(3):
        tokens, steps, restored = _pass_stats(engine, {f"p{n}": (prompt, 4)})
        assert tokens == [off]
        measured.append((steps, restored))
    assert measured == expected_passes
    assert_all_returned(engine)


def test_a_shared_prefix_is_snapshotted_where_the_prompts_branch():
    """Three prompts sharing 3 pages and 5 tokens, each with its own 20 tokens after: the
    first is not cut; the second is cut where the first's cached pages end (48, its branch
    point) and snapshots; the third restores 48 tokens in one step."""
    generator = torch.Generator().manual_seed(13)
    shared = _tokens(generator, 3 * PAGE + 5)
    prompts = [shared + _tokens(generator, 20) for _ in range(3)]
    off = run_engine(make_engine(), {f"p{n}": (prompt, 4) for n, prompt in enumerate(prompts)})
    engine = cached_engine(prefix_snapshot_interval=8)  # no interval point in these prompts
    measured = []
    for n, prompt in enumerate(prompts):
        tokens, steps, restored = _pass_stats(engine, {f"p{n}": (prompt, 4)})
        assert tokens == [off[f"p{n}"]]
        measured.append((steps, restored))
    assert measured == [(1, 0), (2, 0), (1, 3 * PAGE)]
    assert_all_returned(engine)


def test_a_long_fresh_prompt_is_not_cut():
    """250 tokens, a snapshot point every 2 pages (32 tokens), a 128-token budget: no one
    computed it before, so its prefill takes the cache off's 2 steps; its first chunk ends at
    128, a snapshot point, which snapshots for free. A repeat restores those 128 tokens and is
    cut at its last page boundary (240); the next restores 240. (prefill steps, restored
    tokens) a pass."""
    prompt = _tokens(torch.Generator().manual_seed(12), 250)
    off_engine = make_engine(prefill_token_budget=128)
    off = run_engine(off_engine, {"p": (prompt, 3)})["p"]
    assert off_engine.stats()["steps"]["prefill"] == 2
    engine = cached_engine(prefill_token_budget=128)
    measured = []
    for n in range(3):
        tokens, steps, restored = _pass_stats(engine, {f"p{n}": (prompt, 3)})
        assert tokens == [off]
        measured.append((steps, restored))
    assert measured == [(2, 0), (2, 128), (1, 240)]
    assert_all_returned(engine)


def test_page_keys_chain_their_parents():
    first = page_keys(list(range(40)), PAGE)
    assert len(first) == 2  # the partial third page has no key
    other = page_keys([1] + list(range(1, 40)), PAGE)
    assert first[0] != other[0] and first[1] != other[1]  # page 1 differs through its parent
    assert page_keys(list(range(32)) + [7] * 8, PAGE) == first


def test_page_keys_are_sha256_over_the_parent_and_the_ids():
    """A collision-resistant key (Python's tuple hash let a crafted prompt take another's
    cached prefix): page j's key is SHA-256 of page j-1's key and its ids as int64."""
    ids = list(range(1000, 1040))
    first = hashlib.sha256(array.array("q", ids[:PAGE]).tobytes()).digest()
    second = hashlib.sha256(first + array.array("q", ids[PAGE:2 * PAGE]).tobytes()).digest()
    assert page_keys(ids, PAGE) == [first, second]
    # a cache_salt's keys chain from a root of its own: no page of another salt, or of none
    salted = {salt: page_keys(ids, PAGE, salted_root(salt)) for salt in (None, "a", "b")}
    assert salted[None] == [first, second]
    assert not set(salted["a"]) & (set(salted["b"]) | set(salted[None]))


@pytest.mark.parametrize("knobs", [{"prefix_cache": "yes"}, {"prefix_snapshots": -1},
                                   {"prefix_snapshot_tail": "1"},
                                   {"prefix_snapshot_interval": 0},
                                   {"prefix_snapshot_gib": 0.0}])
def test_bad_prefix_knobs_fail_naming_the_knob(knobs):
    with pytest.raises(ValueError, match=next(iter(knobs))):
        EngineConfig(**knobs)


def test_the_snapshot_pool_is_sized_by_bytes_unless_counted():
    """prefix_snapshots=0 (the default) fills prefix_snapshot_gib, 64 snapshots at most: a
    27B snapshot (~150 MiB) fits 13 times in 2 GiB where a count of 64 would take 9.5 GiB;
    a count is kept as given; a budget that holds none fails naming its knob; the pool the
    engine allocates is the count times config.snapshot_bytes."""
    from resident.config import MAX_AUTO_SNAPSHOTS, snapshot_bytes

    big = load_model_config("qwen3.5-27b")
    resolved = EngineConfig().resolve(big, "cuda")
    assert resolved.prefix_snapshots == 2 * 2**30 // snapshot_bytes(big, "bfloat16") == 13
    assert EngineConfig(tensor_parallel=2).resolve(big, "cuda").prefix_snapshots == 27
    assert EngineConfig(prefix_snapshots=5).resolve(big, "cuda").prefix_snapshots == 5
    assert EngineConfig().resolve(TINY, "cpu").prefix_snapshots == MAX_AUTO_SNAPSHOTS
    with pytest.raises(ValueError, match="prefix_snapshot_gib"):
        EngineConfig(prefix_snapshot_gib=0.1).resolve(big, "cuda")
    engine = cached_engine(prefix_snapshots=3)
    assert engine.prefixes.snapshot_bytes == 3 * snapshot_bytes(TINY, "float64")
