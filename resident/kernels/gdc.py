"""How a kernel's programs order themselves against other kernels and each other: the grid
dependency control a kernel launched with programmatic dependent launch uses inside it (pdl.py
says when and why: the wait on the kernel before, the release of the next, and an L2 prefetch
for what may be read before the wait), and the meeting at an atomic counter where the last
program of a group finishes the group's work (last_to_arrive: the fused GDN layer, the GEMV's
add + norm epilogue, decode attention's merged combine, the sampler's judges), its counters
and scratch kept zeroed between launches on the host (KeptZeros)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def pdl_wait_then_release(USE_PDL: tl.constexpr):
    """Wait for the kernel before (its writes visible), then let the next kernel's programs be
    placed: from here on they can only wait for this one to finish."""
    pdl_wait(USE_PDL)
    pdl_release(USE_PDL)


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr):
    """Wait for the kernel before (its writes visible), the next kernel not yet released: a
    short kernel that calls pdl_release only at its end keeps the next one's early start (its
    weights' prefetch, its programs waiting on the SMs) off its own run (kernels/add_norm.py)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def pdl_release(USE_PDL: tl.constexpr):
    """Let the next kernel's programs be placed; only after this program's pdl_wait."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def prefetch_l2(starts, num_bytes):
    """Starts copying each [start, start + num_bytes) of a tensor of addresses into the L2
    (`cp.async.bulk.prefetch.L2`, sm_90: no registers, no wait); an element of 0 bytes issues
    nothing. Addresses and byte counts must be multiples of 16. Every thread issues its own
    elements, replicas included: a tensor smaller than the program's threads is held whole by
    each warp and so copied once per warp, hence one element a thread (gemv._prefetch_rows).
    For a kernel's weights, before its PDL wait: no kernel writes them, so their read from
    memory overlaps the kernel before."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.u32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; }"
        " mov.u32 $0, 0;", "=r,l,r", [starts, num_bytes], dtype=tl.int32, is_pure=False,
        pack=1)


@triton.jit
def last_to_arrive(counter, num_programs):
    """Counts this program in at `counter` (int32, zero before the first of `num_programs`
    programs arrives) once all its threads' stores are out; whether it is the last to arrive,
    the one that may read what the others stored (with cache_modifier=".cg": L1 is not
    coherent across SMs) and must set the counter back to 0 for the next launch. The release
    and acquire of the atomic order the others' stores before that read."""
    tl.debug_barrier()
    return tl.atomic_add(counter, 1, sem="acq_rel") == num_programs - 1


class KeptZeros:
    """Zeroed tensors made at the first ask for each (shape, dtype) and kept: where a kernel's
    programs meet (counters they count in at with last_to_arrive and leave at zero) and what
    they leave each other, at addresses a captured graph holds."""

    def __init__(self) -> None:
        self._tensors: dict[tuple[tuple[int, ...], torch.dtype], torch.Tensor] = {}

    def get(self, shape: tuple[int, ...], dtype: torch.dtype,
            device: torch.device) -> torch.Tensor:
        key = (tuple(shape), dtype)
        if key not in self._tensors:
            self._tensors[key] = torch.zeros(shape, dtype=dtype, device=device)
        return self._tensors[key]
