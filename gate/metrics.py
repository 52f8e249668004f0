"""A run's numbers: ServeMetrics, named as `vllm bench serve --save-result` names them.

Part of the records (gate/records.py): the load measures them (gate/run/load.py), the reports
read them back from runs.jsonl.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LATENCIES = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (90, 99)


@dataclass(frozen=True)
class ServeMetrics:
    """One run's numbers, named as `vllm bench serve --save-result` names the same things.

    duration in s, latencies in ms. Over the completed requests: TTFT = time to the first
    streamed token; TPOT = (latency - TTFT) / (output tokens - 1), one value a request; ITL =
    every gap between a request's tokens; E2EL = request sent to its last token. std is the
    population standard deviation and percentiles interpolate linearly (numpy's defaults, as
    vLLM's). A latency no completed request gave is None.
    """

    max_concurrency: int
    duration: float
    completed: int
    failed: int
    total_input_tokens: int | None
    total_output_tokens: int
    request_throughput: float | None
    output_throughput: float | None
    total_token_throughput: float | None = None
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    std_ttft_ms: float | None = None
    p90_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    std_tpot_ms: float | None = None
    p90_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    median_itl_ms: float | None = None
    std_itl_ms: float | None = None
    p90_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    mean_e2el_ms: float | None = None
    median_e2el_ms: float | None = None
    std_e2el_ms: float | None = None
    p90_e2el_ms: float | None = None
    p99_e2el_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_concurrency", "completed", "failed", "total_output_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.duration < 0:
            raise ValueError(f"duration must be >= 0, got {self.duration}")


def latency_fields(values_s: list[float], name: str) -> dict[str, float | None]:
    """mean, median, std and PERCENTILES of `values_s` in ms, as ServeMetrics fields of `name`
    (ttft, tpot, itl or e2el); all None for no values."""
    keys = [f"mean_{name}_ms", f"median_{name}_ms", f"std_{name}_ms",
            *(f"p{p}_{name}_ms" for p in PERCENTILES)]
    if not values_s:
        return dict.fromkeys(keys)
    ms = np.asarray(values_s) * 1e3
    numbers = [ms.mean(), np.median(ms), ms.std(), *np.percentile(ms, PERCENTILES)]
    return {key: round(float(value), 3) for key, value in zip(keys, numbers, strict=True)}
