"""GPU time of the padded steps' attention (kernels/varlen_attention.py) at the 0.8B's heads
(8 query heads over 2 kv heads of 256), captured as a CUDA graph as the engine replays it, with
one program a query block and with its keys split (varlen_splits: splits_for's count, and
2, 4 and 8), for the loads the prefix cache makes: a 256-token hit over a 1,024-token
prefix alone, the same beside 16 decode rows, and a 2,048-token fresh prompt. splits_for is
given the rows of the engine's bucket for each (engine/varlen.py: PaddedBucket, the 0.8B's
defaults), whose padding rows the engine's grid holds too. Also checks each split count against
one program a block (bf16 rounding apart):
    python3 tests/gpu/time_varlen.py"""

from __future__ import annotations

import functools

import torch

from resident.config import EngineConfig
from resident.engine.varlen import PaddedBucket
from resident.kernels import device_sms
from resident.kernels.gdc import KeptZeros
from resident.kernels.varlen_attention import MAX_SPLITS, paged_varlen_attention, splits_for
from resident.model.config import load_model_config
from resident.tools.bench_attention import graph_time_us

PAGE = 16
HEADS, KV_HEADS, HEAD_DIM = 8, 2, 256
# (name, [(stored keys, new tokens) a row], the bucket's tokens)
LOADS = [("hit 1024+256", [(1024, 256)], 256),
         ("hit beside 16 decode rows", [(1024, 256)] + [(1300, 1)] * 16, 512),
         ("fresh 2048", [(0, 2048)], 2048)]


def step(rows: list[tuple[int, int]], bucket: int, device: torch.device):
    """The kernel's inputs for rows laid out as a padded step of `bucket` tokens."""
    counts = [-(-(stored + new) // PAGE) for stored, new in rows]
    num_pages = sum(counts) + 1
    pages = torch.randperm(num_pages - 1) + 1
    tables = torch.zeros(len(rows), max(counts), dtype=torch.int32)
    positions, qsl, used = [], [0], 0
    for index, ((stored, new), count) in enumerate(zip(rows, counts, strict=True)):
        tables[index, :count] = pages[used:used + count]
        used += count
        positions += range(stored, stored + new)
        qsl.append(qsl[-1] + new)
    positions += [0] * (bucket - len(positions))
    kv = torch.randn(num_pages, 2, PAGE, KV_HEADS, HEAD_DIM, device=device,
                     dtype=torch.bfloat16)
    query = torch.randn(bucket, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)
    return (query, kv, tables.to(device), torch.tensor(qsl, device=device),
            torch.tensor(positions, device=device)), qsl[-1]


def engine_rows(rows: list[tuple[int, int]]) -> int:
    """The rows of the engine's padded bucket for a step of these rows (default knobs)."""
    config = EngineConfig().resolve(load_model_config("qwen3.5-0.8b"), "cuda")
    decode = sum(new == 1 and stored > 0 for stored, new in rows)
    tokens = sum(new for _, new in rows)
    return next(bucket.rows for bucket in PaddedBucket.all_of(config)
                if bucket.holds(tokens, decode, len(rows) - decode))


def main() -> None:
    device = torch.device("cuda")
    num_sms = device_sms(device)
    for name, rows, bucket in LOADS:
        args, real = step(rows, bucket, device)
        chosen = splits_for(bucket, engine_rows(rows), KV_HEADS, num_sms)
        meeting = KeptZeros()
        base = paged_varlen_attention(*args, HEAD_DIM**-0.5)[:real].float()
        times = []
        for splits in sorted({1, 2, 4, MAX_SPLITS, chosen}):
            got = paged_varlen_attention(*args, HEAD_DIM**-0.5, num_splits=splits,
                                         meeting=meeting)[:real].float()
            error = ((got - base).norm() / base.norm()).item()
            us = graph_time_us(functools.partial(
                paged_varlen_attention, *args, HEAD_DIM**-0.5, num_splits=splits,
                meeting=meeting))
            times.append(f"{splits}: {us:6.1f} us (err {error:.1e})")
        print(f"{name:28s} bucket {bucket:4d}, splits_for {chosen}")
        for line in times:
            print(f"    {line}")


if __name__ == "__main__":
    main()
