"""The CUDA backends against the torch references, and the engine with CUDA graphs on and off.

Kernels at the 0.8B shapes (head_dim 256, 8 query heads over 2 kv heads; GDN 16 heads of
128 x 128, conv 6144 wide) and at odd ones, bf16 activations with fp32 GDN state:
  - FlashInfer fa2 decode (the `flashinfer` backend) and paged prefill (every backend's prefill);
  - the GDN prefill (our varlen conv, fla's chunk_gated_delta_rule) over varlen rows with
    slot-pool states, including rows that continue from a state (chunked prefill).
Then the engine at 0.8B: greedy outputs for 32 prompts at concurrency 1 are identical with
cuda_graphs on and off (decode buckets and padded prefill buckets), for each decode backend and
with resident planning off and auto. The padded steps' own kernels: tests/gpu/test_padded_gpu.py.
"""

from __future__ import annotations

import gc

import pytest
import torch

from resident.backends import PrefillStep, paged_layout
from resident.config import EngineConfig
from resident.engine.engine import Engine, build_engine
from resident.kernels.attention import paged_attention_ref
from resident.kernels.gdn import causal_conv_ref, gated_delta_rule_ref, l2norm
from resident.model.config import load_model_config
from resident.model.dense import gdn_gates
from resident.model.step import build_step_meta

from model_driver import run_engine

pytestmark = pytest.mark.gpu
DEVICE = torch.device("cuda")
PAGE = 16


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def _paged_rows(generator, starts: list[int], news: list[int], num_pages: int):
    """Rows of (start, new, pages, slot) with distinct random pages, slots 1..B."""
    order = torch.randperm(num_pages - 1, generator=generator).add(1).tolist()
    rows = []
    for index, (start, new) in enumerate(zip(starts, news, strict=True)):
        count = -(-(start + new) // PAGE)
        rows.append((start, new, order[:count], index + 1))
        order = order[count:]
    return rows


def _heads(num_heads, num_kv_heads, head_dim):
    from resident.backends.flashinfer import HeadShape
    return HeadShape(num_heads, num_kv_heads, head_dim, PAGE, torch.bfloat16)


SHAPES = [(8, 2, 256), (6, 3, 256), (8, 1, 256)]  # 0.8B (group 4), then groups 2 and 8


@pytest.mark.parametrize("heads", SHAPES)
@pytest.mark.parametrize("lengths", [[640], [1, 17, 640, 33, 300, 2047, 16]])
def test_flashinfer_decode_matches_reference(heads, lengths):
    from resident.backends.flashinfer import FlashInferDecode, flashinfer_workspace

    num_heads, num_kv_heads, head_dim = heads
    generator = torch.Generator().manual_seed(len(lengths) * head_dim)
    num_pages = sum(-(-n // PAGE) for n in lengths) + 8
    kv = torch.randn(num_pages, 2, PAGE, num_kv_heads, head_dim, generator=generator)
    kv = kv.to(DEVICE, torch.bfloat16)
    rows = _paged_rows(generator, [n - 1 for n in lengths], [1] * len(lengths), num_pages)
    meta = build_step_meta(rows, PAGE, DEVICE)
    query = torch.randn(len(lengths), num_heads, head_dim, generator=generator)
    query = query.to(DEVICE, torch.bfloat16)
    want = paged_attention_ref(query, kv, meta.block_tables, meta.token_seq, meta.positions,
                               head_dim**-0.5)

    bucket = len(lengths) + 1  # one padding row on the sink page
    decode = FlashInferDecode(_heads(*heads), flashinfer_workspace(DEVICE), (bucket,),
                              max_pages_per_row=128)
    layout = paged_layout([(pages, start + 1, 1) for start, _, pages, _ in rows], PAGE,
                          pad_to=bucket)
    decode.plan_decode(bucket, layout)
    padded = torch.cat([query, query[:1]])
    got = decode.ops(bucket).attention(padded, kv, None, head_dim**-0.5)[:len(lengths)]
    assert _rel_err(got, want) < 1e-2


def test_flashinfer_decode_plan_reuse_is_exact():
    """Steps whose page lists match the bucket's last plan skip the plan: their outputs equal a
    fresh plan's bit for bit, across steps that cross a page and steps that do not."""
    from resident.backends.flashinfer import FlashInferDecode, flashinfer_workspace
    from resident.backends.layout import PlanReuse

    generator = torch.Generator().manual_seed(11)
    num_heads, num_kv_heads, head_dim = SHAPES[0]
    bucket, starts = 4, [13, 30, 200]  # rows cross a page at different steps
    kv = torch.randn(64, 2, PAGE, num_kv_heads, head_dim, generator=generator)
    kv = kv.to(DEVICE, torch.bfloat16)
    pages = [list(range(1 + 16 * row, 17 + 16 * row)) for row in range(len(starts))]
    reusing, fresh = (FlashInferDecode(_heads(*SHAPES[0]), flashinfer_workspace(DEVICE),
                                       (bucket,), max_pages_per_row=16) for _ in range(2))
    for step in range(20):
        lengths = [start + step + 1 for start in starts]
        layout = paged_layout([(row_pages, n, 1) for row_pages, n in zip(pages, lengths,
                                                                          strict=True)],
                              PAGE, pad_to=bucket)
        query = torch.randn(bucket, num_heads, head_dim, generator=generator)
        query = query.to(DEVICE, torch.bfloat16)
        fresh.reuse = PlanReuse()  # forgets its last plan: plans every step
        outputs = []
        for decode in (reusing, fresh):
            decode.plan_decode(bucket, layout)
            outputs.append(decode.ops(bucket).attention(query, kv, None, head_dim**-0.5))
        assert torch.equal(outputs[0], outputs[1]), f"step {step}"
    assert reusing.num_plans_reused > 10 and fresh.num_plans_reused == 0


def test_flashinfer_decode_replan_does_not_sync():
    """A re-plan must not wait for the GPU: under plan_ahead the host plans the next step while
    the last one runs. FlashInfer's graph-mode plan() copies host page indices with a blocking
    copy (a stream sync, 208-545 µs a step outside the graph in
    results/2026-12-01-h200-0.8b-profile); the backend hands it device indices instead."""
    from resident.backends.flashinfer import FlashInferDecode, flashinfer_workspace

    bucket = 4
    decode = FlashInferDecode(_heads(*SHAPES[0]), flashinfer_workspace(DEVICE), (bucket,),
                              max_pages_per_row=16)
    layouts = [paged_layout([(list(range(1 + 16 * row, 17 + 16 * row)), 40 + shift, 1)
                             for row in range(3)], PAGE, pad_to=bucket) for shift in (0, 16)]
    decode.plan_decode(bucket, layouts[0])  # JIT and first plan outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        decode.plan_decode(bucket, layouts[1])  # a page more a row: a fresh plan
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert decode.num_plans_reused == 0


@pytest.mark.parametrize("heads", SHAPES)
def test_flashinfer_prefill_matches_reference(heads):
    from resident.backends.flashinfer import FlashInferPrefill, flashinfer_workspace

    num_heads, num_kv_heads, head_dim = heads
    generator = torch.Generator().manual_seed(head_dim)
    starts, news = [0, 0, 40, 511, 0], [37, 512, 25, 1, 1]  # fresh, chunked and decode rows
    num_pages = 128
    kv = torch.randn(num_pages, 2, PAGE, num_kv_heads, head_dim, generator=generator)
    kv = kv.to(DEVICE, torch.bfloat16)
    rows = _paged_rows(generator, starts, news, num_pages)
    meta = build_step_meta(rows, PAGE, DEVICE)
    query = torch.randn(sum(news), num_heads, head_dim, generator=generator)
    query = query.to(DEVICE, torch.bfloat16)
    want = paged_attention_ref(query, kv, meta.block_tables, meta.token_seq, meta.positions,
                               head_dim**-0.5)
    prefill = FlashInferPrefill(_heads(*heads), flashinfer_workspace(DEVICE))
    layout = paged_layout([(pages, start + new, new) for start, new, pages, _ in rows], PAGE)
    ops = prefill.ops(PrefillStep(meta.query_start_loc.cpu().numpy(), layout))
    got = ops.attention(query, kv, meta, head_dim**-0.5)
    assert _rel_err(got, want) < 1e-2


def _gdn_case(generator, starts, news, conv_dim=6144, heads=(16, 16), dims=(128, 128)):
    num_k_heads, num_v_heads = heads
    k_dim, v_dim = dims
    num_rows, num_tokens = len(news), sum(news)
    rows = _paged_rows(generator, starts, news, 256)
    meta = build_step_meta(rows, PAGE, DEVICE)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator) * scale).to(DEVICE)

    conv_pool = randn(num_rows + 2, conv_dim, 4, scale=0.5).bfloat16()
    state_pool = randn(num_rows + 2, num_v_heads, k_dim, v_dim, scale=0.1)
    for row, start in enumerate(starts):  # a fresh row starts from a zeroed slot
        if start == 0:
            conv_pool[row + 1].zero_()
            state_pool[row + 1].zero_()
    # a column slice, as the model's fused projection hands it over
    x = randn(num_tokens, conv_dim + 2048).bfloat16()[:, :conv_dim]
    weight = randn(conv_dim, 4, scale=0.5).bfloat16()
    # query and key l2-normed, as the varlen conv hands them over
    qkv = (l2norm(randn(num_tokens, num_k_heads, k_dim)).bfloat16(),
           l2norm(randn(num_tokens, num_k_heads, k_dim)).bfloat16(),
           randn(num_tokens, num_v_heads, v_dim).bfloat16())
    # the layer's raw gate projections a, b and its A_log, dt_bias (dense.gdn_gates)
    gates = (randn(num_tokens, num_v_heads).bfloat16(), randn(num_tokens, num_v_heads).bfloat16(),
             randn(num_v_heads, scale=0.5) - 1.0, randn(num_v_heads).bfloat16())
    return meta, conv_pool, state_pool, x, weight, qkv, gates


def test_gdn_prefill_matches_reference():
    from resident.backends.gdn_prefill import gdn_prefill_ops

    generator = torch.Generator().manual_seed(7)
    starts, news = [0, 0, 300, 17, 0], [200, 1, 70, 1, 513]
    meta, conv_pool, state_pool, x, weight, qkv, gates = _gdn_case(generator, starts, news)
    ops = gdn_prefill_ops(meta.query_start_loc.cpu().numpy(), DEVICE)
    ref_conv, ref_state = conv_pool.clone(), state_pool.clone()
    want_conv = causal_conv_ref(x, weight, ref_conv, meta.state_slots, meta.query_start_loc,
                                meta.max_query_len)
    # the 0.8B conv's query, key and value channels (_gdn_case's defaults), as three planes,
    # each 128-channel query and key head l2-normed
    query, key, value = ops.conv(x, weight, conv_pool, meta, (2048, 2048, 2048), 128)
    want_conv = torch.cat([*(l2norm(t.unflatten(-1, (16, 128))).flatten(-2)
                             for t in want_conv.split(2048, dim=-1)[:2]), want_conv[:, 4096:]],
                          dim=-1)
    got_conv = torch.cat([query, key, value], dim=-1)
    assert _rel_err(got_conv, want_conv) < 1e-2
    torch.testing.assert_close(conv_pool, ref_conv)  # the window is copied, not computed

    want = gated_delta_rule_ref(*qkv, *gdn_gates(*gates), ref_state, meta.state_slots,
                                meta.query_start_loc, meta.max_query_len)
    got = ops.gated_delta_rule(*qkv, *gates, state_pool, meta)
    assert _rel_err(got, want) < 2e-2
    assert _rel_err(state_pool, ref_state) < 1e-2


# -- the engine: graphs on and off -------------------------------------------------------------

MODEL = load_model_config("qwen3.5-0.8b")
NUM_PROMPTS, MAX_TOKENS = 32, 24


def _prompts() -> dict[str, tuple[list[int], int]]:
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, 700, (NUM_PROMPTS,), generator=generator).tolist()
    return {f"p{i}": (torch.randint(0, MODEL.vocab_size, (n,), generator=generator).tolist(),
                      MAX_TOKENS) for i, n in enumerate(lengths)}


def _engine(**knobs) -> Engine:
    config = EngineConfig(**{"kv_cache_gib": 2.0, "max_num_seqs": 8,
                             "decode_buckets": (1, 2, 4, 8), "max_model_len": 4096, **knobs})
    engine = build_engine(MODEL, config, DEVICE)
    if config.cuda_graphs == "on" and config.padded_prefill != "off":
        assert engine.runner.graphs.buckets == [1, 2, 4, 8]
        # each size: a prefill form and mixed forms for 8 >> 2 and 8 decode rows
        assert [(b["tokens"], b["decode_rows"]) for b in engine.info()["prefill_graphs"]] == [
            (size, rows) for size in (128, 256, 512, 1024, 2048, 2056) for rows in (0, 2, 8)]
    assert (engine.planning.mode == "resident") == (config.resident_planning == "auto")
    return engine


def _release(engine: Engine) -> None:
    del engine
    gc.collect()
    torch.cuda.empty_cache()


def _greedy(concurrency: int | None = 1, **knobs) -> dict[str, list[int]]:
    engine = _engine(**knobs)
    outputs = run_engine(engine, _prompts(), concurrency=concurrency)
    if concurrency == 1:
        assert engine.runner.num_padded_prefills == NUM_PROMPTS  # every prompt fits a bucket
    _release(engine)
    return outputs


@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
def test_greedy_identical_with_and_without_graphs(backend):
    """Graphs on and off, then the resident step (its graphs record scatter, gather, forward
    and advance; fa2 still plans on the host under flashinfer). The first engine of the process
    is one of them: it used to give one prompt of 32 another token than every later engine
    (results/2026-11-30-h200-0.8b-planner), because its compiled dense ops first met the shapes
    in its requests' order; every engine now runs each step shape once before serving."""
    eager = _greedy(attention_backend=backend, cuda_graphs="off", resident_planning="off")
    again = _greedy(attention_backend=backend, cuda_graphs="off", resident_planning="off")
    assert again == eager
    graphs = _greedy(attention_backend=backend, cuda_graphs="on", resident_planning="off")
    assert graphs == eager
    assert _greedy(attention_backend=backend, cuda_graphs="on",
                   resident_planning="auto") == eager


@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
@pytest.mark.parametrize("planning", ["off", "auto"])
def test_plan_ahead_gives_the_in_order_tokens(backend, planning):
    """The step staged while the last one runs (its uploads queued behind it on the stream),
    and launched before the last one's tokens are read back (its ids gathered from them on
    the device), against the in-order step, with graphs: one request at a time, then all 32
    queued at once (8 run; rows leave and prefills join as they finish). In bf16 a row's
    tokens depend on its batch, so the batches must match: requests arriving between steps
    would join a step later under plan_ahead, so none do."""
    for concurrency in (1, None):
        knobs = {"attention_backend": backend, "resident_planning": planning}
        in_order = _greedy(concurrency, plan_ahead="off", **knobs)
        for mode in ("on", "launch"):
            assert _greedy(concurrency, plan_ahead=mode, **knobs) == in_order, (concurrency, mode)


def test_plan_ahead_with_eager_prefill_gives_the_in_order_tokens():
    """Host-planned (eager) prefill and mixed steps under launch: a step launched ahead plans
    FlashInfer's prefill while the step before it is in flight, so its plan must not rewrite
    a pinned source whose copy for that step is still queued (Engine._launch plans before the
    read-back's mark)."""
    knobs = {"attention_backend": "flashinfer", "padded_prefill": "off"}
    in_order = _greedy(None, plan_ahead="off", **knobs)
    assert _greedy(None, plan_ahead="launch", **knobs) == in_order


def test_resident_at_concurrency_8_against_a_main_vs_main_yardstick():
    """At concurrency 8 rows share buckets, so batch composition decides rounding: the
    yardstick is host-planned against itself; the resident step must match it as well."""
    off = _greedy(8, attention_backend="triton", resident_planning="off")
    yardstick = sum(a == b for a, b in zip(
        off.values(), _greedy(8, attention_backend="triton", resident_planning="off").values(),
        strict=True))
    resident = _greedy(8, attention_backend="triton", resident_planning="auto")
    same = sum(resident[rid] == tokens for rid, tokens in off.items())
    print(f"concurrency 8: resident vs off {same}/{NUM_PROMPTS}, "
          f"off vs off {yardstick}/{NUM_PROMPTS}")
    assert same == yardstick


@pytest.mark.parametrize("pressure, knobs, check", [
    ("kv", {"kv_cache_gib": 0.02, "prefill_token_budget": 512},
     lambda counts: counts["offloads"] > 0 and counts["slot_releases"] > 0),
    ("slot", {"decode_order": "turns", "max_num_seqs": 64},
     lambda counts: counts["displaced"] > 0),
])
def test_row_check_finds_nothing_under_pressure(pressure, knobs, check):
    """At least 5,000 resident steps with the row check (a sync and a compare of every row a
    step read against the host streams), under KV pressure (offloads give slots up) or slot
    pressure (64 requests over buckets of at most 8 rows)."""
    generator = torch.Generator().manual_seed(11)
    requests = {f"q{i}": (torch.randint(0, MODEL.vocab_size, (int(n),),
                                        generator=generator).tolist(), 96)
                for i, n in enumerate(torch.randint(16, 300, (64,), generator=generator))}
    engine = _engine(**{"attention_backend": "triton", "resident_planning": "auto",
                        "row_check": "on", **knobs})
    steps = 0
    while steps < 5000:
        run_engine(engine, {f"{rid}-{steps}": r for rid, r in requests.items()})
        steps = engine.rowcheck_counts()["steps"]
    counts = engine.rowcheck_counts()
    print(f"{pressure} pressure: {counts}")
    _release(engine)
    assert counts["mismatches"] == 0 and check(counts)


# -- the fused decode path against the reference ops -------------------------------------------

FUSED_SLACK = 1.5


def test_fused_small_bucket_decode_is_as_close_to_fp32_as_the_reference_ops():
    """A 4-row bucket's decode ops (the skinny GEMMs with their norms and activation, the GDN
    kernels with their gates, the Triton KV write and attention; then fused_decode's GDN layer
    and attention prologue kernels, without and with PDL, and with fused_decode=full's epilogues:
    the add + norm in the narrow projections' kernels, the output gate in the attention's, the
    silu-mul in the down projection's; then every projection on a CUDA-core tile through a
    gemv table), teacher-forced for 8 steps at 0.8B in bf16, against the same steps on the torch
    reference ops in bf16, each measured against an fp32 run of the reference: no Triton path
    is further from fp32."""
    import copy

    from resident.backends.gemv_table import GemvChoice, GemvTable
    from resident.backends.triton_decode import DecodeFusion, TritonDecode
    from resident.kernels.gemv import DEFAULT_FMA_TILE
    from resident.model.cache import ModelCache
    from resident.model.ops import ModelOps
    from resident.model.weights import load_model

    model = load_model(MODEL, DEVICE, torch.bfloat16)
    exact = copy.deepcopy(model).to(torch.float32)
    num_rows, prompt_len, pages_per_row = 4, 48, 8
    # every projection's CUDA-core tile "won" at 4 rows
    cuda_core = GemvTable({shape: [GemvChoice(num_rows, DEFAULT_FMA_TILE, 1.0, 2.0)]
                           for shape in MODEL.decode_projections.values()}, "test")
    pages = [list(range(1 + r * pages_per_row, 1 + (r + 1) * pages_per_row))
             for r in range(num_rows)]
    runs = {name: (net, ops, ModelCache.allocate(MODEL, num_rows * pages_per_row + 1, PAGE,
                                                 num_rows + 1, dtype, DEVICE))
            for name, net, ops, dtype in [
                ("fused", model, TritonDecode((num_rows,)).ops(num_rows), torch.bfloat16),
                ("fused_decode", model, TritonDecode((num_rows,), fusion=DecodeFusion(
                    True, False)).ops(num_rows), torch.bfloat16),
                ("fused_decode+pdl", model, TritonDecode((num_rows,), fusion=DecodeFusion(
                    True, True)).ops(num_rows), torch.bfloat16),
                ("fused_decode=full+pdl", model, TritonDecode((num_rows,), fusion=DecodeFusion(
                    True, True, True)).ops(num_rows), torch.bfloat16),
                ("full+pdl, CUDA-core table", model, TritonDecode(
                    (num_rows,), fusion=DecodeFusion(True, True, True),
                    table=cuda_core).ops(num_rows), torch.bfloat16),
                ("reference", model, ModelOps(), torch.bfloat16),
                ("fp32", exact, ModelOps(), torch.float32)]}
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(0, MODEL.vocab_size, (num_rows * prompt_len,), generator=generator)
    meta = build_step_meta([(0, prompt_len, pages[r], r + 1) for r in range(num_rows)], PAGE,
                           DEVICE)
    fused = ("fused", "fused_decode", "fused_decode+pdl", "fused_decode=full+pdl",
             "full+pdl, CUDA-core table")
    errors = dict.fromkeys((*fused, "reference"), 0.0)
    with torch.inference_mode():
        for net, _, cache in runs.values():  # prefill on the reference ops
            net(ids.to(DEVICE), meta, cache, ModelOps())
        for step in range(8):
            meta = build_step_meta([(prompt_len + step, 1, pages[r], r + 1)
                                    for r in range(num_rows)], PAGE, DEVICE)
            token = torch.randint(0, MODEL.vocab_size, (num_rows,), generator=generator)
            logits = {name: net.compute_logits(net(token.to(DEVICE), meta, cache, ops)).float()
                      for name, (net, ops, cache) in runs.items()}
            for name in errors:
                errors[name] = max(errors[name], _rel_err(logits[name], logits["fp32"]))
    print(f"max relative logit error against fp32 over 8 steps: {errors}")
    for name in fused:
        assert errors[name] <= FUSED_SLACK * errors["reference"] + 1e-3, errors


def test_a_bf16_state_adds_less_error_than_bf16_activations():
    """gdn_state_dtype=bfloat16: the engine's default decode ops (the fused kernels) teacher-
    forced for 64 steps after a 48-token prefill at 0.8B in bf16, once with the GDN state in
    fp32 (the default) and once in bf16, each against an fp32 run of the reference ops. The
    state rounded once a token (and its error carried from token to token) is held to the
    error the bf16 activations already bring: at most FUSED_SLACK times the default's."""
    import copy

    from resident.backends.triton_decode import DecodeFusion, TritonDecode
    from resident.model.cache import ModelCache
    from resident.model.ops import ModelOps
    from resident.model.weights import load_model

    model = load_model(MODEL, DEVICE, torch.bfloat16)
    exact = copy.deepcopy(model).to(torch.float32)
    num_rows, prompt_len, steps, pages_per_row = 4, 48, 64, 8
    pages = [list(range(1 + r * pages_per_row, 1 + (r + 1) * pages_per_row))
             for r in range(num_rows)]
    fused = TritonDecode((num_rows,), fusion=DecodeFusion(True, True)).ops(num_rows)
    runs = {name: (net, ops, ModelCache.allocate(MODEL, num_rows * pages_per_row + 1, PAGE,
                                                 num_rows + 1, dtype, DEVICE, state_dtype))
            for name, net, ops, dtype, state_dtype in [
                ("fp32 state", model, fused, torch.bfloat16, torch.float32),
                ("bf16 state", model, fused, torch.bfloat16, torch.bfloat16),
                ("fp32", exact, ModelOps(), torch.float32, torch.float32)]}
    generator = torch.Generator().manual_seed(6)
    ids = torch.randint(0, MODEL.vocab_size, (num_rows * prompt_len,), generator=generator)
    meta = build_step_meta([(0, prompt_len, pages[r], r + 1) for r in range(num_rows)], PAGE,
                           DEVICE)
    errors = {"fp32 state": [], "bf16 state": []}
    with torch.inference_mode():
        for net, _, cache in runs.values():  # prefill on the reference ops
            net(ids.to(DEVICE), meta, cache, ModelOps())
        for step in range(steps):
            meta = build_step_meta([(prompt_len + step, 1, pages[r], r + 1)
                                    for r in range(num_rows)], PAGE, DEVICE)
            token = torch.randint(0, MODEL.vocab_size, (num_rows,), generator=generator)
            logits = {name: net.compute_logits(net(token.to(DEVICE), meta, cache, ops)).float()
                      for name, (net, ops, cache) in runs.items()}
            for name, found in errors.items():
                found.append(_rel_err(logits[name], logits["fp32"]))
    summary = {name: {"max": max(found), "last 8 mean": sum(found[-8:]) / 8}
               for name, found in errors.items()}
    print(f"relative logit error against fp32 over {steps} steps: {summary}")
    assert runs["bf16 state"][2].recurrent.dtype == torch.bfloat16
    assert max(errors["bf16 state"]) <= FUSED_SLACK * max(errors["fp32 state"]), summary
