"""The skinny decode GEMM (Triton) against torch: the interpreter on CPU, bf16 on the GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from resident.kernels.gdc import KeptZeros  # noqa: E402
from resident.kernels.gemv import (  # noqa: E402
    DEFAULT_TILE,
    GemvTile,
    gated_norm_linear_partials,
    gemv_splits,
    row_class,
    row_pieces,
    sigmoid_gate_linear_partials,
    silu_mul_wide_linear,
    skinny_linear,
    skinny_linear_add_norm,
    skinny_linear_partials,
)
from resident.model.dense import add_rms_norm, silu_mul  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("n, k, block_k, unroll", [(40, 300, 64, 1), (40, 300, 64, 3),
                                                    (70, 64, 64, 1)])
def test_matches_torch_fp32(rows, n, k, block_k, unroll):
    generator = torch.Generator().manual_seed(rows * n)
    x = torch.randn(rows, k, generator=generator).to(DEVICE)
    weight = torch.randn(n + 5, k, generator=generator).to(DEVICE)[:n]  # a row-slice view
    # unrolled: one program runs all 5 K tiles, 3 at a time (a remainder of 2)
    tile = GemvTile(block_n=16, block_k=block_k, target_programs=0 if unroll > 1 else 264,
                    unroll=unroll)
    got = skinny_linear(x, weight, tile)
    torch.testing.assert_close(got, x @ weight.T, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rows", [1, 3, 4])
@pytest.mark.parametrize("tile", [
    GemvTile(block_n=4, block_k=128, target_programs=0, fma=True),  # one program a K row
    GemvTile(block_n=8, block_k=64, target_programs=20, fma=True),  # K split in 3
    GemvTile(block_n=16, block_k=64, target_programs=0, unroll=2, fma=True),
])
def test_fma_tiles_match_torch(rows, tile):
    """The CUDA-core form: the product over the rows there are (3 rounded up to 4)."""
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 300, generator=generator).to(DEVICE)
    weight = torch.randn(45, 300, generator=generator).to(DEVICE)
    torch.testing.assert_close(skinny_linear(x, weight, tile), x @ weight.T, atol=1e-4,
                               rtol=1e-4)


def test_fma_tile_runs_the_add_norm_epilogue():
    """The epilogue's sums at the CUDA-core form's row block (2, not 16), on a scratch a
    16-row bucket's MMA tile of as many column blocks used first (its sums lie past this
    launch's)."""
    x, weight, residual, norm_weight = _add_norm_operands(2, 70, 256, torch.float64)
    tile = GemvTile(block_n=16, block_k=64, target_programs=27, fma=True)
    scratch = KeptZeros()
    wide_x, _, wide_residual, _ = _add_norm_operands(16, 70, 256, torch.float64)
    skinny_linear_add_norm(wide_x, weight, wide_residual, norm_weight, 1e-6, scratch,
                           GemvTile(block_n=16, block_k=64))
    want_normed, want_summed = add_rms_norm(skinny_linear_partials(x, weight, tile), residual,
                                            norm_weight, 1e-6)
    normed, summed = skinny_linear_add_norm(x, weight, residual, norm_weight, 1e-6, scratch,
                                            tile)
    assert torch.equal(summed, want_summed)
    torch.testing.assert_close(normed, want_normed, atol=1e-13, rtol=1e-13)


@pytest.mark.parametrize("tile", [GemvTile(block_n=8, block_k=64, target_programs=20, fma=True),
                                  GemvTile(block_n=16, block_k=64, target_programs=20)])
def test_gated_add_norm_is_the_mlps_down_and_the_next_norm(tile):
    """silu-mul, down and the next add + norm in one kernel: add_rms_norm of the down
    projection of silu_mul(gate_up) to float64 rounding, on either form."""
    generator = torch.Generator().manual_seed(11)
    gate_up = torch.randn(3, 2 * 128 + 8, generator=generator,
                          dtype=torch.float64).to(DEVICE)[:, :256]
    _, weight, residual, norm_weight = _add_norm_operands(3, 40, 128, torch.float64)
    want = add_rms_norm(silu_mul(gate_up) @ weight.T, residual, norm_weight, 1e-6)
    got = skinny_linear_add_norm(gate_up, weight, residual, norm_weight, 1e-6, KeptZeros(),
                                 tile, gated=True)
    for got_part, want_part in zip(got, want, strict=True):
        torch.testing.assert_close(got_part, want_part, atol=1e-12, rtol=1e-12)


def test_splits_fill_the_grid_and_stop_at_k():
    assert gemv_splits(1024, 3584, GemvTile(32, 256)) == 9  # 32 column blocks, 14 K blocks
    assert gemv_splits(248320, 1024, GemvTile(32, 256)) == 1
    assert gemv_splits(16, 64, GemvTile(16, 64)) == 1  # one K block: nothing to split
    assert gemv_splits(1024, 3584, GemvTile(32, 256, target_programs=0)) == 1


@triton.jit
def _row_pieces_kernel(rows, firsts, lengths, first_row, N, span, BLOCK_N: tl.constexpr,
                       CHUNKS: tl.constexpr, ALIGN: tl.constexpr):
    row, first, length = row_pieces(first_row, N, span, BLOCK_N, CHUNKS, ALIGN)
    lane = tl.arange(0, BLOCK_N * CHUNKS)
    tl.store(rows + lane, row)
    tl.store(firsts + lane, first)
    tl.store(lengths + lane, length)


@pytest.mark.parametrize("span, block_n, chunks", [(1024, 32, 4), (200, 16, 8), (8, 32, 4),
                                                   (96, 4, 1)])
def test_prefetch_pieces_cover_each_row_once_in_16_byte_units(span, block_n, chunks):
    """The L2 prefetch's pieces (one a thread): each row below N is [0, span) exactly, in
    pieces that start on whole ALIGN units; rows past N send nothing."""
    first_row, n, align = 40, 40 + block_n - 3, 8
    rows, firsts, lengths = (torch.full((block_n * chunks,), -1, dtype=torch.int32)
                             for _ in range(3))
    _row_pieces_kernel[(1,)](rows, firsts, lengths, first_row, n, span, BLOCK_N=block_n,
                             CHUNKS=chunks, ALIGN=align)
    assert rows.tolist() == [first_row + lane // chunks for lane in range(block_n * chunks)]
    for row in range(first_row, first_row + block_n):
        mine = rows == row
        pieces = zip(firsts[mine].tolist(), lengths[mine].tolist(), strict=True)
        covered = [(first, first + length) for first, length in pieces if length]
        if row >= n:
            assert not covered
            continue
        ends = [0] + [end for _, end in covered]
        assert [start for start, _ in covered] == ends[:-1] and ends[-1] == span
        assert all(start % align == 0 for start, _ in covered)


@pytest.mark.parametrize("rows, tile", [
    (24, GemvTile(block_n=16, block_k=64, target_programs=264)),  # rows padded to 32, K split
    (40, GemvTile(block_n=32, block_k=64, target_programs=0)),  # padded to 64
    (5, GemvTile(block_n=16, block_k=64, target_programs=0, block_m=64)),  # a 64-row tile
    (64, GemvTile(block_n=16, block_k=128, target_programs=264, block_m=64)),
    (100, GemvTile(block_n=16, block_k=64, target_programs=264, block_m=128)),
    (130, GemvTile(block_n=16, block_k=64, target_programs=0)),  # padded to 256
    (256, GemvTile(block_n=16, block_k=64, target_programs=264, block_m=256)),
])
def test_medium_buckets_match_torch(rows, tile):
    """The MMA form past 16 rows (a bucket of 17-256 rows), and a tile whose block_m holds
    more rows than there are: the padding rows read zeros and are never stored."""
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 300, generator=generator).to(DEVICE)
    weight = torch.randn(70, 300, generator=generator).to(DEVICE)
    torch.testing.assert_close(skinny_linear(x, weight, tile), x @ weight.T, atol=1e-4,
                               rtol=1e-4)
    partials = skinny_linear_partials(x, weight, tile)
    torch.testing.assert_close(partials.sum(0), x @ weight.T, atol=1e-4, rtol=1e-4)


def test_refuses_wide_batches():
    with pytest.raises(ValueError, match="at most 256 rows"):
        skinny_linear(torch.zeros(257, 8), torch.zeros(4, 8))
    with pytest.raises(ValueError, match="at most 32 rows on tile 32x"):
        skinny_linear(torch.zeros(33, 8), torch.zeros(4, 8), GemvTile(block_m=32))
    with pytest.raises(ValueError, match="the add \\+ norm epilogue takes at most 16 rows"):
        skinny_linear_add_norm(torch.zeros(17, 8), torch.zeros(4, 8), torch.zeros(17, 4),
                               torch.zeros(4), 1e-6, KeptZeros())


@pytest.mark.parametrize("fields, message", [
    ({"block_m": 8}, "block_m must be a power of two >= 16, got 8"),
    ({"block_m": 48}, "block_m must be a power of two >= 16, got 48"),
    ({"block_m": 512}, "block_m sets the MMA form's rows, at most 256"),
    ({"block_m": 16, "fma": True}, "block_m sets the MMA form's rows"),
])
def test_tile_refuses_a_bad_block_m(fields, message):
    with pytest.raises(ValueError, match=message):
        GemvTile(**fields)


def test_row_classes():
    """A bucket's row class: the measurements it may read (gemv_table, confirm_gemv_table)."""
    assert [row_class(rows) for rows in (1, 16, 17, 64, 65, 128, 129, 256)] == [
        16, 16, 64, 64, 128, 128, 256, 256]
    for rows in (0, 257):
        with pytest.raises(ValueError, match=f"1 to 256 rows, got {rows}"):
            row_class(rows)


def _bf16_error(rows: int, weight: torch.Tensor, tile: GemvTile = DEFAULT_TILE, *,
                pdl: bool = False) -> float:
    """skinny_linear's relative error on `rows` random bf16 rows against the fp32 product;
    pdl: the partial sums a PDL launch leaves (skinny_linear_partials), added up here."""
    x = torch.randn(rows, weight.shape[1], device="cuda", dtype=torch.bfloat16)
    want = (x.float() @ weight.float().T)
    if pdl:
        got = skinny_linear_partials(x, weight, tile, pdl=True).sum(0)
    else:
        got = skinny_linear(x, weight, tile).float()
    return ((got - want).norm() / want.norm()).item()


def _bf16_weight(n: int, k: int) -> torch.Tensor:
    return torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5


COMMITTED_TABLE_ENTRIES = [
    entry for path in sorted((Path(__file__).parent.parent / "configs" / "gemv").glob("*.json"))
    for entry in json.loads(path.read_text())]


@pytest.mark.gpu
@pytest.mark.parametrize("entry", COMMITTED_TABLE_ENTRIES,
                         ids=lambda e: f"{e['shape']}-{e['rows']}-{e['best_tile']}")
def test_committed_table_tiles_bf16_gpu(entry):
    """Each committed gemv table entry's tile at its shape, at its rows and at a bucket below
    them that reads it (padding rows included): what gemv_table=auto runs on that GPU."""
    tile = GemvTile(**entry["tile"])
    weight = _bf16_weight(entry["n"], entry["k"])
    for rows in {entry["rows"], entry["rows"] - entry["rows"] // 4}:
        assert _bf16_error(rows, weight, tile) < 1e-2, rows


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [24, 96, 200])
def test_every_swept_wgmma_tile_bf16_gpu(rows):
    """Each wgmma tile bench_gemv sweeps in the rows' class, any of which a table may pick, at
    the 0.8B's out_proj and in_proj (K split or not by the tile)."""
    from resident.tools.bench_gemv import WGMMA_TILES

    for n, k in ((1024, 2048), (8224, 1024)):
        weight = _bf16_weight(n, k)
        for tile in WGMMA_TILES[row_class(rows)]:
            assert _bf16_error(rows, weight, tile) < 1e-2, tile.name


@pytest.mark.gpu
def test_bench_gemv_times_a_pdl_chain_gpu():
    """bench_gemv --pdl: the tiles timed as a step launches them (PDL; a closing projection's
    partials unsummed, an opening one's summed) at a row count of each form, every row marked,
    each time a finite positive; the product it times is the product (the chain's partials
    summed against torch)."""
    from resident.tools.bench_gemv import bench_shape

    closing = bench_shape("gdn out_proj", 1024, 2048, [1, 32], "engine", pdl=True)
    opening = bench_shape("attn qkv", 5120, 1024, [1], "engine", pdl=True)
    assert [row["rows"] for row in closing + opening] == [1, 32, 1]
    assert [row["partials"] for row in closing + opening] == [True, True, False]
    for row in closing + opening:
        assert row["pdl"] is True
        assert all(0 < us < 1e4 for us in [row["cublas_us"], *row["sweep_us"].values()])
    assert _bf16_error(32, _bf16_weight(1024, 2048), pdl=True) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 16, 24, 64])
@pytest.mark.parametrize("n, k", [(8224, 1024), (1024, 2048), (1024, 3584), (248320, 1024)])
def test_matches_torch_bf16_gpu(rows, n, k):
    assert _bf16_error(rows, _bf16_weight(n, k)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("n, k", [(1024, 2048), (1024, 3584)])
def test_float32_is_not_rounded_to_tf32_gpu(rows, n, k):
    """A float32 model's projections keep fp32's precision: tl.dot's tf32 default rounds each
    operand to 10 mantissa bits, a relative error near 1e-3; fp64 is the yardstick."""
    x = torch.randn(rows, k, device="cuda", dtype=torch.float64)
    weight = torch.randn(n, k, device="cuda", dtype=torch.float64) * k**-0.5
    want = x @ weight.T
    got = skinny_linear(x.float(), weight.float()).double()
    assert ((got - want).norm() / want.norm()).item() < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("n, k", [(1024, 3584), (4096, 12288)])
def test_gated_add_norm_fma_bf16_gpu(rows, n, k):
    """The MLP's silu-mul + down + next add + norm on the default CUDA-core tile with PDL, at
    the 0.8B's and 9B's down projection, against the separate ops in bf16."""
    from resident.kernels.gemv import DEFAULT_FMA_TILE
    gate_up = torch.randn(rows, 2 * k, device="cuda", dtype=torch.bfloat16)
    _, weight, residual, norm_weight = _add_norm_operands(rows, n, k, torch.bfloat16, "cuda")
    want_normed, want_summed = add_rms_norm(silu_mul(gate_up) @ weight.T, residual,
                                            norm_weight, 1e-6)
    normed, summed = skinny_linear_add_norm(gate_up, weight, residual, norm_weight, 1e-6,
                                            KeptZeros(), DEFAULT_FMA_TILE, gated=True,
                                            pdl=True)
    torch.testing.assert_close(summed.float(), want_summed.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(normed.float(), want_normed.float(), atol=5e-2, rtol=5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("n, k", [(8224, 1024), (1024, 2048), (1024, 3584)])
@pytest.mark.parametrize("tile", [GemvTile(16, 512, 4, 3, 264, fma=True),
                                  GemvTile(8, 1024, 4, 3, 0, fma=True)])
def test_fma_tiles_bf16_gpu(rows, n, k, tile):
    assert _bf16_error(rows, _bf16_weight(n, k), tile) < 1e-2


@pytest.mark.parametrize("splits", [1, 3])
def test_partials_added_up_by_the_norm_match_the_finished_projection(splits):
    generator = torch.Generator().manual_seed(splits)
    x = torch.randn(2, 192, generator=generator).to(DEVICE)
    weight = torch.randn(48, 192, generator=generator).to(DEVICE)
    residual = torch.randn(2, 48, generator=generator).to(DEVICE)
    norm_weight = torch.randn(48, generator=generator).to(DEVICE)
    tile = GemvTile(block_n=16, block_k=64, target_programs=3 * splits)
    partials = skinny_linear_partials(x, weight, tile)
    assert partials.shape == (splits, 2, 48) and partials.dtype == torch.float32
    got = add_rms_norm(partials, residual, norm_weight, 1e-6)
    want = add_rms_norm(skinny_linear(x, weight, tile), residual, norm_weight, 1e-6)
    for got_part, want_part in zip(got, want, strict=True):
        torch.testing.assert_close(got_part, want_part, atol=1e-5, rtol=1e-5)


def test_tile_names_a_bad_value():
    with pytest.raises(ValueError, match="block_k must be a power of two"):
        GemvTile(block_k=96)
    with pytest.raises(ValueError, match="target_programs"):
        GemvTile(target_programs=-1)
    with pytest.raises(ValueError, match="unroll"):
        GemvTile(unroll=0)
    with pytest.raises(ValueError, match="block_n must be a power of two >= 16"):
        GemvTile(block_n=8)
    assert GemvTile(block_n=8, fma=True).block_n == 8
    with pytest.raises(ValueError, match="a CUDA-core tile .fma. takes at most 4 rows, got 5"):
        skinny_linear(torch.zeros(5, 64), torch.zeros(8, 64), GemvTile(8, 64, fma=True))


@pytest.mark.parametrize("rows", [1, 5])
def test_gated_partials_are_the_mlp_down_projection(rows):
    generator = torch.Generator().manual_seed(rows)
    k = 160
    gate_up = torch.randn(rows, 2 * k + 8, generator=generator).to(DEVICE)[:, :2 * k]
    weight = torch.randn(40, k, generator=generator).to(DEVICE)
    gate, up = gate_up.chunk(2, dim=-1)
    want = (torch.nn.functional.silu(gate) * up) @ weight.T
    got = skinny_linear_partials(gate_up, weight, GemvTile(16, 64, target_programs=6),
                                 gated=True)
    assert got.shape[0] > 1  # the split is exercised too
    torch.testing.assert_close(got.sum(0), want, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="holding gate and up"):
        skinny_linear_partials(gate_up[:, :k], weight, gated=True)


@pytest.mark.parametrize("rows, fma", [(1, False), (3, False), (16, False), (1, True),
                                       (3, True)])
def test_gated_out_is_the_mlps_gate_up_then_silu_mul(rows, fma):
    """gate_up with the silu-mul in its epilogue: DenseOps.silu_mul of the projection in
    float64, on either form (the CUDA-core one to its 4 rows); an odd width (no column block
    pairs gate and up evenly: 45 of them, 16 a block) and a gate_up weight's row-slice
    view."""
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 200, generator=generator, dtype=torch.float64).to(DEVICE)
    weight = torch.randn(96, 200, generator=generator, dtype=torch.float64).to(DEVICE)[:90]
    tile = GemvTile(block_n=16, block_k=64, target_programs=0, fma=fma)
    got = silu_mul_wide_linear(x, weight, tile)
    assert got.shape == (rows, 45)
    torch.testing.assert_close(got, silu_mul(x @ weight.T), atol=1e-12, rtol=1e-12)


def test_gated_out_names_a_bad_weight_or_a_split_tile():
    x = torch.zeros(1, 64)
    with pytest.raises(ValueError, match=r"\[2I, K\] gate_up weight .* got \(45, 64\)"):
        silu_mul_wide_linear(x, torch.zeros(45, 64))
    with pytest.raises(ValueError, match="never splits K"):
        silu_mul_wide_linear(x, torch.zeros(64, 64), GemvTile(16, 64, target_programs=8))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 4, 16])
def test_gated_out_bf16_gpu(rows):
    """At the 0.8B's gate_up: silu_mul of cuBLAS's bf16 projection, both rounded products
    read alike (a product a bf16 ulp apart may differ by one ulp after the silu)."""
    x = torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(2 * 3584, 1024, device="cuda", dtype=torch.bfloat16) * 1024**-0.5
    want = silu_mul(x @ weight.T).float()
    for pdl in (False, True):
        got = silu_mul_wide_linear(x, weight, pdl=pdl).float()
        assert ((got - want).norm() / want.norm()).item() < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 16])
def test_gated_partials_bf16_gpu(rows):
    gate_up = torch.randn(rows, 2 * 3584, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(1024, 3584, device="cuda", dtype=torch.bfloat16) * 3584**-0.5
    gate, up = gate_up.float().chunk(2, dim=-1)
    want = (torch.nn.functional.silu(gate) * up) @ weight.float().T
    got = skinny_linear_partials(gate_up, weight, gated=True).sum(0)
    assert ((got - want).norm() / want.norm()).item() < 1e-2


@pytest.mark.parametrize("rows, target_programs", [(1, 0), (3, 12)])
def test_gated_norm_partials_are_the_gdn_output_projection(rows, target_programs):
    from resident.model.dense import gated_rms_norm

    generator = torch.Generator().manual_seed(rows)
    heads, head_dim, n = 4, 16, 40
    x = torch.randn(rows, heads, head_dim, generator=generator).to(DEVICE)
    wide = torch.randn(rows, 3 * heads * head_dim, generator=generator).to(DEVICE)
    gate = wide[:, heads * head_dim:2 * heads * head_dim].view(rows, heads, head_dim)
    norm_weight = torch.randn(head_dim, generator=generator).to(DEVICE)
    weight = torch.randn(n, heads * head_dim, generator=generator).to(DEVICE)
    want = gated_rms_norm(x, gate, norm_weight, 1e-6).reshape(rows, -1) @ weight.T
    got = gated_norm_linear_partials(x, gate, norm_weight, 1e-6, weight,
                                     GemvTile(16, 64, target_programs=target_programs))
    assert got.shape[0] == (1 if target_programs == 0 else 4)  # one head a K tile
    torch.testing.assert_close(got.sum(0), want, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="each head's values contiguous"):
        gated_norm_linear_partials(x, gate.transpose(1, 2).contiguous().transpose(1, 2),
                                   norm_weight, 1e-6, weight)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 16])
def test_gated_norm_partials_bf16_gpu(rows):
    from resident.model.dense import gated_rms_norm

    x = torch.randn(rows, 16, 128, device="cuda", dtype=torch.bfloat16)
    gate = torch.randn(rows, 16, 128, device="cuda", dtype=torch.bfloat16)
    norm_weight = torch.rand(128, device="cuda", dtype=torch.bfloat16) + 0.5
    weight = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16) * 2048**-0.5
    want = gated_rms_norm(x.float(), gate.float(), norm_weight.float(), 1e-6)
    want = want.reshape(rows, -1) @ weight.float().T
    got = gated_norm_linear_partials(x, gate, norm_weight, 1e-6, weight).sum(0)
    assert ((got - want).norm() / want.norm()).item() < 1e-2


@pytest.mark.parametrize("rows", [1, 3])
def test_sigmoid_gate_partials_are_the_gated_attention_output_projection(rows):
    from resident.model.dense import sigmoid_gate

    generator = torch.Generator().manual_seed(rows)
    heads, head_dim, n = 4, 24, 40
    out = torch.randn(rows, heads, head_dim, generator=generator).to(DEVICE)
    # the gate is the second half of each head's [query, gate] pair, as the layer splits it
    query_gate = torch.randn(rows, heads, 2 * head_dim, generator=generator).to(DEVICE)
    gate = query_gate[..., head_dim:]
    weight = torch.randn(n, heads * head_dim, generator=generator).to(DEVICE)
    want = sigmoid_gate(out, gate).reshape(rows, -1) @ weight.T
    got = sigmoid_gate_linear_partials(out, gate, weight,
                                       GemvTile(16, 32, target_programs=6)).sum(0)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 16])
def test_sigmoid_gate_partials_bf16_gpu(rows):
    query_gate = torch.randn(rows, 8, 512, device="cuda", dtype=torch.bfloat16)
    out = torch.randn(rows, 8, 256, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16) * 2048**-0.5
    gate = query_gate[..., 256:]
    want = (out.float() * torch.sigmoid(gate.float())).reshape(rows, -1) @ weight.float().T
    got = sigmoid_gate_linear_partials(out, gate, weight).sum(0)
    assert ((got - want).norm() / want.norm()).item() < 1e-2


def _counts(scratch: KeptZeros, columns: int, tile: GemvTile) -> torch.Tensor:
    """The add + norm epilogue's arrival counters for a projection of `columns` outputs."""
    return scratch.get((1 + -(-columns // tile.block_n),), torch.int32, DEVICE)


def _add_norm_operands(rows: int, n: int, k: int, dtype: torch.dtype, device: str = DEVICE):
    generator = torch.Generator().manual_seed(rows * n + k)
    x, weight, residual, norm_weight = (
        torch.randn(*shape, generator=generator, dtype=torch.float64).to(device, dtype)
        for shape in ((rows, k), (n, k), (rows, n), (n,)))
    return x, weight * k**-0.5, residual, norm_weight


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 5e-6), (torch.float64, 1e-13)])
@pytest.mark.parametrize("rows, n, k, target_programs", [
    (1, 48, 192, 9),  # 3 column blocks of 3 splits
    (3, 70, 256, 30),  # a partial column block (70 = 4 x 16 + 6), 4 splits
    (16, 600, 64, 0),  # 38 column blocks (the sums' rows padded to 64), 3 norm chunks, 1 split
])
def test_add_norm_epilogue_is_add_rms_norm_of_the_projection(dtype, atol, rows, n, k,
                                                             target_programs):
    """The next block's add + norm in the projection's last programs: the residual stream
    exactly as add_rms_norm over the partials makes it, the normed rows to rounding; twice in a
    row on one scratch, whose counters are back at zero after each launch."""
    x, weight, residual, norm_weight = _add_norm_operands(rows, n, k, dtype)
    tile = GemvTile(block_n=16, block_k=64, target_programs=target_programs)
    want_normed, want_summed = add_rms_norm(skinny_linear_partials(x, weight, tile), residual,
                                            norm_weight, 1e-6)
    scratch = KeptZeros()
    for _ in range(2):
        normed, summed = skinny_linear_add_norm(x, weight, residual, norm_weight, 1e-6, scratch,
                                                tile)
        assert torch.equal(summed, want_summed)
        torch.testing.assert_close(normed, want_normed, atol=atol, rtol=atol)
        assert not _counts(scratch, n, tile).any()


def test_add_norm_scratch_keeps_one_meeting_place_a_width_and_names_bad_operands():
    """Projections of other widths or tiles meet in their own counters (a graph holds each
    one's addresses); operands that do not fit fail naming them."""
    x, weight, residual, norm_weight = _add_norm_operands(2, 32, 64, torch.float32)
    tile = GemvTile(block_n=16, block_k=64)
    scratch = KeptZeros()
    skinny_linear_add_norm(x, weight, residual, norm_weight, 1e-6, scratch, tile)
    two_blocks = _counts(scratch, 32, tile)
    wide = (weight.repeat(2, 1)[:48], residual.repeat(1, 2)[:, :48].clone(),
            norm_weight.repeat(2)[:48])
    normed, _ = skinny_linear_add_norm(x, wide[0], wide[1], wide[2], 1e-6, scratch, tile)
    torch.testing.assert_close(normed, add_rms_norm(x @ wide[0].T, wide[1], wide[2], 1e-6)[0],
                               atol=1e-5, rtol=1e-5)
    assert _counts(scratch, 48, tile).shape == (4,) and not _counts(scratch, 48, tile).any()
    assert _counts(scratch, 32, tile) is two_blocks
    with pytest.raises(ValueError, match=r"residual \(2, 16\) must be a contiguous \[2, 32\]"):
        skinny_linear_add_norm(x, weight, residual[:, :16], norm_weight, 1e-6, scratch, tile)


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("n, k", [(1024, 2048), (1024, 3584), (4096, 12288)])
def test_add_norm_epilogue_bf16_gpu(rows, n, k, pdl):
    """At the 0.8B's and 9B's narrow projections, bf16, with and without PDL, in a CUDA graph
    replayed twice: the residual stream as add_rms_norm over the same partials makes it (to
    one bf16 step where the fp32 sum rounds either side), the normed rows to bf16 rounding."""
    x, weight, residual, norm_weight = _add_norm_operands(rows, n, k, torch.bfloat16, "cuda")
    want_normed, want_summed = add_rms_norm(skinny_linear_partials(x, weight), residual,
                                            norm_weight, 1e-6)
    scratch = KeptZeros()
    skinny_linear_add_norm(x, weight, residual, norm_weight, 1e-6, scratch, pdl=pdl)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        normed, summed = skinny_linear_add_norm(x, weight, residual, norm_weight, 1e-6, scratch,
                                                pdl=pdl)
    for _ in range(2):
        normed.zero_()
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(summed, want_summed, atol=0, rtol=1 / 128)
        torch.testing.assert_close(normed.float(), want_normed.float(), atol=2e-2, rtol=2e-2)
    assert not _counts(scratch, n, DEFAULT_TILE).any()
