"""Programmatic dependent launch (PDL, Hopper and later) for the decode step's Triton kernels.

A kernel launched with PDL may start while the kernel before it in the stream is still running:
its programs are placed as soon as every program of the one before has signalled
(`gdc_launch_dependents`) and the SMs have room. It must therefore wait (`gdc_wait`: until the
kernel before has finished and its writes are visible) before it reads anything an earlier
kernel wrote or writes anything an earlier kernel reads. What it does before that wait (load
its weights, which no kernel writes) overlaps the kernel before. CUDA graphs keep the launch
attribute as a programmatic edge, so a captured decode step overlaps its kernels' starts.

Every kernel that takes `USE_PDL` calls `gdc.pdl_wait_then_release` before its first access to
step data, so the rule holds whatever kernel precedes it (a kernel launched without PDL waits
for the one before as usual; the wait is then a no-op). Since each releases the next only
after its own wait (Inductor's kernels too: their release follows their first load, which
follows their wait), a kernel starts only once every kernel two or more back has finished:
before its wait it may read what those wrote (the fused GDN layer reads its state block,
which only its own launch of the step before wrote), never what the kernel just before
writes. Under the interpreter (CPU) there is no
PDL: `pdl_available` gives False and the constexpr branches vanish.

This module decides, without importing triton (a CPU install has none: the engine imports it);
the in-kernel helpers are in gdc.py.
"""

from __future__ import annotations

import os

import torch


def pdl_available(device: torch.device) -> bool:
    """Whether kernels on `device` can be launched with PDL: a CUDA device of compute
    capability 9.0 or later, compiled (not interpreted)."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def pdl_on(knob: str, device: torch.device) -> bool:
    """What the `pdl` knob (auto | off) gives on `device`: the one place it is decided, for
    the decode kernels and Inductor's alike."""
    return knob == "auto" and pdl_available(device)


def launch_options(pdl: bool) -> dict:
    """The launch keywords for a kernel that takes USE_PDL: the constexpr and, where PDL is on,
    the launch attribute (the interpreter takes no launch_pdl)."""
    return {"USE_PDL": pdl, "launch_pdl": True} if pdl else {"USE_PDL": False}
