"""Programmatic dependent launch (PDL, Hopper and later) for the decode step's Triton kernels.

A kernel launched with PDL may start while the kernel before it in the stream is still running:
its programs are placed as soon as every program of the one before has signalled
(`gdc_launch_dependents`) and the SMs have room. It must therefore wait (`gdc_wait`: until the
kernel before has finished and its writes are visible) before it reads anything an earlier
kernel wrote or writes anything an earlier kernel reads. What it does before that wait (load
its weights, which no kernel writes) overlaps the kernel before. CUDA graphs keep the launch
attribute as a programmatic edge, so a captured decode step overlaps its kernels' starts.

Every kernel here that takes `USE_PDL` calls `pdl_wait_then_release` before its first access
to step data, so the rule holds whatever kernel precedes it (a kernel launched without PDL
waits for the one before as usual; the wait is then a no-op). Under the interpreter (CPU) there
is no PDL: `pdl_launch` gives False and the constexpr branches vanish.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def pdl_available(device: torch.device) -> bool:
    """Whether kernels on `device` can be launched with PDL: a CUDA device of compute
    capability 9.0 or later, compiled (not interpreted)."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def launch_options(pdl: bool) -> dict:
    """The launch keywords for a kernel that takes USE_PDL: the constexpr and, where PDL is on,
    the launch attribute (the interpreter takes no launch_pdl)."""
    return {"USE_PDL": pdl, "launch_pdl": True} if pdl else {"USE_PDL": False}


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
