"""StepGraphs: one CUDA graph per bucket of one kind of step, captured over the runner's fixed
buffers.

A decode step of bucket b, or a fresh prefill padded to bucket b tokens, is the same launches
every time: only the contents of the input buffers (token ids, positions, KV write locations,
block tables, state slots, the row's end, and for a host-planned attention backend its plan
buffers) change. Each bucket is warmed once eagerly (torch.compile and Triton autotuning happen
there, outside the capture), then captured. A kind's buckets are captured largest first into
one memory pool, so the smaller graphs reuse the largest one's intermediate memory: only one
graph's outputs are alive at a time, because the engine samples from a step's logits before it
runs the next. Decode and prefill graphs keep separate pools.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("resident.graphs")


class StepGraphs:
    def __init__(self, kind: str) -> None:
        """kind names the steps in the capture log: decode or prefill."""
        self.kind = kind
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, Any] = {}
        self.pool = None  # the memory pool of the last capture

    @property
    def buckets(self) -> list[int]:
        return sorted(self._graphs)

    def capture(self, buckets: tuple[int, ...], prepare: Callable[[int], None],
                forward: Callable[[int], Any], describe: Callable[[int], str],
                pool=None) -> None:
        """prepare(b) stages an all-padding step of bucket b (and its host plan, if any);
        forward(b) runs the bucket's forward and logits over the fixed buffers and returns
        them (a tensor or a tuple of tensors), what replay gives back. pool: another
        StepGraphs' `pool`, shared when only one of the two kinds' outputs is alive at a time
        (None: a new one)."""
        pool = torch.cuda.graph_pool_handle() if pool is None else pool
        self.pool = pool
        side = torch.cuda.Stream()
        for bucket in sorted(buckets, reverse=True):
            started = time.perf_counter()
            prepare(bucket)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                forward(bucket)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._outputs[bucket] = forward(bucket)
            self._graphs[bucket] = graph
            log.info("captured %s bucket %d in %.2f s (its warm-up compiles and tunes): %s",
                     self.kind, bucket, time.perf_counter() - started, describe(bucket))
        torch.cuda.synchronize()

    def has(self, bucket: int) -> bool:
        return bucket in self._graphs

    def replay(self, bucket: int) -> Any:
        """The bucket's outputs (its logits), valid until the next replay of any bucket of
        this kind."""
        self._graphs[bucket].replay()
        return self._outputs[bucket]
