"""The publish kernel of engine/token_ring.py (its torch reference is there): a decode step's
tokens stored into pinned host memory by the step's own graph, as its last kernel, into the
slot a device count picks, stamped with that count. Pinned memory is mapped into the device's
address space (unified addressing), so the kernel stores straight into it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # bytes a loop iteration stores


@triton.jit
def _publish_kernel(src, ring, ring_words, count_cell, num_bytes, SLOT_BYTES: tl.constexpr,
                    HEADER: tl.constexpr, SLOTS: tl.constexpr, BLOCK: tl.constexpr):
    count = tl.load(count_cell)
    slot = count % SLOTS
    # over the slot's room, masked to num_bytes: one compiled kernel serves every bucket
    for start in tl.static_range(0, SLOT_BYTES - HEADER, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        inside = offsets < num_bytes
        tl.store(ring + slot * SLOT_BYTES + HEADER + offsets,
                 tl.load(src + offsets, mask=inside), mask=inside)
    tl.store(ring_words + slot * (SLOT_BYTES // 8), count)
    # every thread has read the count before any writes the next one
    tl.debug_barrier()
    tl.store(count_cell, count + 1)


def publish_triton(src: torch.Tensor, ring: torch.Tensor, count: torch.Tensor, header: int,
                   slots: int) -> None:
    """src: [n] uint8 on the device; ring: [slots * slot_bytes] uint8, pinned (under the
    interpreter, on the CPU), each slot `header` bytes (its first int64 the stamp) then the
    published bytes; count: [1] int64 on the device. Writes src into slot count % slots,
    stamps it with count, adds one to count. One program of one warp: a decode step publishes
    at most draw.PACKED_ROW_BYTES a row."""
    slot_bytes = ring.shape[0] // slots
    _publish_kernel[(1,)](src, ring, ring.view(torch.int64), count, src.shape[0],
                          SLOT_BYTES=slot_bytes, HEADER=header, SLOTS=slots, BLOCK=BLOCK,
                          num_warps=1)
