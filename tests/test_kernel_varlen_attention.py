"""Causal paged varlen attention (Triton) against the torch reference; the interpreter on CPU.

Rows of mixed lengths (decode rows of one token, prefill chunks that continue earlier context,
a chunk longer than a query block), zero-length padding rows and padding tokens after the last
row, as a padded prefill or mixed step lays them out."""

from __future__ import annotations

import pytest
import torch

from resident.kernels.attention import paged_attention_ref
from resident.kernels.gdc import KeptZeros
from resident.kernels.varlen_attention import BLOCK_Q, paged_varlen_attention, splits_for

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_step(rows: list[tuple[int, int]], padding_rows: int, padding_tokens: int,
              page_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
              dtype: torch.dtype, seed: int = 0):
    """rows: (context tokens already stored, new tokens). Every row's pages are distinct and
    random; padding rows are zero-length on the sink page; padding tokens sit past the last
    row's end. Returns the kernel's inputs and token_seq for the reference."""
    generator = torch.Generator().manual_seed(seed)
    page_counts = [-(-(context + new) // page_size) for context, new in rows]
    num_pages = 1 + sum(page_counts) + 3
    order = (torch.randperm(num_pages - 1, generator=generator) + 1).tolist()
    width = max(page_counts) + 1
    tables = torch.zeros(len(rows) + padding_rows, width, dtype=torch.int32)
    positions, token_seq, qsl = [], [], [0]
    for index, ((context, new), count) in enumerate(zip(rows, page_counts, strict=True)):
        tables[index, :count] = torch.tensor([order.pop() for _ in range(count)])
        positions += range(context, context + new)
        token_seq += [index] * new
        qsl.append(qsl[-1] + new)
    qsl += [qsl[-1]] * padding_rows
    positions += [0] * padding_tokens
    num_tokens = len(positions)
    kv = torch.randn(num_pages, 2, page_size, num_kv_heads, head_dim, generator=generator)
    query = torch.randn(num_tokens, num_heads, head_dim, generator=generator)

    def device(t: torch.Tensor, cast: bool = False) -> torch.Tensor:
        return t.to(DEVICE, dtype) if cast else t.to(DEVICE)

    return (device(query, True), device(kv, True), device(tables),
            device(torch.tensor(qsl)), device(torch.tensor(positions)),
            torch.tensor(token_seq, device=DEVICE), qsl[len(rows)])


# a 1-token decode row, a fresh chunk over two query blocks, a chunk continuing 9 stored tokens,
# a decode row deep in its context, a chunk that ends on a block boundary
ROWS = [(6, 1), (0, 2 * BLOCK_Q + 3), (9, 5), (40, 1), (3, BLOCK_Q)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("heads", [(4, 2, 32), (8, 2, 24), (2, 2, 16)])
@pytest.mark.parametrize("num_splits", [1, 3, 8])
def test_matches_the_reference_with_padding(dtype, heads, num_splits):
    """With key splits too: 3 leaves a block's last split short, 8 leaves the short rows' later
    splits with no keys at all (and a block's early tokens none in its later splits)."""
    if dtype == torch.float64 and DEVICE == "cuda":
        pytest.skip("float64 is the CPU parity dtype")
    num_heads, num_kv_heads, head_dim = heads
    query, kv, tables, qsl, positions, token_seq, real = make_step(
        ROWS, padding_rows=3, padding_tokens=7, page_size=4, num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype, seed=num_heads + head_dim)
    out = torch.full_like(query, float("nan"))
    scale = head_dim**-0.5
    meeting = KeptZeros()
    result = paged_varlen_attention(query, kv, tables, qsl, positions, scale, out=out,
                                    num_splits=num_splits, meeting=meeting)
    assert result.data_ptr() == out.data_ptr()
    ref = paged_attention_ref(query[:real], kv, tables[:len(ROWS)], token_seq,
                              positions[:real], scale)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(out[:real], ref, atol=tolerance, rtol=tolerance)
    assert torch.isnan(out[real:]).all()  # padding tokens are left alone
    counts = [t for t in meeting._tensors.values() if t.dtype == torch.int32]
    assert all(int(t.abs().sum()) == 0 for t in counts)  # the counters left at zero


def test_split_launches_reuse_their_scratch_like_a_replayed_graph():
    """A second launch on the same kept scratch and counters (as a captured graph replays)
    over other keys gives that step's answer, not a mix with the first's partials."""
    meeting = KeptZeros()
    answers = []
    for seed in (1, 2):
        query, kv, tables, qsl, positions, token_seq, real = make_step(
            ROWS, padding_rows=1, padding_tokens=3, page_size=4, num_heads=4, num_kv_heads=2,
            head_dim=16, dtype=torch.float64, seed=seed)
        got = paged_varlen_attention(query, kv, tables, qsl, positions, 0.25, num_splits=4,
                                     meeting=meeting)[:real]
        torch.testing.assert_close(got, paged_attention_ref(
            query[:real], kv, tables[:len(ROWS)], token_seq, positions[:real], 0.25),
            atol=1e-12, rtol=1e-12)
        answers.append(got)
    assert len(meeting._tensors) == 3 and not torch.equal(answers[0], answers[1])


@pytest.mark.parametrize(("tokens", "rows", "expected"), [
    (256, 8, 3),  # the 256-token prefill bucket (8 rows): 48 programs, 3 splits to 144
    (512, 32, 2),  # the 512-token bucket with 16 decode rows (a hit beside them): 128 programs
    (2048, 16, 1),  # a full prefill budget covers the SMs with query blocks alone
    (1024, 16, 1),  # 160 programs
    (128, 4, 6),  # 24 programs
    (16, 1, 8),  # capped at MAX_SPLITS
])
def test_splits_for_covers_every_sm_with_the_fewest_splits(tokens, rows, expected):
    assert splits_for(tokens, rows, num_kv_heads=2, num_sms=132) == expected


def test_split_counts_outside_one_to_eight_are_refused():
    query, kv, tables, qsl, positions, _, _ = make_step(
        [(0, 2)], padding_rows=0, padding_tokens=0, page_size=4, num_heads=2, num_kv_heads=2,
        head_dim=16, dtype=torch.float32)
    with pytest.raises(ValueError, match="num_splits 9"):
        paged_varlen_attention(query, kv, tables, qsl, positions, 0.25, num_splits=9)


def test_a_row_sees_only_its_own_pages_up_to_each_tokens_position():
    """Poisoning every other page, and the keys after each token, changes nothing."""
    query, kv, tables, qsl, positions, token_seq, real = make_step(
        [(2, 9)], padding_rows=0, padding_tokens=0, page_size=4, num_heads=4, num_kv_heads=2,
        head_dim=16, dtype=torch.float32, seed=3)
    clean = paged_varlen_attention(query, kv, tables, qsl, positions, 0.25)
    poisoned = kv.clone()
    used = set(tables[0, :3].tolist())
    for page in range(kv.shape[0]):
        if page not in used:
            poisoned[page] = float("nan")
    last_page, last_slot = tables[0, 2].item(), (2 + 9) % 4
    poisoned[last_page, :, last_slot:] = float("nan")  # past the row's last key
    torch.testing.assert_close(paged_varlen_attention(query, poisoned, tables, qsl, positions,
                                                      0.25), clean)
