"""The grid dependency control a kernel launched with programmatic dependent launch uses
inside it (pdl.py says when and why): the wait on the kernel before, the release of the next,
and an L2 prefetch for what may be read before the wait."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def pdl_wait_then_release(USE_PDL: tl.constexpr):
    """Wait for the kernel before (its writes visible), then let the next kernel's programs be
    placed: from here on they can only wait for this one to finish."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def prefetch_l2(rows, row_bytes):
    """Starts copying each row [addr, addr + row_bytes) of a tensor of row pointers into the L2
    (`cp.async.bulk.prefetch.L2`, sm_90: no registers, no wait). Addresses and byte counts must
    be multiples of 16. For a kernel's weights, before its PDL wait: no kernel writes them, so
    their read from memory overlaps the kernel before."""
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;", "=r,l,r",
        [rows, row_bytes], dtype=tl.int32, is_pure=False, pack=1)
