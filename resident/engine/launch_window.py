"""When to launch the next step ahead (knob `late_launch`): late in the running step's GPU time,
so that a request arriving while it runs joins the next step, not the one after.

Under `plan_ahead=launch` step N+1 is scheduled and launched as soon as step N's call begins,
while the GPU has just started N. A request that arrives during N's GPU time waits for N, then
for N+1 (a decode step that could not hold it), and runs its prompt in N+2: its TTFT carries a
whole decode step it did not need (1.3 ms at c=16 and 2 ms at c=64 on the H200's 0.8B).
Launched late, N+1 can still take it: the engine core polls its request pipe until

    deadline = N's GPU start + N's GPU time - (the host's time to schedule and launch N+1 + margin)

or until a request arrives, whichever is first, then schedules and launches N+1 as before.

N's GPU start is the later of the host's read of N-1's tokens and N's launch returning, where
that read waited for the GPU (at least MIN_WAIT_S): a read that found the tokens there says
only that the GPU was done earlier, so after one, or where nothing is sampled yet, the window
is one poll and the step launches at once, as before. A decode bucket's GPU time is the least
of its last HISTORY samples (the read of a step's tokens less its start, both known): idle
time only lengthens a sample, so the least one does not feed a late launch back into later
ones. The lead is the most of the last HISTORY walls to schedule and launch a decode step
after a window, plus MARGIN_S (a request taken near the deadline makes the next step a mixed
one, whose staging takes longer: the GPU can idle for the difference).
On CPU the forward runs inside its launch, every read finds its tokens there and no window
opens.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

HISTORY = 16
# what the deadline keeps in hand past the host's slowest recent schedule and launch: a Python
# pause (a garbage collection, a page fault) longer than this lets the GPU idle that long
MARGIN_S = 100e-6
# a read of a step's tokens that waited at least this long for them saw the GPU finish
MIN_WAIT_S = 20e-6


class LaunchWindow:
    """The deadline for launching the next step ahead, from the engine's own timings."""

    def __init__(self, history: int = HISTORY, margin_s: float = MARGIN_S) -> None:
        if history < 1 or margin_s < 0:
            raise ValueError(f"LaunchWindow needs history >= 1 and margin_s >= 0, got "
                             f"{history} and {margin_s}")
        self.history, self.margin_s = history, margin_s
        self._gpu_s: dict[int, deque[float]] = {}
        self._lead_s: deque[float] = deque(maxlen=history)
        self._last_read_s = 0.0  # when the host read the previous step's tokens
        self._last_read_waited = False  # and whether it waited for them (the GPU's end)

    def start_of(self, launched_s: float) -> float | None:
        """A step's GPU start: once the step before it is done and it is launched; None where
        the step before ended unseen, before it was read, and this one was already queued."""
        if launched_s >= self._last_read_s:
            return launched_s
        return self._last_read_s if self._last_read_waited else None

    def deadline(self, bucket: int, launched_s: float) -> float | None:
        """When the step after a running decode step of `bucket`, launched at `launched_s`,
        must be scheduled; None: its start or the bucket's GPU time is not known."""
        samples, start = self._gpu_s.get(bucket), self.start_of(launched_s)
        if not samples or start is None:
            return None
        lead = max(self._lead_s, default=0.0) + self.margin_s
        return start + min(samples) - lead

    def read(self, bucket: int, launched_s: float, read_s: float, waited_s: float) -> None:
        """A step's tokens were read at `read_s` after waiting `waited_s` for them: a decode
        step's GPU time is sampled where its start and end are known (bucket 0: a varlen
        step, not sampled)."""
        start, waited = self.start_of(launched_s), waited_s >= MIN_WAIT_S
        if bucket and waited and start is not None:
            samples = self._gpu_s.setdefault(bucket, deque(maxlen=self.history))
            samples.append(read_s - start)
        self._last_read_s, self._last_read_waited = read_s, waited

    def led(self, seconds: float) -> None:
        """The host's wall to schedule and launch a step ahead, once."""
        self._lead_s.append(seconds)


def poll_until(deadline: float | None, intake: Callable[[], int]) -> int:
    """Calls intake() (the requests it took) once, then again until it takes one or the
    deadline passes; the requests taken."""
    took = intake()
    while not took and deadline is not None and time.perf_counter() < deadline:
        took = intake()
    return took
