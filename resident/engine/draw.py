"""The batched draw: every sampling row of a step in one pass over [rows, vocab] logits, from
per-row parameter tensors, with no host sync and no per-row launch.

A row's temperature divides its logits (a row at temperature 0 takes its greedy token); top-k,
top-p and min-p set the dropped tokens to -inf (the filter); the token is the argmax of the
filtered logits plus Gumbel noise, which draws from their softmax (the Gumbel-max trick: the
same race as argmax(probs / Exp(1)), in log space, with no softmax).

The filters are joint: a token stays when it is among the top k, inside the top-p nucleus of the
whole distribution (the mass ranked above it is under top_p) and within min_p of the top
token's probability. Each keeps an upper set of the row, so together they keep the smallest of
the three (FlashInfer's `joint` order; vLLM and Hugging Face apply top-p to the top-k survivors
renormalised, which keeps fewer tokens when both are set). The joint order is what lets the
`triton` sampler draw without a filter pass (kernels/nucleus_race.py).

The noise is counter-based: each element's uniform is a 32-bit integer hash of (the request's
seed, the token's index in its request's output, the vocabulary id), computed with torch integer
ops on the device. A request's draws therefore depend on nothing else in its step (its row, its
neighbours, its bucket), so a seed gives the same tokens in any batch, on either planning arm.

Three samplers, chosen by name (knob `sampler`): `torch`, exact on CPU and CUDA from one sort of
the whole batch; `flashinfer` (CUDA), FlashInfer's top-p renorm and top-k mask kernels, which
need no sort; `triton` (CUDA), a rejection race with no filter pass (kernels/nucleus_race.py).
All draw with the same noise, so on the same logits they give the same tokens up to float
rounding at a cutoff.

The race is the one pass that must be fast at a 248k vocabulary: on CUDA it is a Triton kernel
(kernels/gumbel_race.py) that hashes the noise in registers; `race` here is its torch reference
(CPU), the same bits.

A row whose scaled logits are not finite (NaN logits, or a temperature so small that they
overflow float32, such as 1e-40) is reported in `failed` and keeps its greedy token: its request
fails alone, and its NaNs are zeroed before the filter, so no kernel meets them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from resident.kernels import SERIES_BELOW

MASK32 = 0xFFFFFFFF
GOLDEN32 = 0x9E3779B9  # spreads consecutive counters over the 32-bit ring
SAMPLERS = ("torch", "flashinfer", "triton")


class RowParams(NamedTuple):
    """A step's per-row sampling parameters on the device, [rows] each."""

    temperature: torch.Tensor  # float32; <= 0: greedy
    top_k: torch.Tensor  # int64; 0: off
    top_p: torch.Tensor  # float32; 1: off
    min_p: torch.Tensor  # float32; 0: off
    seed: torch.Tensor  # int64: the request's 64-bit seed (two's complement)
    index: torch.Tensor  # int64: the index of the token drawn in its request's output


class Drawn(NamedTuple):
    tokens: torch.Tensor  # [rows] int64
    failed: torch.Tensor  # [rows] bool: a sampled row whose logits were not finite
    # where both live when the draw wrote them into one allocation (packed_drawn): the whole
    # draw's [PACKED_ROW_BYTES * its rows] bytes, so that one copy reads tokens and failures
    # back; else None
    packed: torch.Tensor | None = None

    def first(self, num_rows: int) -> Drawn:
        """The first num_rows rows' (views; itself when it holds no more: a full bucket's
        step makes no view, each of which costs ~1-2 us of host time). `packed` stays the
        whole draw's."""
        if num_rows == self.tokens.shape[0]:
            return self
        return Drawn(self.tokens[:num_rows], self.failed[:num_rows], self.packed)


PACKED_ROW_BYTES = 9  # a packed draw's bytes a row: its int64 token, then its failure byte


def packed_bytes(num_rows: int) -> int:
    """A packed draw's size in bytes (packed_drawn's layout)."""
    return PACKED_ROW_BYTES * num_rows


def split_packed(packed, num_rows: int) -> tuple:
    """(the [num_rows] int64 tokens, the [num_rows] bool failures) of a packed draw's bytes, as
    views: a device tensor's or a host numpy array's."""
    failures_at = 8 * num_rows
    if isinstance(packed, torch.Tensor):
        return packed[:failures_at].view(torch.int64), packed[failures_at:].view(torch.bool)
    return packed[:failures_at].view(np.int64), packed[failures_at:].view(bool)


def packed_drawn(num_rows: int, device: torch.device) -> Drawn:
    """A draw's outputs in one allocation, [num_rows] int64 tokens then [num_rows] bool
    failures: a read-back then costs one device-to-host copy, not two (each ~10 µs of host
    time on the H100's host; results/2026-12-05-h100-core-spy)."""
    packed = torch.empty(packed_bytes(num_rows), dtype=torch.uint8, device=device)
    return Drawn(*split_packed(packed, num_rows), packed)


def mix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finalizer on int64 tensors holding values in [0, 2**32): products
    wrap in int64 and are masked back to their low 32 bits, which wrapping leaves exact."""
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & MASK32
    return x ^ (x >> 16)


def vocab_counters(vocab_size: int, device: torch.device) -> torch.Tensor:
    """[vocab] int64: each vocabulary id's counter, made once per sampler."""
    return (torch.arange(vocab_size, dtype=torch.int64, device=device) * GOLDEN32) & MASK32


def row_keys(seed: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """[rows] int64 in [0, 2**32): one key per (seed, token index)."""
    low, high = seed & MASK32, (seed >> 32) & MASK32
    key = mix32((index * GOLDEN32) & MASK32)
    key = mix32((key + high) & MASK32)
    return mix32((key ^ low) & MASK32)


def gumbel_noise(keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """[rows, vocab] float32 Gumbel(0, 1) noise from each row's key and each id's counter."""
    return gumbel_from_bits(mix32((keys[:, None] + counters[None, :]) & MASK32))


def gumbel_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """float32 Gumbel(0, 1) noise -log(E) from 32 random bits (int64 in [0, 2**32)), E the
    Exp(1) variate -log(1 - w) of the uniform w = (bits + 0.5) / 2**32.

    A race is won by a small E (against its token's probability), so E keeps all 32 bits
    where it is small: w is exact there, and E is its series, to fp32's last bit. The 24-bit
    uniform u = (b + 0.5) / 2**24 this replaced rounded to 1.0 at b = 2**24 - 1 (b + 0.5 needs
    25 bits): E was 0 and the noise +inf once in 2**24 ids, so 1.5% of a 248k-id row's draws
    went to an arbitrary token, filtered out or not. Here only w = 1.0 (the top 128 bit
    patterns) is degenerate, and it gives E = inf, noise -inf: that id cannot win."""
    w = (bits.to(torch.float32) + 0.5) * 2.0**-32  # in (0, 1]
    tail = 1 / 4 + w * (1 / 5 + w * (1 / 6 + w * (1 / 7)))
    series = w * (1 + w * (1 / 2 + w * (1 / 3 + w * tail)))
    exponential = torch.where(w < SERIES_BELOW, series, -torch.log(1 - w))
    return -torch.log(exponential)


def scale(logits: torch.Tensor, params: RowParams) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 logits / temperature ([rows, vocab]; greedy rows divided by 1) and each sampled
    row's failure (its scaled logits not finite); a failed row's logits are zeroed."""
    sampled = params.temperature > 0
    divisor = torch.where(sampled, params.temperature, torch.ones_like(params.temperature))
    scaled = logits.float() / divisor[:, None]
    failed = sampled & ~torch.isfinite(scaled.amax(dim=-1))
    return scaled.masked_fill(failed[:, None], 0.0), failed


def filter_torch(scaled: torch.Tensor, params: RowParams) -> torch.Tensor:
    """Top-k and top-p, jointly, over one descending sort of the batch: each row's cutoff is the
    smallest logit both keep; top-p keeps a token while the tokens ranked before it sum below
    top_p (so the top token always stays). Returns the cutoff, [rows, 1]."""
    vocab = scaled.shape[-1]
    ordered, _ = scaled.sort(dim=-1, descending=True)
    keep_k = torch.where(params.top_k > 0, params.top_k.clamp(max=vocab),
                         torch.full_like(params.top_k, vocab))  # [rows]
    probs = torch.softmax(ordered, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of the tokens ranked above each
    keep_p = (before < params.top_p[:, None]).sum(dim=-1).clamp(min=1)  # [rows]
    kept = torch.minimum(keep_k, keep_p)
    return ordered.gather(1, (kept - 1)[:, None])


def filter_flashinfer(scaled: torch.Tensor, params: RowParams) -> torch.Tensor:
    """The same filter on FlashInfer's kernels, without a sort: its top-p renorm of the softmax,
    then its top-k mask of their logs. Returns the filtered log-probabilities (-inf where
    dropped)."""
    from flashinfer.sampling import top_k_mask_logits, top_p_renorm_probs

    vocab = scaled.shape[-1]
    top_k = torch.where(params.top_k > 0, params.top_k.clamp(max=vocab),
                        torch.full_like(params.top_k, vocab)).to(torch.int32)
    # the parameters are columns of one block (strided): FlashInfer reads them contiguous
    probs = top_p_renorm_probs(torch.softmax(scaled, dim=-1), params.top_p.contiguous())
    return top_k_mask_logits(torch.log(probs), top_k)


def race(filtered: torch.Tensor, keys: torch.Tensor, floors: torch.Tensor,
         counters: torch.Tensor) -> torch.Tensor:
    """[rows] int64: each row's argmax of filtered + Gumbel noise over the ids at or above its
    floor (the reference of kernels/gumbel_race.py)."""
    kept = filtered.masked_fill(filtered < floors[:, None], float("-inf"))
    return (kept + gumbel_noise(keys, counters)).argmax(dim=-1)


def draw(logits: torch.Tensor, params: RowParams, greedy: torch.Tensor,
         counters: torch.Tensor, sampler: str = "torch", fused: bool = False,
         meeting=None, pdl: bool = False) -> Drawn:
    """logits: [rows, vocab]; greedy: their argmax ([rows], left as it is); counters:
    vocab_counters; fused: the race on the Triton kernel; meeting: the `triton` race's kept
    counters (a kernels.gdc.KeptZeros, or None: zeroed each draw); pdl: the race's kernels
    launched with programmatic dependent launch (CUDA, Hopper on). Each row's token: greedy at
    temperature <= 0, else drawn (module docstring). Reads nothing back and allocates only
    temporaries: a CUDA graph can hold it."""
    if sampler == "triton":  # imported here: triton must not load before TRITON_INTERPRET is set
        from resident.kernels.nucleus_race import nucleus_race

        out = packed_drawn(logits.shape[0], logits.device)
        nucleus_race(logits, *params, greedy, meeting=meeting, out=out[:2], pdl=pdl)
        return out
    scaled, failed = scale(logits, params)
    if sampler == "flashinfer":
        filtered = filter_flashinfer(scaled, params)
    else:
        filtered = scaled.masked_fill(scaled < filter_torch(scaled, params), float("-inf"))
    # min-p: drop what is under min_p times the top token's probability
    floors = filtered.amax(dim=-1) + torch.log(params.min_p)
    keys = row_keys(params.seed, params.index)
    if fused:  # imported here: triton must not load before TRITON_INTERPRET is set
        from resident.kernels.gumbel_race import gumbel_race_triton

        drawn = gumbel_race_triton(filtered, keys, floors)
    else:
        drawn = race(filtered, keys, floors, counters)
    tokens = torch.where((params.temperature > 0) & ~failed, drawn, greedy)
    return Drawn(tokens, failed)
