"""Each row's argmax of [rows, vocab] logits in one launch spread over the whole GPU: the greedy
token of every decode step (knob `argmax`).

torch's argmax over a 248k vocabulary took 8.5 / 14.3 / 29.4 / 80.2 µs at 1 / 16 / 64 / 256
rows inside a captured graph on the H200 (results/2026-12-04-h200-race-v3, `argmax alone`):
29.4 µs reads 64 rows' 32 MB at ~1.1 TB/s, a quarter of the copy bandwidth, and one row's
0.5 MB takes 8.5 µs. Here a program takes BLOCK ids of one row (a [rows, blocks] grid: 61
programs a row at 248k, 3.9k at 64 rows), leaves its block's best value and id, and the last
program of a row to arrive (an atomic counter, gdc.last_to_arrive) picks the row's best of
those. No host read, fixed scratch (KeptZeros): a captured graph holds it.

The same token as torch.argmax: the largest value, the first id among equal ones (ties break to
the left inside a block, and across blocks to the lower block). A NaN counts as the largest
value, as in torch (it is made +inf before the compare: Triton's max would skip it and could
answer an id past the vocabulary); a row holding both +inf and NaN gives the first of either
(torch: the first NaN). Values are compared in fp32, which orders bf16, fp16 and fp32 exactly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resident.kernels.gdc import KeptZeros, last_to_arrive, pdl_wait_then_release
from resident.kernels.pdl import launch_options

BLOCK = 4096  # ids a program reads: 8 KB of bf16, 32 a thread at 4 warps
NUM_WARPS = 4


@triton.jit
def _rows_argmax_kernel(logits, out, best_values, best_ids, counts, vocab, stride_row,
                        NUM_BLOCKS: tl.constexpr, BLOCKS_P2: tl.constexpr, BLOCK: tl.constexpr,
                        USE_PDL: tl.constexpr):
    row, block = tl.program_id(0), tl.program_id(1)
    ids = block * BLOCK + tl.arange(0, BLOCK)
    pdl_wait_then_release(USE_PDL)
    values = tl.load(logits + row * stride_row + ids, mask=ids < vocab,
                     other=float("-inf")).to(tl.float32)
    values = tl.where(values != values, float("inf"), values)  # NaN first, as torch
    best, index = tl.max(values, axis=0, return_indices=True,
                         return_indices_tie_break_left=True)
    tl.store(best_values + row * BLOCKS_P2 + block, best)
    tl.store(best_ids + row * BLOCKS_P2 + block, block * BLOCK + index)
    if last_to_arrive(counts + row, NUM_BLOCKS):
        blocks = tl.arange(0, BLOCKS_P2)
        held = blocks < NUM_BLOCKS
        # .cg: the other programs' stores, past this SM's L1
        block_bests = tl.load(best_values + row * BLOCKS_P2 + blocks, mask=held,
                              other=float("-inf"), cache_modifier=".cg")
        first = tl.argmax(block_bests, axis=0, tie_break_left=True)
        winner = tl.load(best_ids + row * BLOCKS_P2 + first, cache_modifier=".cg")
        tl.store(out + row, winner.to(tl.int64))
        tl.store(counts + row, 0)


class RowsArgmax:
    """argmax(logits, dim=-1) on the Triton kernel, its scratch kept per row count (made at
    the first call of each, so a graph's warm-up makes it before the capture)."""

    def __init__(self, pdl: bool = False, block: int = BLOCK) -> None:
        """block: ids a program reads (a power of two; tests shrink it to split a tiny
        vocabulary into several blocks)."""
        if block < 16 or block & (block - 1):
            raise ValueError(f"RowsArgmax block must be a power of two >= 16, got {block}")
        self.pdl, self.block = pdl, block
        self._scratch = KeptZeros()

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: [rows, vocab] (unit stride along the vocabulary); returns [rows] int64."""
        if logits.dim() != 2 or logits.stride(1) != 1:
            raise ValueError(f"RowsArgmax takes [rows, vocab] logits contiguous along the "
                             f"vocabulary, got shape {tuple(logits.shape)} strides "
                             f"{logits.stride()}")
        rows, vocab = logits.shape
        out = torch.empty(rows, dtype=torch.int64, device=logits.device)
        if rows == 0:
            return out
        num_blocks = triton.cdiv(vocab, self.block)
        blocks_p2 = triton.next_power_of_2(num_blocks)
        device = logits.device
        best_values = self._scratch.get((rows, blocks_p2), torch.float32, device)
        best_ids = self._scratch.get((rows, blocks_p2), torch.int32, device)
        counts = self._scratch.get((rows,), torch.int32, device)
        _rows_argmax_kernel[(rows, num_blocks)](
            logits, out, best_values, best_ids, counts, vocab, logits.stride(0),
            NUM_BLOCKS=num_blocks, BLOCKS_P2=blocks_p2, BLOCK=self.block,
            num_warps=NUM_WARPS, **launch_options(self.pdl))
        return out

