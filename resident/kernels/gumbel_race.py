"""The draw's race as one Triton kernel: for each row, the argmax over the vocabulary of the
filtered logits plus counter-based Gumbel noise, tokens under the row's floor (min-p) left out.
The same contract as engine/draw.py's `race` (its torch reference, which materialises the noise:
a dozen [rows, vocab] int64 passes), in one read of the logits: the noise is hashed in registers,
MurmurHash3's 32-bit finalizer in uint32 arithmetic, the same bits as the reference's.

A row is split into chunks (grid rows x chunks), each giving its best score and index; a second,
[rows, chunks]-sized step picks the row's best. Static grid, no host read: a graph can hold it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from resident.kernels import SERIES_BELOW

MAX_CHUNK = 8192  # vocabulary ids a program scans
MAX_BLOCK = 1024  # ids a loop iteration loads
_SERIES_BELOW = tl.constexpr(SERIES_BELOW)


@triton.jit
def _mix32(x):
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    return x ^ (x >> 16)


@triton.jit
def _log(x, FAST: tl.constexpr):
    """FAST (CUDA): lg2.approx, one MUFU op; libdevice's logf is ~20 instructions with
    branches, and two an element made the race compute-bound (~1,000 PTX instructions for a
    thread's 8 ids). Its absolute error (~2e-7) is relative error where _gumbel takes it: of
    an E of at least 0.13, and of the noise itself. The interpreter cannot run libdevice."""
    if FAST:
        return libdevice.fast_logf(x)
    return tl.log(x)


@triton.jit
def _gumbel(bits, FAST: tl.constexpr):
    """draw.gumbel_from_bits of uint32 bits, in registers."""
    w = (bits.to(tl.float32) + 0.5) * 2.3283064365386963e-10  # 2**-32
    tail = 1 / 4 + w * (1 / 5 + w * (1 / 6 + w * (1 / 7)))
    series = w * (1 + w * (1 / 2 + w * (1 / 3 + w * tail)))
    exponential = tl.where(w < _SERIES_BELOW, series, -_log(1 - w, FAST))
    return -_log(exponential, FAST)


@triton.jit
def _race_kernel(scores, stride, keys, floors, best_values, best_ids, vocab, num_chunks,
                 CHUNK: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    key = tl.load(keys + row).to(tl.uint32)
    floor = tl.load(floors + row)
    best_value = float("-inf")
    best_id = 0
    for start in tl.static_range(0, CHUNK, BLOCK):
        ids = chunk * CHUNK + start + tl.arange(0, BLOCK)
        inside = ids < vocab
        x = tl.load(scores + row * stride + ids, mask=inside, other=float("-inf")).to(tl.float32)
        noisy = x + _gumbel(_mix32(key + ids.to(tl.uint32) * 0x9E3779B9), FAST)  # GOLDEN32
        noisy = tl.where(inside & (x >= floor), noisy, float("-inf"))
        value = tl.max(noisy, axis=0)
        index = tl.argmax(noisy, axis=0)
        better = value > best_value  # the first block wins ties, as torch.argmax's first index
        best_id = tl.where(better, start + index, best_id)
        best_value = tl.where(better, value, best_value)
    tl.store(best_values + row * num_chunks + chunk, best_value)
    tl.store(best_ids + row * num_chunks + chunk, chunk * CHUNK + best_id)


def gumbel_race_triton(scores: torch.Tensor, keys: torch.Tensor,
                       floors: torch.Tensor) -> torch.Tensor:
    """scores: [rows, vocab] (a float dtype, unit stride along the vocabulary), -inf where
    filtered out; keys: [rows] int64 in [0, 2**32); floors: [rows] float32. Returns [rows]
    int64: each row's argmax of scores + Gumbel(key, id) over the ids whose score >= floor."""
    if scores.stride(1) != 1:
        raise ValueError("scores must be contiguous along the vocabulary")
    rows, vocab = scores.shape
    chunk = min(MAX_CHUNK, triton.next_power_of_2(vocab))
    block = min(MAX_BLOCK, chunk)
    num_chunks = triton.cdiv(vocab, chunk)
    best_values = torch.empty(rows, num_chunks, dtype=torch.float32, device=scores.device)
    best_ids = torch.empty(rows, num_chunks, dtype=torch.int64, device=scores.device)
    _race_kernel[(rows, num_chunks)](scores, scores.stride(0), keys, floors, best_values,
                                     best_ids, vocab, num_chunks, CHUNK=chunk, BLOCK=block,
                                     FAST=scores.is_cuda)
    return best_ids.gather(1, best_values.argmax(dim=1, keepdim=True)).squeeze(1)


@triton.jit
def _noise_kernel(bits, out, n, BLOCK: tl.constexpr, FAST: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    value = tl.load(bits + offs, mask=offs < n, other=0).to(tl.uint32)
    tl.store(out + offs, _gumbel(value, FAST), mask=offs < n)


def gumbel_of_bits(bits: torch.Tensor) -> torch.Tensor:
    """The kernels' noise (_gumbel) of [n] int64 bits in [0, 2**32): what tests hold against
    draw.gumbel_from_bits, on CUDA with its fast logs."""
    out = torch.empty(bits.shape[0], dtype=torch.float32, device=bits.device)
    block = 1024
    _noise_kernel[(triton.cdiv(bits.shape[0], block),)](bits, out, bits.shape[0], BLOCK=block,
                                                         FAST=bits.is_cuda)
    return out
