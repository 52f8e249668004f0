"""Request latency to the engine core's outputs, as histograms for /metrics (vLLM exposes the
same five).

Each request is timed on the host's monotonic clock, which the API processes and the engine
core share, at four points: its arrival (the API handler's start, before its body is read; in
process, `Engine.add_request`), its admission (the scheduler gives it pages, a state slot and
its first prompt chunk's row), its first token leaving the core (the read-back of the step that
computed its last prompt token), and its last. From them, once a request:

- `queue`: arrival to admission: the API's parse and hand-off, the wait for the core's next
  intake (a step in flight), and for a slot, pages or the prefill budget;
- `prefill`: admission to the first token: the prompt's steps, the plan-ahead step before
  them, and the read-back;
- `ttft`: arrival to the first token (queue + prefill): a client's TTFT less its request's
  way to the API and its first token's way back (the core's pipe, the API's render and write,
  the network);
- `e2e`: arrival to the last token, and `tpot`: first to last token over the tokens between,
  for requests that finished (stop or length), not those aborted or failed.

Observing costs a request a few list updates at admission, first token and end; a decode
step, whose rows all have their first token, observes nothing but its finishing rows.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# seconds; fine below 0.1 s, where a 0.8B's TTFT and TPOT live on the H200
BOUNDS_S = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05,
            0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LATENCIES = ("queue", "prefill", "ttft", "e2e", "tpot")


@dataclass
class Histogram:
    """Counts of observations by upper bound (Prometheus' `le`: a value equal to a bound falls
    in its bucket) and their sum."""

    bounds: tuple[float, ...] = BOUNDS_S
    counts: list[int] = field(init=False)  # one a bound, then one above them all
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def snapshot(self) -> dict:
        """{"bounds": [...], "counts": [per bucket, the last one above every bound], "sum"}."""
        return {"bounds": list(self.bounds), "counts": list(self.counts), "sum": self.total}


class RequestLatency:
    """The five histograms of one engine; the times themselves live on each Request."""

    def __init__(self) -> None:
        self.histograms = {name: Histogram() for name in LATENCIES}

    def first_token(self, arrived_s: float, admitted_s: float | None, now: float) -> None:
        """admitted_s None (a request the scheduler never stamped) counts no queue time: a
        metric never fails a step."""
        admitted_s = arrived_s if admitted_s is None else admitted_s
        self.histograms["queue"].observe(admitted_s - arrived_s)
        self.histograms["prefill"].observe(now - admitted_s)
        self.histograms["ttft"].observe(now - arrived_s)

    def finished(self, arrived_s: float, first_token_s: float | None, num_output: int,
                 now: float) -> None:
        self.histograms["e2e"].observe(now - arrived_s)
        if num_output > 1 and first_token_s is not None:
            self.histograms["tpot"].observe((now - first_token_s) / (num_output - 1))

    def snapshot(self) -> dict[str, dict]:
        return {name: histogram.snapshot() for name, histogram in self.histograms.items()}
