"""Padded prefill and mixed steps on CPU (float64): the buckets, the packing of rows of mixed
lengths into a bucket, and the padding, which must never touch a real row's KV pages, conv window
or GDN state. The references run every kernel; under `triton` (interpreted) the Triton varlen
attention, the varlen conv and the GDN decode kernel run (fla's chunked part has no CPU path:
its chunk table is checked against an independent count here, and the kernel on the GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from resident.config import EngineConfig
from resident.engine.engine import build_engine
from resident.engine.scheduler import StepPlan
from resident.engine.types import EngineRequest, SamplingParams
from resident.engine.varlen import PaddedBucket
from resident.model.config import load_model_config
from resident.model.step import chunk_table

from model_driver import run_engine

TINY = load_model_config("tiny")


def test_buckets_resolve_by_device_budget_and_decode_rows():
    assert EngineConfig().resolve(TINY, "cpu").prefill_buckets == ()
    cuda = EngineConfig(prefill_token_budget=512).resolve(TINY, "cuda")
    # powers of two from 128, then the largest step: the budget and a decode row per bucket row
    assert (cuda.padded_prefill, cuda.prefill_buckets) == ("on", (128, 256, 512, 768))
    assert EngineConfig(padded_prefill="off").resolve(TINY, "cuda").prefill_buckets == ()
    given = EngineConfig(padded_prefill="on", prefill_buckets=(8, 32, 4096),
                         prefill_token_budget=64, decode_buckets=(1, 2))
    assert given.resolve(TINY, "cpu").prefill_buckets == (8, 32, 66)
    buckets = PaddedBucket.all_of(given.resolve(TINY, "cpu"))
    # each size twice, for prefill steps (no decode rows) then mixed ones; a prefill row per
    # 32 tokens, and max_prefill_rows (16) in the largest
    assert [(b.index, b.tokens, b.decode_rows, b.prefill_rows) for b in buckets] == [
        (0, 8, 0, 1), (1, 8, 2, 1), (2, 32, 0, 1), (3, 32, 2, 1), (4, 66, 0, 16),
        (5, 66, 2, 16)]
    assert buckets[3].rows == 3 and buckets[3].logits_rows == 3 and buckets[3].chunks == 0 + 1 + 2
    # mixed steps get room for a sixteenth, a quarter and all of the decode rows
    wide = PaddedBucket.all_of(EngineConfig(prefill_token_budget=2048).resolve(TINY, "cuda"))
    assert [b.decode_rows for b in wide if b.tokens == 2048] == [0, 16, 64, 256]
    assert [b.decode_rows for b in wide if b.tokens == 128] == [0, 8, 32, 128]


def test_a_step_takes_the_smallest_bucket_that_holds_its_tokens_and_rows():
    varlen = _engine("on").inputs.varlen  # buckets of 4, 8, 16 and 20 tokens
    assert varlen.bucket_for(4, 0, 1).tokens == 4
    assert varlen.bucket_for(4, 2, 1).decode_rows == 4  # a mixed one of the same size
    assert varlen.bucket_for(4, 1, 1).decode_rows == 1  # the mixed one a quarter as wide
    assert varlen.bucket_for(5, 0, 1).tokens == 8
    many = varlen.bucket_for(16, 0, 3)  # 3 prefill rows: no bucket below 20 tokens holds them
    assert (many.tokens, many.prefill_rows) == (20, 3)


@pytest.mark.parametrize("buckets", [(64, 32), (0, 8), (8, 8)])
def test_bad_prefill_buckets_fail_naming_the_knob(buckets):
    with pytest.raises(ValueError, match="knob prefill_buckets: must be increasing"):
        EngineConfig(prefill_buckets=buckets)


def test_the_chunk_table_lists_every_chunk_of_every_sequence_then_inert_entries():
    cu = np.array([0, 3, 3, 70, 200, 201, 201])  # lengths 3, 0, 67, 130, 1, 0 (padding)
    table, offsets = np.full((12, 2), -7), np.full(7, -7)
    assert chunk_table(cu, table, offsets, 4 * 16) == 1 + 0 + 2 + 3 + 1
    want = [(seq, chunk) for seq, length in enumerate(np.diff(cu))
            for chunk in range(-(-int(length) // 64))]
    assert [tuple(row) for row in table[:7]] == want
    # the rest name a chunk past any sequence's end, which the kernels mask out
    assert all(tuple(row) == (0, 12) for row in table[7:])
    # each sequence's first chunk in the table (a zero-length one's is its successor's), then
    # the real chunks: where the state pass writes each chunk's state for the output kernel
    assert offsets.tolist() == [0, 1, 1, 3, 6, 7, 7]
    assert all(table[offsets[seq] + chunk][0] == seq for seq, chunk in want)
    with pytest.raises(ValueError, match="8 chunks exceed the table's 7"):
        chunk_table(np.array([0, 512]), np.zeros((7, 2), np.int64), np.zeros(2, np.int64), 64)


def _requests(count: int, seed: int) -> dict[str, tuple[list[int], int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 40, (count,), generator=generator).tolist()
    return {f"r{i}": (torch.randint(0, TINY.vocab_size, (n,), generator=generator).tolist(),
                      3 + i % 5) for i, n in enumerate(lengths)}


def _engine(padded: str, backend: str = "torch", **knobs):
    config = EngineConfig(dtype="float64", attention_backend=backend, decode_buckets=(1, 2, 4),
                          max_num_seqs=6, padded_prefill=padded, prefill_token_budget=16,
                          prefill_buckets=(4, 8, 16), max_prefill_rows=3, **knobs)
    return build_engine(TINY, config, "cpu")


@pytest.mark.parametrize(("backend", "varlen_splits", "planning"), [
    ("torch", "off", "off"), ("torch", "off", "auto"), ("triton", "off", "off"),
    ("triton", "off", "auto"), ("triton", "auto", "off")])
def test_padded_steps_give_the_eager_tokens(backend, varlen_splits, planning):
    """Prefill and mixed steps through every bucket, decode rows riding along, chunked prompts,
    several prefill rows a step: padded against eager, token for token (the row check on
    where planning is resident, which rewrites the rows the padded steps moved). The Triton
    attention also with its keys split (these buckets' grids take 2-3 splits as the
    interpreter's stand-in SMs count them)."""
    requests = _requests(10, seed=7)
    eager = run_engine(_engine("off", resident_planning=planning), requests)
    engine = _engine("on", backend, resident_planning=planning, varlen_splits=varlen_splits,
                     row_check="on" if planning == "auto" else "off")
    assert run_engine(engine, requests) == eager
    steps = engine.stats()["steps"]
    assert steps["mixed"] > 0 and steps["prefill"] > 0
    assert engine.runner.num_padded_prefills == steps["mixed"] + steps["prefill"]
    assert engine.rowcheck_counts()["mismatches"] == 0
    assert engine.kv.num_used == 0 and engine.states.num_used == 0


def _staged_step(engine, plan: StepPlan):
    """Runs one padded step of `plan` eagerly and returns its logits."""
    staged = engine.inputs.varlen.stage(plan)
    assert staged.bucket is not None
    return engine.runner.plan_varlen(plan, staged)()


def test_padding_touches_no_real_rows_pages_window_or_state():
    """One mixed step (two decode rows, two prefill chunks) padded to a bucket twice its
    tokens, with garbage already in the sink: every page outside the rows' own and the sink,
    and every state slot outside theirs and the sink, is left bit for bit; the rows' outputs
    match the same step run eager."""
    padded, eager = _engine("on"), _engine("off")
    for engine in (padded, eager):
        for rid, (prompt, _) in {"a": ([5, 9, 11], 0), "b": ([7, 2], 0)}.items():
            engine.add_request(EngineRequest(rid, prompt, SamplingParams(max_tokens=8)))
        while engine.scheduler.waiting or any(r.is_prefilling for r in engine.requests.values()):
            engine.step()
        for rid, length in (("c", 6), ("d", 2)):
            engine.add_request(EngineRequest(rid, list(range(1, length + 1)),
                                             SamplingParams(max_tokens=8)))
    cache = padded.cache
    cache.kv[:, 0] = 1e6  # the sink page and slot: padding writes there, reads nothing real
    cache.conv[:, 0], cache.recurrent[:, 0] = 1e6, 1e6
    plans = [engine.scheduler.schedule() for engine in (padded, eager)]
    assert [(row.request.request_id, row.num_new) for row in plans[0].rows] == [
        ("a", 1), ("b", 1), ("c", 6), ("d", 2)]
    assert plans[0].num_decode_rows == 2
    assert padded.inputs.varlen.bucket_for(10, 2, 2).tokens == 20
    rows = [row.request.request_id for row in plans[0].rows]
    pages = {page for rid in rows for page in padded.kv.streams[rid].pages}
    slots = {padded.states.slots[rid] for rid in rows}
    before = {name: getattr(cache, name).clone() for name in ("kv", "conv", "recurrent")}
    got = _staged_step(padded, plans[0])
    want = eager.runner.plan_varlen(plans[1], eager.inputs.varlen.stage(plans[1]))()
    # float64: other GEMM shapes and the split GDN round differently, in the last bits only
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    others = sorted(set(range(cache.kv.shape[1])) - pages - {0})
    assert torch.equal(cache.kv[:, others], before["kv"][:, others])
    other_slots = sorted(set(range(cache.conv.shape[1])) - slots - {0})
    for name in ("conv", "recurrent"):
        assert torch.equal(getattr(cache, name)[:, other_slots], before[name][:, other_slots])
    # the rows' own state equals the eager step's
    eager_slots = [eager.states.slots[rid] for rid in rows]
    padded_slots = [padded.states.slots[rid] for rid in rows]
    torch.testing.assert_close(cache.recurrent[:, padded_slots],
                               eager.cache.recurrent[:, eager_slots], atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(cache.conv[:, padded_slots], eager.cache.conv[:, eager_slots],
                               atol=1e-10, rtol=1e-10)


def test_a_step_of_only_padding_rows_is_what_a_capture_runs():
    """A bucket staged all padding (a graph's capture) runs and changes no real page or slot."""
    engine = _engine("on")
    engine.add_request(EngineRequest("a", [3, 4, 5], SamplingParams(max_tokens=4)))
    engine.step()
    kv, conv = engine.cache.kv.clone(), engine.cache.conv.clone()
    varlen = engine.inputs.varlen
    for bucket in varlen.buckets:
        varlen.stage_idle(bucket)
        logits = engine.runner.run_padded(bucket, 1)
        assert logits.shape == (bucket.logits_rows, TINY.vocab_size)
    assert torch.equal(engine.cache.kv[:, 1:], kv[:, 1:])
    assert torch.equal(engine.cache.conv[:, 1:], conv[:, 1:])


def test_a_step_past_the_largest_bucket_is_refused():
    varlen = _engine("on").inputs.varlen
    top = varlen.buckets[-1]
    assert varlen.bucket_for(top.tokens, top.decode_rows, 1) is top
    with pytest.raises(ValueError, match="fits no prefill bucket"):
        varlen.bucket_for(top.tokens + 1, 1, 1)
