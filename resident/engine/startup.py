"""Where an engine core's start-up goes, span by span, for the server log and /debug/config
(and from there the gate's manifest): `imports` (torch, its compiler and the engine, from the
core process's start), `device` (the CUDA context), `model` (building the weights and their
fingerprint), `buffers` (KV and state caches, kernels and planning), `fla tuning` (on CUDA:
fla's chunked delta rule autotuned on real work, gdn_prefill.tune_chunked_delta_rule),
`decode graphs` and `prefill graphs` (each bucket warmed, which is where torch.compile, Triton
autotuning and FlashInfer's JIT run, then captured; `... warm-up` without CUDA graphs), between
them `decode graphs with the draw` (each decode bucket again, its draw after the forward), and
`sampler graphs` (the varlen draws). Each captured bucket's own seconds go to the capture log
line."""

from __future__ import annotations

import time


class StartupTimes:
    """Named spans of one start-up, each from the end of the one before."""

    def __init__(self) -> None:
        self._started = self._last = time.perf_counter()
        self.spans: dict[str, float] = {}

    def lap(self, name: str) -> None:
        """Ends the span `name` now (a name lapped twice adds up)."""
        now = time.perf_counter()
        self.spans[name] = self.spans.get(name, 0.0) + now - self._last
        self._last = now

    @property
    def total_s(self) -> float:
        return self._last - self._started

    def to_dict(self) -> dict[str, float]:
        """{span: seconds, ..., "total": seconds}, to the millisecond."""
        return {**{name: round(s, 3) for name, s in self.spans.items()},
                "total": round(self.total_s, 3)}

    def line(self) -> str:
        parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.spans.items())
        return f"start-up {self.total_s:.1f} s: {parts}"
