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

MAX_CHUNK = 8192  # vocabulary ids a program scans
MAX_BLOCK = 1024  # ids a loop iteration loads


@triton.jit
def _mix32(x):
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    return x ^ (x >> 16)


@triton.jit
def _race_kernel(scores, stride, keys, floors, best_values, best_ids, vocab, num_chunks,
                 CHUNK: tl.constexpr, BLOCK: tl.constexpr):
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
        bits = _mix32(key + ids.to(tl.uint32) * 0x9E3779B9)  # draw.GOLDEN32
        uniform = ((bits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
        noisy = x - tl.log(-tl.log(uniform))
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
                                     best_ids, vocab, num_chunks, CHUNK=chunk, BLOCK=block)
    return best_ids.gather(1, best_values.argmax(dim=1, keepdim=True)).squeeze(1)
