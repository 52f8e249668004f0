"""Kernel backends on CPU: knob resolution, the host page layout, and the engine driving the Triton
decode kernels (under the interpreter) to the same greedy tokens as the torch references."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from resident.backends import paged_layout
from resident.config import EngineConfig
from resident.engine.engine import Engine, build_engine
from resident.model.config import load_model_config

from model_driver import run_engine

TINY = load_model_config("tiny")


def test_auto_knobs_resolve_by_device():
    cpu = EngineConfig().resolve(TINY, "cpu")
    assert (cpu.attention_backend, cpu.cuda_graphs, cpu.compile) == ("torch", "off", "off")
    cuda = EngineConfig().resolve(TINY, "cuda")
    assert (cuda.attention_backend, cuda.cuda_graphs, cuda.compile) == ("triton", "on", "on")
    flashinfer = EngineConfig(attention_backend="flashinfer").resolve(TINY, "cuda")
    assert flashinfer.cuda_graphs == "on"
    assert EngineConfig(attention_backend="torch").resolve(TINY, "cuda").cuda_graphs == "off"


@pytest.mark.parametrize("knobs, device, message", [
    ({"cuda_graphs": "on"}, "cpu", "cuda_graphs: on needs a CUDA device"),
    ({"attention_backend": "flashinfer"}, "cpu", "flashinfer needs a CUDA device"),
    ({"attention_backend": "torch", "cuda_graphs": "on"}, "cuda", "cannot go with"),
    ({"compile": "maybe"}, "cpu", "knob compile: 'maybe' is not one of"),
])
def test_impossible_knobs_fail_naming_the_knob(knobs, device, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**knobs).resolve(TINY, device)


def test_paged_layout_pads_on_the_sink():
    layout = paged_layout([([5, 9, 2], 33, 1), ([7], 16, 16)], page_size=16, pad_to=3)
    assert layout.qo_indptr.tolist() == [0, 1, 17, 18]
    assert layout.kv_indptr.tolist() == [0, 3, 4, 5]
    assert layout.kv_indices.tolist() == [5, 9, 2, 7, 0]
    assert layout.kv_last_page_len.tolist() == [1, 16, 1]


def test_paged_layout_ignores_pages_past_the_length():
    layout = paged_layout([([4, 6, 8], 17, 1)], page_size=16)
    assert layout.kv_indices.tolist() == [4, 6]
    assert layout.kv_last_page_len.tolist() == [1]


@pytest.mark.parametrize("decode_gemm", ["skinny", "fused"])
def test_triton_decode_backend_gives_the_reference_tokens(decode_gemm):
    """Prefill on the references but its GDN conv (the Triton varlen kernel), decode buckets on
    the Triton kernels (all interpreted on CPU), the projections on the skinny GEMM with and
    without its prologues."""
    generator = torch.Generator().manual_seed(3)
    requests = {f"r{i}": (torch.randint(0, TINY.vocab_size, (n,), generator=generator).tolist(),
                          4) for i, n in enumerate((5, 40, 17))}

    def greedy(backend: str) -> dict[str, list[int]]:
        config = EngineConfig(attention_backend=backend, decode_buckets=(1, 2, 4),
                              max_num_seqs=4, resident_planning="off", decode_gemm=decode_gemm)
        return run_engine(build_engine(TINY, config, "cpu"), requests)

    assert greedy("triton") == greedy("torch")


def test_fused_decode_gives_the_unfused_tokens_in_float64():
    """fused_decode's kernels (a GDN layer, an attention prologue, interpreted; under `full`
    also the add + norm in the narrow projections' kernels) against the separate kernels in
    float64: requests of different lengths come and go, so decode steps
    run both buckets (1, 2) and a mixed step takes a prefill beside a decode row whose conv
    window and state the fused kernel last wrote."""
    generator = torch.Generator().manual_seed(6)
    requests = {f"r{i}": (torch.randint(0, TINY.vocab_size, (n,), generator=generator).tolist(),
                          out) for i, (n, out) in enumerate(((5, 8), (11, 2), (3, 4)))}

    def greedy(fused_decode: str) -> dict[str, list[int]]:
        config = EngineConfig(dtype="float64", attention_backend="triton", decode_buckets=(1, 2),
                              max_num_seqs=2, resident_planning="off", fused_decode=fused_decode)
        engine = build_engine(TINY, config, "cpu")
        ops = engine.runner.kernels.decode.ops(2)
        assert (ops.gdn_layer is not None) == (fused_decode != "off")
        assert (ops.narrow_linear_add_norm is not None) == (fused_decode == "full")
        outputs = run_engine(engine, requests, concurrency=2)
        assert engine.stats()["steps"]["mixed"] > 0
        return outputs

    unfused = greedy("off")
    assert greedy("auto") == unfused
    assert greedy("full") == unfused


@pytest.mark.parametrize("planning", ["off", "auto"])
def test_the_triton_argmax_gives_torchs_tokens(planning):
    """argmax=triton (kernels/argmax.py, interpreted): the decode steps' and the mixed steps'
    greedy tokens, a sampled request's draw from them too, equal argmax=torch's."""
    from resident.kernels.argmax import RowsArgmax

    generator = torch.Generator().manual_seed(8)
    requests = {f"r{i}": (torch.randint(0, TINY.vocab_size, (n,), generator=generator).tolist(),
                          out) for i, (n, out) in enumerate(((5, 6), (19, 3), (3, 5)))}

    def tokens(argmax: str) -> dict[str, list[int]]:
        config = EngineConfig(decode_buckets=(1, 2), max_num_seqs=2, argmax=argmax,
                              resident_planning=planning)
        engine = build_engine(TINY, config, "cpu")
        assert isinstance(engine.kernels.argmax, RowsArgmax) == (argmax == "triton")
        outputs = run_engine(engine, requests, concurrency=2)
        assert engine.stats()["steps"]["mixed"] > 0
        return outputs

    assert tokens("triton") == tokens("torch")


def test_the_triton_argmax_needs_cuda_or_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="knob argmax: triton needs a CUDA device"):
        EngineConfig(argmax="triton").resolve(TINY, "cpu")
    assert EngineConfig(argmax="triton").resolve(TINY, "cuda").argmax == "triton"


def test_the_triton_argmax_refuses_float64_logits(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="knob argmax: triton compares in float32"):
        EngineConfig(argmax="triton", dtype="float64").resolve(TINY, "cpu")
    assert EngineConfig(dtype="float64").resolve(TINY, "cpu").argmax == "torch"


@pytest.mark.parametrize(("device_type", "resolved"), [("cpu", "torch"), ("cuda", "triton")])
def test_argmax_auto_is_triton_on_cuda_and_torch_elsewhere(monkeypatch, device_type, resolved):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter does not make CPU triton's
    assert EngineConfig().argmax == "auto"
    assert EngineConfig().resolve(TINY, device_type).argmax == resolved


def test_padded_prefill_on_the_triton_kernels_gives_the_reference_tokens():
    """Prefills padded to their bucket on the Triton varlen attention and conv (they must keep
    the padding out of the rows' keys and windows), against unpadded prefills on the
    references."""
    generator = torch.Generator().manual_seed(4)
    requests = {f"r{i}": (torch.randint(0, TINY.vocab_size, (n,), generator=generator).tolist(),
                          4) for i, n in enumerate((5, 16, 29))}

    def greedy(backend: str, padded: str) -> dict[str, list[int]]:
        config = EngineConfig(attention_backend=backend, decode_buckets=(1,), max_num_seqs=1,
                              resident_planning="off", padded_prefill=padded,
                              prefill_buckets=(8, 32))
        engine = build_engine(TINY, config, "cpu")
        outputs = run_engine(engine, requests, concurrency=1)
        assert engine.runner.num_padded_prefills == (len(requests) if padded == "on" else 0)
        return outputs

    assert greedy("triton", "on") == greedy("torch", "off")


def test_resident_planning_on_the_triton_kernels_gives_the_host_planned_tokens():
    """The resident ops as Triton kernels (interpreted) around the Triton decode buckets, with
    the row check comparing every row each step read against the host streams."""
    generator = torch.Generator().manual_seed(5)
    requests = {f"r{i}": (torch.randint(0, TINY.vocab_size, (n,), generator=generator).tolist(),
                          4) for i, n in enumerate((5, 40, 17))}

    def greedy(planning: str) -> tuple[dict[str, list[int]], Engine]:
        config = EngineConfig(attention_backend="triton", decode_buckets=(1, 2, 4),
                              max_num_seqs=4, resident_planning=planning, row_check="on")
        engine = build_engine(TINY, config, "cpu")
        return run_engine(engine, requests), engine

    resident, engine = greedy("auto")
    assert engine.planning.ops.use_triton
    counts = engine.rowcheck_counts()
    assert counts["steps"] > 0 and counts["mismatches"] == 0
    assert resident == greedy("off")[0]


def test_decode_gemm_picks_the_small_buckets_projections():
    """Buckets of at most 16 rows take the skinny GEMMs, with their fused norms and activation
    under `fused` (so the engine test above runs them); wider buckets and `cublas` keep cuBLAS
    and the separate dense ops."""
    from resident.backends.triton_decode import TritonDecode
    from resident.kernels.gemv import skinny_linear_partials
    from resident.model.ops import narrow_linear_ref

    def fused_ops(ops):
        return (ops.silu_mul_linear, ops.gated_norm_linear, ops.sigmoid_gate_linear)

    for bucket in (1, 16):
        fused = TritonDecode((bucket,), "fused").ops(bucket)
        assert fused.narrow_linear is skinny_linear_partials
        assert None not in fused_ops(fused)
        skinny = TritonDecode((bucket,), "skinny").ops(bucket)
        assert skinny.narrow_linear is skinny_linear_partials
        assert fused_ops(skinny) == (None,) * 3
        cublas = TritonDecode((bucket,), "cublas").ops(bucket)
        assert cublas.narrow_linear is narrow_linear_ref
        assert fused_ops(cublas) == (None,) * 3
    wide = TritonDecode((32,), "fused").ops(32)
    assert wide.narrow_linear is narrow_linear_ref and fused_ops(wide) == (None,) * 3


def test_plan_reuse_only_when_the_page_lists_match():
    from resident.backends.layout import PlanReuse

    reuse = PlanReuse()
    first = paged_layout([([5, 9], 20, 1), ([7], 3, 1)], page_size=16, pad_to=4)
    assert not reuse.reusable(4, first)  # nothing planned yet
    reuse.planned(4, first)
    longer = paged_layout([([5, 9], 21, 1), ([7], 4, 1)], page_size=16, pad_to=4)
    assert reuse.reusable(4, longer)  # only the last-page lengths moved
    assert not reuse.reusable(8, longer)  # another bucket, another plan
    crossed = paged_layout([([5, 9, 4], 33, 1), ([7], 5, 1)], page_size=16, pad_to=4)
    assert not reuse.reusable(4, crossed)  # a row crossed a page
    swapped = paged_layout([([7], 4, 1), ([5, 9], 21, 1)], page_size=16, pad_to=4)
    assert not reuse.reusable(4, swapped)  # same rows, another order



def test_runner_host_layout_is_the_streams_page_lists():
    """The fa2 host plan's page lists, read off the runner's staged tables, equal the ones built
    from the KV streams row by row (decode rows, then padding rows on the sink)."""
    from resident.engine.types import EngineRequest, SamplingParams

    config = EngineConfig(decode_buckets=(1, 2, 4, 8), max_num_seqs=8, resident_planning="off")
    engine = build_engine(TINY, config, "cpu")
    for index, length in enumerate((15, 16, 31)):  # KV lengths 16, 17, 32 at the first decode
        engine.add_request(EngineRequest(f"r{index}", [7] * length, SamplingParams(max_tokens=9)))
    while any(r.is_prefilling for r in engine.requests.values()) or engine.scheduler.waiting:
        engine.step()
    plan = engine.scheduler.schedule()
    assert plan.kind == "decode" and len(plan.rows) == 3
    width = engine.inputs.stage_decode(plan, 4)
    got = engine.inputs.host_layout(plan, 4, width)
    want = paged_layout([(engine.kv.streams[row.request.request_id].pages,
                          row.request.num_computed + 1, 1) for row in plan.rows], 16, pad_to=4)
    for name in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len"):
        assert getattr(got, name).tolist() == getattr(want, name).tolist(), name
    assert got.kv_last_page_len.tolist() == [16, 1, 16, 1]


@pytest.mark.parametrize("planning", ["off", "auto"])
def test_a_host_planned_decode_backend_plans_every_decode_step(planning, monkeypatch):
    """A decode backend that plans on the host (as fa2 does) gets one plan a decode step, in
    either planning mode (resident planning stages the host tables for it alone), whose page
    lists are the streams' (padding rows one page, the sink); the tokens do not change."""
    from resident.backends.torch_ref import RefDecode

    generator = torch.Generator().manual_seed(9)
    requests = {f"r{i}": (torch.randint(0, TINY.vocab_size, (n,), generator=generator).tolist(),
                          7) for i, n in enumerate((5, 20, 33))}
    config = EngineConfig(dtype="float64", decode_buckets=(1, 2, 4), max_num_seqs=4,
                          resident_planning=planning, row_check="on")
    want = run_engine(build_engine(TINY, config, "cpu"), requests)
    layouts = []

    def plan_decode(self, bucket, layout):
        layouts.append((bucket, layout))

    monkeypatch.setattr(RefDecode, "host_plan", True)
    monkeypatch.setattr(RefDecode, "plan_decode", plan_decode)
    engine = build_engine(TINY, config, "cpu")
    assert run_engine(engine, requests) == want
    assert len(layouts) == engine.stats()["steps"]["decode"] > 0
    for bucket, layout in layouts:
        pages_per_row = (layout.kv_indptr[1:] - layout.kv_indptr[:-1]).tolist()
        assert len(pages_per_row) == bucket and min(pages_per_row) >= 1
        assert set(layout.kv_indices.tolist()) - {0} and 0 not in layout.kv_indices[
            :layout.kv_indptr[1]].tolist()


def test_fused_decode_picks_each_buckets_kernels():
    """The attention prologue in every bucket, the fused GDN layer up to FUSED_GDN_MAX_ROWS
    rows (it lost to the separate kernels at 64 and 256 on the H200), neither when off; PDL
    reaches the skinny GEMMs of small buckets."""
    from resident.backends.triton_decode import FUSED_GDN_MAX_ROWS, DecodeFusion, TritonDecode

    wide = 2 * FUSED_GDN_MAX_ROWS
    fused = TritonDecode((1, FUSED_GDN_MAX_ROWS, wide), fusion=DecodeFusion(True, True))
    for bucket in (1, FUSED_GDN_MAX_ROWS, wide):
        ops = fused.ops(bucket)
        assert ops.attention_prologue is not None
        assert (ops.gdn_layer is not None) == (bucket <= FUSED_GDN_MAX_ROWS)
    assert fused.ops(1).narrow_linear.keywords == {"pdl": True}
    assert fused.ops(FUSED_GDN_MAX_ROWS).silu_mul_wide_linear.keywords == {"pdl": True}
    assert fused.ops(wide).silu_mul_wide_linear is None  # more rows than the GEMV takes
    off = TritonDecode((1, wide), fusion=DecodeFusion(False, False)).ops(1)
    assert off.gdn_layer is None and off.attention_prologue is None
    assert off.silu_mul_wide_linear is None
    assert fused.ops(1).narrow_linear_add_norm is None


def test_a_large_gate_up_keeps_its_silu_mul_apart():
    """The silu-mul epilogue only on a gate_up of at most GATE_UP_EPILOGUE_MAX_BYTES (the 9B's
    measured slower on the Triton GEMV than on cuBLAS); a larger one runs the path fused_decode
    off runs, and the rest of the fusion stays."""
    from resident.backends.triton_decode import (
        GATE_UP_EPILOGUE_MAX_BYTES,
        DecodeFusion,
        TritonDecode,
    )

    cpu = torch.device("cpu")
    for gate_up_bytes, epilogue in ((GATE_UP_EPILOGUE_MAX_BYTES, True),
                                    (GATE_UP_EPILOGUE_MAX_BYTES + 1, False)):
        fusion = DecodeFusion.of("auto", "off", cpu, gate_up_bytes)
        ops = TritonDecode((1,), fusion=fusion).ops(1)
        assert (ops.silu_mul_wide_linear is not None) == epilogue
        assert ops.gdn_layer is not None and ops.attention_prologue is not None


def test_full_fused_decode_puts_the_epilogues_in_their_kernels():
    """fused_decode=full: the add + norm epilogue on the skinny GEMV of buckets of at most 16
    rows (one scratch for all), launched with PDL under pdl; not in wider buckets (cuBLAS),
    not beside decode_gemm=fused's prologues, and never under tensor parallelism, where the
    norm must wait for the all-reduce. The attention output gate in every bucket's decode
    attention."""
    from resident.backends.triton_decode import DecodeFusion, TritonDecode
    from resident.parallel.shard import row_parallel_ops

    full = DecodeFusion.of("full", "auto", torch.device("cpu"))
    assert (full.fused, full.epilogues, full.pdl) == (True, True, False)
    pdl = DecodeFusion(True, True, True)
    decode = TritonDecode((1, 16, 32), fusion=pdl)
    small = [decode.ops(bucket).narrow_linear_add_norm for bucket in (1, 16)]
    assert all(op.keywords == {"scratch": pdl.meeting, "pdl": True} for op in small)
    assert decode.ops(32).narrow_linear_add_norm is None
    assert decode.ops(1).silu_mul_linear_add_norm.keywords["pdl"]
    assert decode.ops(16).silu_mul_linear_add_norm is None  # the CUDA-core form: 4 rows at most
    # where the down projection takes it, gate_up leaves the silu-mul alone
    assert decode.ops(1).silu_mul_wide_linear is None
    assert decode.ops(16).silu_mul_wide_linear is not None
    assert all(decode.ops(bucket).gated_attention.keywords == {"pdl": True,
                                                               "meeting": pdl.meeting,
                                                               "num_sms": 0}
               for bucket in (1, 16, 32))
    # fused without epilogues: the gate in the combine kernel, no meeting
    assert TritonDecode((1,), fusion=DecodeFusion(True, True)).ops(1).gated_attention.keywords \
        == {"pdl": True, "meeting": None, "num_sms": 0}
    assert TritonDecode((1,), fusion=DecodeFusion()).ops(1).gated_attention is None
    prologues = TritonDecode((1,), "fused", fusion=pdl).ops(1)
    assert prologues.narrow_linear_add_norm is None and prologues.silu_mul_linear is not None
    assert row_parallel_ops(decode.ops(1), lambda tensor: None).narrow_linear_add_norm is None


def test_full_fused_decode_gives_the_decode_steps_logits_in_float64():
    """fused_decode=full's epilogues (interpreted): the narrow projections each running the
    next block's add + norm in its kernel (the MLP's down with its silu-mul too, a CUDA-core
    tile at 2 rows), the decode attention's combine and output gate in its split pass;
    teacher-forced through decode steps of a 2-row bucket against the same bucket with the
    norms and the silu-mul apart and the combine a kernel of its own: the logits to float64
    rounding (a norm weight off by 1% moves them by 1e-3 here, a gate by 1% 3e-4, where
    greedy tokens may not move at all)."""
    from resident.backends.triton_decode import DecodeFusion, TritonDecode

    apart, full = (TritonDecode((2,), fusion=DecodeFusion(True, False, full)).ops(2)
                   for full in (False, True))
    epilogues = ("narrow_linear_add_norm", "silu_mul_linear_add_norm")
    assert all(getattr(full, name) is not None for name in epilogues)
    assert all(getattr(apart, name) is None for name in epilogues)
    # the output gate in the split pass's merged combine, against the combine kernel's
    assert apart.gated_attention.keywords["meeting"] is None
    assert full.gated_attention.keywords["meeting"] is not None
    _assert_same_decode_logits(apart, full)


def test_the_add_norm_kernel_gives_the_decode_steps_logits_in_float64():
    """norm_kernel (the 9B's hidden size): each block's opening add + norm on
    kernels/add_norm.py, teacher-forced through decode steps against DenseOps.add_rms_norm,
    to float64 rounding; and only where the model is that wide and fused_decode is on."""
    from resident.backends.triton_decode import NORM_KERNEL_MIN_HIDDEN, DecodeFusion, TritonDecode

    apart, kernel = (TritonDecode((2,), fusion=DecodeFusion(True, False, norm_kernel=on)).ops(2)
                     for on in (False, True))
    assert apart.add_norm is None and kernel.add_norm.keywords == {"pdl": False}
    _assert_same_decode_logits(apart, kernel)
    cpu = torch.device("cpu")
    assert [DecodeFusion.of(fused, "off", cpu, 0, NORM_KERNEL_MIN_HIDDEN + extra).norm_kernel
            for fused, extra in (("auto", -1), ("auto", 0), ("off", 0))] == [False, True, False]


def test_the_start_up_log_names_the_models_add_norm_and_silu_mul_kernels():
    from resident.backends.triton_decode import (
        GATE_UP_EPILOGUE_MAX_BYTES,
        NORM_KERNEL_MIN_HIDDEN,
        DecodeFusion,
    )

    cpu = torch.device("cpu")
    small = DecodeFusion.of("auto", "off", cpu, GATE_UP_EPILOGUE_MAX_BYTES, 1024).describe()
    wide = DecodeFusion.of("full", "off", cpu, GATE_UP_EPILOGUE_MAX_BYTES + 1,
                           NORM_KERNEL_MIN_HIDDEN).describe()
    assert "silu-mul in gate_up's epilogue" in small and "add + norm Inductor's" in small
    assert "silu-mul in the down GEMV up to 4 rows, else its own kernel" in wide
    assert "add + norm in the narrow GEMVs' epilogues up to 16 rows, else kernels/add_norm" \
        in wide
    assert DecodeFusion.of("off", "off", cpu).describe().startswith("fused_decode off")


def _assert_same_decode_logits(apart, fused) -> None:
    """Two decode ops of a 2-row bucket teacher-forced through 3 steps of the tiny model in
    float64 after the same prompts: their logits to float64 rounding."""
    from resident.model.cache import ModelCache
    from resident.model.ops import ModelOps
    from resident.model.step import build_step_meta
    from resident.model.weights import load_model

    model = load_model(TINY, "cpu", torch.float64)
    rows, prompt_len, page = 2, 20, 16
    pages = [[1, 2, 3], [4, 5, 6]]
    runs = [(ops, ModelCache.allocate(TINY, 8, page, rows + 1, torch.float64, "cpu"))
            for ops in (apart, fused)]
    generator = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, TINY.vocab_size, (rows * prompt_len,), generator=generator)
    meta = build_step_meta([(0, prompt_len, pages[r], r + 1) for r in range(rows)], page, "cpu")
    with torch.inference_mode():
        for _, cache in runs:
            model(prompt, meta, cache, ModelOps())
        for step in range(3):
            meta = build_step_meta([(prompt_len + step, 1, pages[r], r + 1)
                                    for r in range(rows)], page, "cpu")
            token = torch.randint(0, TINY.vocab_size, (rows,), generator=generator)
            want, got = (model.compute_logits(model(token, meta, cache, ops))
                         for ops, cache in runs)
            torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


def _gemv_table_file(path, picks: dict[str, tuple[dict, float, float]],
                     measured_rows: tuple[int, ...] = (1, 4), pdl: bool = False) -> str:
    """A bench_gemv --json file for the tiny model's projections: for each shape, per measured
    row count, the tile and (triton_us, cublas_us) given by `picks[shape name]`; pdl: as
    --pdl writes it."""
    rows = []
    for name, (n, k) in TINY.decode_projections.items():
        for num_rows, (tile, triton_us, cublas_us) in zip(measured_rows, picks[name],
                                                          strict=True):
            rows.append({"shape": name, "n": n, "k": k, "rows": num_rows, "tile": tile,
                         "triton_us": triton_us, "cublas_us": cublas_us,
                         **({"pdl": True} if pdl else {})})
    path.write_text(json.dumps(rows))
    return str(path)


FMA_TILE = {"block_n": 8, "block_k": 64, "num_warps": 4, "num_stages": 3,
            "target_programs": 8, "unroll": 1, "fma": True}
DOT_TILE = {"block_n": 16, "block_k": 64, "num_warps": 4, "num_stages": 3,
            "target_programs": 0, "unroll": 1, "fma": False}


def test_gemv_table_picks_each_shapes_winner_by_rows(tmp_path):
    """A bucket takes the measurement at the nearest row count at or above its own, the Triton
    tile only where it beat cuBLAS; a shape the table lacks, or measured only at fewer rows,
    keeps the rule; a file that is not bench_gemv's fails naming the knob."""
    from resident.backends.gemv_table import GemvTable

    win, lose = (FMA_TILE, 2.0, 3.0), (DOT_TILE, 4.0, 3.0)
    table = GemvTable.load(_gemv_table_file(tmp_path / "t.json", {
        "gdn in_proj": (win, lose), "gdn out_proj": (lose, win), "attn qkv": (win, win),
        "attn o_proj": (lose, lose), "mlp gate_up": (win, lose), "mlp down": (win, win)}))
    assert table.choose(200, 64, 1).triton and table.choose(200, 64, 1).tile.fma
    assert not table.choose(200, 64, 2).triton  # measured at 4
    assert table.choose(200, 64, 16) is None  # measured up to 4 rows only
    assert table.choose(64, 64, 4).tile.block_n == 8 and table.choose(64, 64, 4).triton
    assert table.choose(7, 64, 1) is None
    assert any("200x64: 1: fma 8x64 w4 s3 p8 u1" in line and "16: decode_gemm's rule" in line
               for line in table.describe((1, 2, 16)))
    assert not any("PDL chain" in line for line in table.describe((1, 4)))
    chained = GemvTable.load(_gemv_table_file(tmp_path / "c.json", {
        name: (win, lose) for name in TINY.decode_projections}, pdl=True))
    assert chained.choose(200, 64, 1).pdl and not table.choose(200, 64, 1).pdl
    assert all("(2.00 us in a PDL chain, cuBLAS 3.00 at 1 rows)" in line
               for line in chained.describe((1,)))
    (tmp_path / "bad.json").write_text('[{"n": 1}]')
    with pytest.raises(ValueError, match="knob gemv_table: .* is not a bench_gemv --json"):
        GemvTable.load(str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="under decode_gemm skinny or wide, not cublas"):
        EngineConfig(gemv_table=str(tmp_path / "t.json"), decode_gemm="cublas")
    assert EngineConfig(decode_gemm="cublas").gemv_table == "auto"  # auto: only where it can


def test_gemv_table_log_names_the_gate_up_epilogue_where_it_runs_instead(tmp_path, monkeypatch,
                                                                         caplog):
    """Under fused_decode a small bucket runs gate_up with the silu-mul in its epilogue, in
    place of the table's entry: the start-up log says so for those buckets (FMA_MAX_ROWS and
    below under `full` run the table's), and the buckets' ops agree with it."""
    from resident.backends import build_kernels
    from resident.kernels.gemv import GATED_OUT_TILE

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    path = _gemv_table_file(tmp_path / "t.json", {
        name: ((DOT_TILE, 2.0, 3.0),) * 3 for name in TINY.decode_projections},
        measured_rows=(1, 4, 16))
    n, k = TINY.decode_projections["mlp gate_up"]
    for fused_decode, in_epilogue in (("auto", {1, 4, 16}), ("full", {16}), ("off", set())):
        config = EngineConfig(attention_backend="triton", decode_buckets=(1, 4, 16),
                              gemv_table=path, fused_decode=fused_decode).resolve(TINY, "cpu")
        caplog.clear()
        with caplog.at_level("INFO"):
            kernels = build_kernels(config, TINY, torch.float32, torch.device("cpu"))
        line = next(r.getMessage() for r in caplog.records if f"{n}x{k}: " in r.getMessage())
        picks = dict(pick.split(": ", 1) for pick in line.split(f"{n}x{k}: ")[1].split("; "))
        said = {int(bucket) for bucket, pick in picks.items()
                if pick.startswith(f"{GATED_OUT_TILE.name} with the silu-mul epilogue")}
        runs = {bucket for bucket in (1, 4, 16)
                if kernels.decode.ops(bucket).silu_mul_wide_linear is not None}
        assert said == runs == in_epilogue, fused_decode


def test_gemv_table_auto_is_the_gpus_committed_file_and_nothing_on_cpu():
    """auto looks for configs/gemv/<the GPU's name>.json (one file a GPU, every model's shapes);
    on CPU there is no GPU table, so the projections keep decode_gemm's rule."""
    from resident.backends.gemv_table import shipped_table_path
    from resident.model.config import configs_dir

    assert shipped_table_path("NVIDIA H100 80GB HBM3") == \
        configs_dir() / "gemv" / "NVIDIA_H100_80GB_HBM3.json"
    config = EngineConfig(attention_backend="triton", decode_buckets=(1,), max_num_seqs=1)
    assert config.gemv_table == "auto"
    ops = build_engine(TINY, config, "cpu").runner.kernels.decode.ops(1)
    assert ops.narrow_linear.__name__ == "skinny_linear_partials"


@pytest.mark.parametrize("fused_decode", ["auto", "full"])
def test_gemv_table_gives_the_reference_tokens(tmp_path, fused_decode):
    """The decode projections on a measured table's picks (a CUDA-core tile, the MMA tile or
    cuBLAS by shape and rows, interpreted) give the torch references' greedy tokens; under
    fused_decode=full the narrow projections keep a Triton tile for the norm."""
    generator = torch.Generator().manual_seed(8)
    requests = {f"r{i}": (torch.randint(0, TINY.vocab_size, (n,), generator=generator).tolist(),
                          4) for i, n in enumerate((5, 23, 9))}
    win, lose = (FMA_TILE, 2.0, 3.0), (DOT_TILE, 4.0, 3.0)
    path = _gemv_table_file(tmp_path / "t.json", {
        "gdn in_proj": (win, lose), "gdn out_proj": (lose, win), "attn qkv": (win, lose),
        "attn o_proj": (win, lose), "mlp gate_up": (lose, win), "mlp down": (win, lose)})

    def greedy(backend: str, **knobs) -> dict[str, list[int]]:
        config = EngineConfig(attention_backend=backend, decode_buckets=(1, 2, 4),
                              max_num_seqs=4, resident_planning="off", **knobs)
        engine = build_engine(TINY, config, "cpu")
        assert engine.info()["gemv_table"] == (path if knobs else None)
        if knobs:
            ops = engine.runner.kernels.decode.ops(1)
            assert ops.narrow_linear.func.__name__ == "table_linear"
            assert (ops.narrow_linear_add_norm is not None) == (fused_decode == "full")
        return run_engine(engine, requests, concurrency=3)

    assert greedy("triton", gemv_table=path, fused_decode=fused_decode) == greedy("torch")


def test_a_tables_medium_rows_move_those_buckets_projections(tmp_path):
    """A bucket of 17-256 rows stays on cuBLAS by decode_gemm's rule; a table measured at 32
    and 128 rows moves the shapes where a wgmma Triton tile won in the bucket's row class
    (cuBLAS keeps the rest, and a bucket whose class was not measured), and the tokens stay
    the torch reference's (interpreted)."""
    from resident.backends.gemv_table import GemvTable, table_linear
    from resident.model.ops import narrow_linear_ref

    generator = torch.Generator().manual_seed(9)
    requests = {f"r{i}": (torch.randint(0, TINY.vocab_size, (3 + i % 5,),
                                        generator=generator).tolist(), 3) for i in range(20)}
    mma64, mma128 = ({**DOT_TILE, "block_m": rows, "target_programs": 8} for rows in (64, 128))
    win = ((mma64, 2.0, 3.0), (mma128, 2.0, 3.0))
    lose = ((mma64, 4.0, 3.0), (mma128, 4.0, 3.0))
    path = _gemv_table_file(tmp_path / "t.json", {
        "gdn in_proj": win, "gdn out_proj": win, "attn qkv": lose, "attn o_proj": lose,
        "mlp gate_up": win, "mlp down": lose}, measured_rows=(32, 128))  # o_proj, down: one

    table = GemvTable.load(path)
    assert table.choose(64, 64, 17).rows == 32 and table.choose(64, 64, 65).rows == 128
    assert table.choose(64, 64, 16) is None  # a small bucket never reads a 64-row tile's time
    assert table.choose(64, 64, 33) is None  # nor a bucket of 33-64 rows a 128-row tile's
    assert table.choose(64, 64, 129) is None

    def greedy(backend: str, **knobs) -> dict[str, list[int]]:
        config = EngineConfig(attention_backend=backend, decode_buckets=(1, 4, 24, 48, 96),
                              max_num_seqs=96, resident_planning="off", **knobs)
        engine = build_engine(TINY, config, "cpu")
        if backend == "triton":
            medium, past, large = (engine.runner.kernels.decode.ops(b) for b in (24, 48, 96))
            on_table = bool(knobs)
            assert (getattr(medium.wide_linear, "func", None) is table_linear) == on_table
            assert medium.narrow_linear_add_norm is None
            if not on_table:
                assert medium.narrow_linear is narrow_linear_ref
            # a narrow projection on the Triton GEMV leaves split-K partials [S, M, N] for the
            # add + norm; cuBLAS a finished [M, N]
            (won, k), (lost, _) = (TINY.decode_projections[name]
                                   for name in ("gdn out_proj", "attn qkv"))
            for ops, rows, weight, triton_ran in (
                    (medium, 24, torch.randn(won, k), on_table),
                    (medium, 24, torch.randn(lost, k), False),
                    (past, 48, torch.randn(won, k), False),  # its class not measured
                    (large, 96, torch.randn(won, k), on_table)):
                out = ops.narrow_linear(torch.randn(rows, k), weight)
                assert out.dim() == (3 if triton_ran else 2)
        return run_engine(engine, requests, concurrency=20)

    reference = greedy("torch")
    assert greedy("triton") == reference
    assert greedy("triton", gemv_table=path) == reference


def test_a_gemv_sweep_always_times_the_engines_own_tiles():
    """A table hands a projection to cuBLAS where the best swept tile lost to it: a sweep of
    the CUDA-core tiles alone must still time the tiles the engine runs without a table, each
    once."""
    from resident.kernels.gemv import DEFAULT_TILE, FMA_MAX_ROWS, WIDE_TILE
    from resident.tools.bench_gemv import tiles_for

    for kinds, num_rows in (("fma", 1), ("fma", 16), ("dot", 4), ("all", 1)):
        tiles = tiles_for(kinds, num_rows)
        assert DEFAULT_TILE in tiles and WIDE_TILE in tiles
        assert len(set(tiles)) == len(tiles)
    assert any(tile.fma for tile in tiles_for("fma", FMA_MAX_ROWS))
    assert not any(tile.fma for tile in tiles_for("fma", FMA_MAX_ROWS + 1))
    assert tiles_for("engine", 1) == (DEFAULT_TILE, WIDE_TILE)  # the engine's tiles alone


def test_a_gemv_sweep_past_16_rows_times_the_wgmma_tiles_of_the_rows_class():
    from resident.kernels.gemv import MIN_DOT, ROW_CLASSES
    from resident.tools.bench_gemv import WGMMA_TILES, main, tiles_for

    assert set(WGMMA_TILES) == set(ROW_CLASSES[1:]) and all(WGMMA_TILES.values())
    for num_rows, block_m in ((17, 64), (64, 64), (65, 128), (200, 256)):
        swept = {tile.block_m for tile in tiles_for("dot", num_rows)} - {0}
        assert swept == {block_m}
    assert {tile.block_m for tile in tiles_for("wgmma", 4)} - {0} == {ROW_CLASSES[1]}
    assert all(tile.block_m == 0 for tile in tiles_for("all", MIN_DOT))
    with pytest.raises(SystemExit) as refused:  # before the CUDA check: a usage error
        main(["--rows", "1,257"])
    assert refused.value.code == 2


def test_bench_gemv_leaves_unsummed_only_what_a_step_sums_in_its_add_norm():
    """bench_gemv --pdl times CLOSING_PROJECTIONS' K splits unsummed, the others with their
    sum: in a step of the tiny model the closing ones are exactly what narrow_linear (whose
    partials the add + norm adds up) runs, the others wide_linear (a finished product)."""
    import torch.nn.functional as F

    from resident.model.cache import ModelCache
    from resident.model.ops import ModelOps
    from resident.model.step import build_step_meta
    from resident.model.weights import load_model
    from resident.tools.bench_gemv import CLOSING_PROJECTIONS

    seen: dict[str, set] = {"narrow": set(), "wide": set()}

    def spy(kind):
        def linear(x, weight):
            seen[kind].add(tuple(weight.shape))
            return F.linear(x, weight)
        return linear

    model = load_model(TINY, "cpu", torch.float64)
    cache = ModelCache.allocate(TINY, 8, 16, 2, torch.float64, "cpu")
    meta = build_step_meta([(0, 4, [1], 1)], 16, "cpu")
    with torch.inference_mode():
        model(torch.arange(4), meta, cache, ModelOps(narrow_linear=spy("narrow"),
                                                     wide_linear=spy("wide")))
    shapes = TINY.decode_projections
    assert set(shapes) >= CLOSING_PROJECTIONS
    assert seen["narrow"] == {shapes[name] for name in CLOSING_PROJECTIONS}
    assert seen["wide"] == {shapes[name] for name in set(shapes) - CLOSING_PROJECTIONS}


@pytest.mark.parametrize("path", sorted((Path(__file__).parent.parent / "configs" / "gemv")
                                        .glob("*.json")), ids=lambda path: path.name)
def test_every_committed_gemv_table_loads_and_names_real_projections(path):
    """gemv_table=auto reads configs/gemv/<GPU name>.json at start: each committed file loads,
    and every shape it holds is a decode projection of a shipped model, so none is dead."""
    from resident.backends.gemv_table import GemvTable

    table = GemvTable.load(str(path))
    models = (Path(__file__).parent.parent / "configs" / "models").glob("*.yaml")
    shapes = {shape for model in models
              for shape in load_model_config(model.stem).decode_projections.values()}
    measured = {(row["n"], row["k"]) for row in json.loads(path.read_text())}
    assert measured and measured <= shapes
    assert all(table.choose(n, k, 1) is not None for n, k in measured)


def test_decode_tiles_fill_a_small_buckets_grid_twice_and_a_wide_ones_four_times():
    """decode_splits=auto: the Triton decode attention's key splits a (row, kv head) fill a
    small bucket's grid to twice the SMs' count (the 0.8B's 2 kv heads on an H100's 132 SMs:
    64 at c=1, 33 at c=4, 16 at c=8), 8 to 64, at the kernel's own tile; a bucket whose rows
    alone fill the GPU takes half the tile and four times the SMs' programs, 1 to 8 splits."""
    from resident.kernels.decode_attention import decode_tile

    tiles = [decode_tile(batch, 2, 132, 256) for batch in (1, 2, 4, 8, 16, 24, 32, 64, 128, 256)]
    assert [tile.num_splits for tile in tiles] == [64, 64, 33, 16, 8, 8, 8, 4, 2, 1]
    assert [tile.block_n for tile in tiles] == [32] * 5 + [16] * 5
    assert decode_tile(1, 2, 8, 256) == (8, 32)  # an 8-SM GPU: 2 rows are a wide bucket
    assert decode_tile(2, 2, 8, 256) == (8, 16)
    assert decode_tile(512, 4, 132, 128) == (1, 32)  # half of D = 128's 64 keys


def test_a_wide_buckets_tile_gives_the_decode_steps_logits_in_float64():
    """A bucket whose rows fill the device (2 rows on a 4-SM device) reads its keys in half
    tiles over 4 splits; teacher-forced through decode steps against 8 splits of the kernel's
    own tile (decode_splits=off): the logits to float64 rounding."""
    from resident.backends.triton_decode import TritonDecode
    from resident.kernels.decode_attention import decode_tile

    assert decode_tile(2, TINY.num_key_value_heads, 4, TINY.head_dim) == (4, 32)
    eight, wide = (TritonDecode((2,), num_sms=num_sms).ops(2) for num_sms in (0, 4))
    _assert_same_decode_logits(eight, wide)


def test_the_start_up_log_names_each_buckets_attention_tile(caplog):
    """decode_splits=auto logs each decode bucket's key splits x keys a tile (the interpreter
    counts as 16 SMs: 16 and 64 rows of the tiny model's 2 kv heads are wide buckets), off
    says 8 splits everywhere."""
    lines = {}
    for decode_splits in ("auto", "off"):
        caplog.clear()
        config = EngineConfig(attention_backend="triton", decode_buckets=(1, 16, 64),
                              max_num_seqs=64, decode_splits=decode_splits)
        with caplog.at_level("INFO", logger="resident.backends"):
            build_engine(TINY, config, "cpu")
        lines[decode_splits] = next(r.getMessage() for r in caplog.records
                                    if r.getMessage().startswith("decode attention"))
    assert "1: 16x64, 16: 2x32, 64: 1x32 (decode_splits=auto, 16 SMs)" in lines["auto"]
    assert "8 key splits of the kernel's own tile in every bucket" in lines["off"]


@pytest.mark.parametrize(("decode_splits", "num_sms"), [("auto", 16), ("off", 0)])
def test_decode_splits_size_the_triton_attention_by_the_devices_sms(decode_splits, num_sms):
    """auto hands each bucket's attention the device's SMs (the interpreter counts as a
    16-SM device, so CPU tests take the kinds of split a GPU's buckets take); off, none:
    8 splits everywhere."""
    from resident.kernels import INTERPRETER_SMS

    config = EngineConfig(attention_backend="triton", decode_buckets=(1, 2), max_num_seqs=2,
                          decode_splits=decode_splits)
    decode = build_engine(TINY, config, "cpu").runner.kernels.decode
    assert INTERPRETER_SMS == 16
    assert {decode.ops(bucket).attention.keywords["num_sms"] for bucket in (1, 2)} == {num_sms}
