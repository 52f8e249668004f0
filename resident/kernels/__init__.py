"""Kernels behind the model's ops. Each op has a torch reference (CPU, tests, eager fallback);
faster implementations take the same signature."""

from __future__ import annotations

import torch

# the Gumbel noise's -log(1 - w) by its series below this w (to w**8 / 8): the torch reference
# (engine/draw.py gumbel_from_bits) and the Triton race (gumbel_race.py) switch at one value
SERIES_BELOW = 0.125
# The interpreter has no SMs: a rule that sizes a grid by them (varlen_splits, decode_splits)
# picks there as on a device this size, so the CPU tests take the kinds of launch a GPU does
# (many key splits at one row, half tiles, one split in a wide bucket). A small device: the
# interpreter runs a grid's programs one after another (~15 ms each for decode attention's),
# and at 64 SMs a 1-row bucket's 128 of them, mostly empty splits, were a third of the CPU
# engine tests' time.
INTERPRETER_SMS = 16


def device_sms(device: torch.device) -> int:
    """The SMs a launch's grid is sized for: the CUDA device's, INTERPRETER_SMS elsewhere."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return INTERPRETER_SMS


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the kernels and their torch references compute, accumulate and keep state in for
    tensors of `dtype` (gdn_state_dtype's auto too): float32, float64 for a float64 model (the
    CPU's exact runs)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def triton_compute_dtype(dtype: torch.dtype):
    """compute_dtype as Triton's dtype: a kernel's COMPUTE constexpr."""
    import triton.language as tl  # only the Triton kernels ask: triton is an extra

    return getattr(tl, str(compute_dtype(dtype)).removeprefix("torch."))


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision for operands of `dtype`: full precision for fp32 and fp64
    (tl.dot's default, tf32, rounds fp32 operands to 10 mantissa bits, ~1e-3 relative on the
    GPU: a float32 model's projections and attention would lose what cuBLAS keeps), tf32 (a
    no-op) for 16-bit ones."""
    return "ieee" if dtype in (torch.float32, torch.float64) else "tf32"
