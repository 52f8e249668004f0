"""Split-KV paged decode attention (Triton) against the torch reference; the interpreter on CPU."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from resident.kernels.attention import paged_attention_ref  # noqa: E402
from resident.kernels.decode_attention import (  # noqa: E402
    decode_scratch,
    paged_decode_attention,
)
from resident.kernels.gdc import KeptZeros  # noqa: E402
from resident.tools.compiled_kernels import compiled_kernels  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SINK = 0


def make_step(lengths: list[int], page_size: int, num_kv_heads: int, head_dim: int,
              num_heads: int, dtype: torch.dtype, width: int, extra_cols: int = 0,
              seed: int = 0, device: str = DEVICE):
    """A KV cache and a decode step whose rows have the given KV lengths; length 0 marks a
    padding row (sink table, position 0). Columns past a row's pages hold other live pages,
    so a kernel reading past the length would be caught. With extra_cols the block tables are
    a column slice of a wider buffer (a non-contiguous view)."""
    generator = torch.Generator().manual_seed(seed)
    used = [-(-max(length, 1) // page_size) for length in lengths]
    num_pages = 1 + sum(used) + 4
    kv = torch.randn(num_pages, 2, page_size, num_kv_heads, head_dim, generator=generator)
    order = (torch.randperm(num_pages - 1, generator=generator) + 1).tolist()  # never the sink
    big = torch.randint(1, num_pages, (len(lengths), width + extra_cols), generator=generator,
                        dtype=torch.int32)
    for row, (length, count) in enumerate(zip(lengths, used, strict=True)):
        if length == 0:
            big[row] = SINK
        else:
            big[row, :count] = torch.tensor([order.pop() for _ in range(count)])
    positions = torch.tensor([max(length - 1, 0) for length in lengths], dtype=torch.int64)
    query = torch.randn(len(lengths), num_heads, head_dim, generator=generator)
    big = big.to(device)
    return (query.to(device, dtype), kv.to(device, dtype), big[:, :width],
            torch.arange(len(lengths), device=device), positions.to(device))


def run_poisoned(query, kv, tables, token_seq, positions, scale, num_splits, **kwargs):
    """Runs the kernel into NaN-filled out and scratch: anything left unwritten, or a stale
    scratch value that leaks into the combine, shows up as NaN."""
    batch, heads, dim = query.shape
    out = torch.full_like(query, float("nan"))
    scratch = decode_scratch(batch, heads, dim, num_splits, query.device)
    for buf in scratch:
        buf.fill_(float("nan"))
    result = paged_decode_attention(query, kv, tables, token_seq, positions, scale, num_splits,
                                    out=out, scratch=scratch, **kwargs)
    assert result.data_ptr() == out.data_ptr()
    assert torch.isfinite(out).all(), "unwritten or NaN output"
    return out


# Lengths end mid-page; one row of length 1; a padding row on the sink (0).
LENGTHS = [13, 1, 0, 30]


@pytest.mark.parametrize("head_dim", [24, 32])
@pytest.mark.parametrize("page_size", [4, 8])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_matches_reference_fp32(head_dim, page_size, num_splits):
    width = -(-max(LENGTHS) // page_size) + 1
    query, kv, tables, token_seq, positions = make_step(
        LENGTHS, page_size, num_kv_heads=2, head_dim=head_dim, num_heads=4,
        dtype=torch.float32, width=width, extra_cols=3, seed=head_dim + page_size)
    assert not tables.is_contiguous()
    scale = head_dim**-0.5
    # block_n 16: rows of 13 and 30 keys span several tiles, and with 3 splits the short rows
    # leave splits empty
    out = run_poisoned(query, kv, tables, token_seq, positions, scale, num_splits, block_n=16)
    ref = paged_attention_ref(query, kv, tables, token_seq, positions, scale)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # the padding row sees one key, the sink's first: its output is that key's value
    torch.testing.assert_close(out[2], kv[SINK, 1, 0].repeat_interleave(2, dim=0),
                               atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("num_splits", [8, 64])
def test_default_tile_and_more_splits_than_tiles(num_splits):
    """Most splits empty (decode_splits gives a 1-row bucket 64): their outputs are neither
    written nor read (the scratch is NaN-poisoned), only their lse."""
    query, kv, tables, token_seq, positions = make_step(
        [5, 40, 1], page_size=8, num_kv_heads=2, head_dim=32, num_heads=4,
        dtype=torch.float32, width=6, seed=7)
    out = run_poisoned(query, kv, tables, token_seq, positions, 0.3, num_splits=num_splits)
    ref = paged_attention_ref(query, kv, tables, token_seq, positions, 0.3)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_group_of_one_and_of_four():
    for num_heads, num_kv_heads in [(2, 2), (8, 2)]:
        query, kv, tables, token_seq, positions = make_step(
            [9, 17], page_size=4, num_kv_heads=num_kv_heads, head_dim=24, num_heads=num_heads,
            dtype=torch.float32, width=5, seed=num_heads)
        out = run_poisoned(query, kv, tables, token_seq, positions, 0.2, 3, block_n=16)
        ref = paged_attention_ref(query, kv, tables, token_seq, positions, 0.2)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@triton.jit
def _dot_kernel(a, b, out, N: tl.constexpr):
    i = tl.arange(0, N)
    grid = i[:, None] * N + i[None, :]
    tl.store(out + grid, tl.dot(tl.load(a + grid), tl.load(b + grid)))


def _interpreter_dots_bf16() -> bool:
    """Triton 3.6's interpreter multiplies bf16 tiles as raw bits; the kernel is then untestable
    in bf16 on CPU (elementwise bf16 is fine)."""
    a, b = torch.eye(16, dtype=torch.bfloat16), torch.full((16, 16), 3.0, dtype=torch.bfloat16)
    out = torch.zeros(16, 16)
    _dot_kernel[(1,)](a, b, out, N=16)
    return bool((out == 3.0).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matches_reference_half(dtype):
    if DEVICE == "cpu" and dtype == torch.bfloat16 and not _interpreter_dots_bf16():
        pytest.skip("the Triton interpreter's tl.dot mishandles bf16 tiles")
    width = -(-max(LENGTHS) // 4) + 1
    query, kv, tables, token_seq, positions = make_step(
        LENGTHS, page_size=4, num_kv_heads=2, head_dim=32, num_heads=4, dtype=dtype,
        width=width, extra_cols=2, seed=3)
    out = run_poisoned(query, kv, tables, token_seq, positions, 32**-0.5, 3, block_n=16)
    assert out.dtype == dtype
    ref = paged_attention_ref(query.float(), kv.float(), tables, token_seq, positions, 32**-0.5)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_rejects_what_does_not_fit():
    query, kv, tables, token_seq, positions = make_step(
        [3], page_size=4, num_kv_heads=2, head_dim=24, num_heads=4, dtype=torch.float32,
        width=1)
    with pytest.raises(ValueError, match="scratch"):
        paged_decode_attention(query, kv, tables, token_seq, positions, 1.0, 3,
                               scratch=decode_scratch(1, 4, 24, 2, DEVICE))
    with pytest.raises(ValueError, match="one token a row"):
        paged_decode_attention(query, kv, tables, token_seq.repeat(2), positions, 1.0)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-6), (torch.float64, 1e-14)])
def test_output_gate_in_the_combine_is_sigmoid_gate_of_the_output(dtype, tolerance):
    """The gated attention's output gate in the combine pass: dense.sigmoid_gate of the
    ungated kernel's output, the gate a strided view (a head's values contiguous, as it sits in
    the qkv projection's rows); a padding row too."""
    from resident.model.dense import sigmoid_gate

    query, kv, tables, token_seq, positions = make_step(
        [9, 0, 21], page_size=4, num_kv_heads=2, head_dim=16, num_heads=4, dtype=dtype,
        width=8, seed=3)
    wide = torch.randn(3, 4, 40, generator=torch.Generator().manual_seed(3)).to(DEVICE, dtype)
    gate = wide[:, :, 8:24]
    plain = run_poisoned(query, kv, tables, token_seq, positions, 0.25, 3)
    gated = run_poisoned(query, kv, tables, token_seq, positions, 0.25, 3, gate=gate)
    torch.testing.assert_close(gated, sigmoid_gate(plain, gate), atol=tolerance,
                               rtol=tolerance)
    with pytest.raises(ValueError, match="each head's values contiguous"):
        paged_decode_attention(query, kv, tables, token_seq, positions, 0.25,
                               gate=wide[:, :, 8:40:2])


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("gated", [False, True])
def test_one_kernel_with_a_meeting_gives_the_two_kernels_output(num_splits, gated):
    """The last split of each (row, kv head) combines its heads: the same output as the
    separate combine, twice on one meeting (its counters back at zero), a padding row too."""
    query, kv, tables, token_seq, positions = make_step(
        [9, 0, 21], page_size=4, num_kv_heads=2, head_dim=16, num_heads=4,
        dtype=torch.float64, width=8, seed=5)
    gate = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(5)).to(
        DEVICE, torch.float64) if gated else None
    apart = run_poisoned(query, kv, tables, token_seq, positions, 0.25, num_splits, gate=gate)
    meeting = KeptZeros()
    for _ in range(2):
        merged = run_poisoned(query, kv, tables, token_seq, positions, 0.25, num_splits,
                              gate=gate, meeting=meeting)
        assert torch.equal(merged, apart)
        assert not meeting.get((3, 2), torch.int32, query.device).any()


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 16, 64, 256])
@pytest.mark.parametrize("num_splits", [1, 8, 32, 64])
@pytest.mark.parametrize("block_n", [None, 16])
def test_real_shape_bf16_gpu(batch, num_splits, block_n):
    """Qwen3.5 attention shapes: head_dim 256, 8 query heads over 2 kv heads, page 16, ~640
    keys a row; the last row pads on the sink when the batch has more than one row. At the
    kernel's own tile and at a wide bucket's (16 keys, 4 warps: decode_tile)."""
    generator = torch.Generator().manual_seed(batch)
    lengths = torch.randint(600, 680, (batch,), generator=generator).tolist()
    if batch > 1:
        lengths[-1] = 0
    query, kv, tables, token_seq, positions = make_step(
        lengths, page_size=16, num_kv_heads=2, head_dim=256, num_heads=8, dtype=torch.bfloat16,
        width=48, extra_cols=5, seed=batch)
    out = run_poisoned(query, kv, tables, token_seq, positions, 256**-0.5, num_splits,
                       block_n=block_n)
    ref = paged_attention_ref(query.float(), kv.float(), tables, token_seq, positions,
                              256**-0.5)
    assert _relative_error(out, ref) < 1e-2
    gate = torch.randn(batch, 8, 2 * 256, device=DEVICE, dtype=torch.bfloat16)[:, :, 256:]
    gated = run_poisoned(query, kv, tables, token_seq, positions, 256**-0.5, num_splits,
                         gate=gate, block_n=block_n)
    torch.testing.assert_close(gated.float(), (out.float() * gate.float().sigmoid()),
                               atol=1e-2, rtol=1e-2)
    merged = run_poisoned(query, kv, tables, token_seq, positions, 256**-0.5, num_splits,
                          gate=gate, meeting=KeptZeros(), pdl=True, block_n=block_n)
    # the meeting's combine sums in the split kernel's layout (8 warps), which may round apart
    # from the combine kernel's by an ulp in a few elements (H200: 5-10 of 131,072, at most
    # 6e-5, the same error against the fp32 reference): equal to within that
    torch.testing.assert_close(merged.float(), gated.float(), rtol=2**-7, atol=1e-4)
    gated_ref = ref * gate.float().sigmoid()
    assert abs(_relative_error(merged, gated_ref) - _relative_error(gated, gated_ref)) < 1e-4


@pytest.mark.gpu
def test_cuda_graph_replay_reads_new_rows_gpu():
    """Captured once with a table as wide as a graph would allow; replays follow new tables and
    positions written into the same buffers."""
    batch, width, num_splits, scale = 16, 256, 8, 256**-0.5
    query, kv, tables, token_seq, positions = make_step(
        [700] * batch, page_size=16, num_kv_heads=2, head_dim=256, num_heads=8,
        dtype=torch.bfloat16, width=width, seed=1)
    out = torch.empty_like(query)
    scratch = decode_scratch(batch, 8, 256, num_splits, DEVICE)

    def step():
        paged_decode_attention(query, kv, tables, token_seq, positions, scale, num_splits,
                               out=out, scratch=scratch)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed, lengths in enumerate([[1] * batch, list(range(1, 700, 700 // batch))[:batch]]):
        fresh = make_step(lengths, page_size=16, num_kv_heads=2, head_dim=256, num_heads=8,
                          dtype=torch.bfloat16, width=width, seed=seed + 10)
        query.copy_(fresh[0])
        tables.copy_(fresh[2])
        positions.copy_(fresh[4])
        out.fill_(float("nan"))
        graph.replay()
        ref = paged_attention_ref(query.float(), kv.float(), tables, token_seq, positions, scale)
        assert _relative_error(out, ref) < 1e-2


@pytest.mark.gpu
def test_the_launched_split_pass_reports_its_registers_gpu():
    """compiled_kernels lists the split pass as the driver loaded it at the real shapes (what
    bench.py records): a thread's registers and no spill. compile_check's figure for it (241,
    as typed) is an upper bound; with the launch's hints ptxas gives it ~92."""
    query, kv, tables, token_seq, positions = make_step(
        [640] * 4, page_size=16, num_kv_heads=2, head_dim=256, num_heads=8,
        dtype=torch.bfloat16, width=48, seed=3)
    paged_decode_attention(query, kv, tables, token_seq, positions, 256**-0.5, 8)
    torch.cuda.synchronize()
    split = [k for k in compiled_kernels() if k["kernel"] == "decode_attention._split_kernel"]
    assert split and all(0 < k["registers"] <= 255 and k["spill_bytes"] == 0 for k in split)
    print(split)
