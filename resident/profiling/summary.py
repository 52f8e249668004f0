"""Where a window's step time goes, per step kind, and how two arms' kernels differ.

Per kind (a step's numbers, then their mean over the window's steps of that kind):

- `period`: from the step's start to the next step's start (host): the cadence the server
  ran at, what tok/s sees; the window's last step has none;
- `busy`: the union of the step's device-op intervals (µs the device worked for it);
- `gaps`: from the step's first op start to its last op end, less `busy`: idle between its
  kernels (launch gaps inside a graph count here);
- `graph`: the span of each graph replay (first kernel start to last kernel end), summed over
  the step's replays, the design's "graph execution"; `idle_outside_graph`: period less graph,
  the device's idle outside the graph (both absent for kinds that replay no graph);
- the kernel table: each op name's µs and calls per step, and the standard deviation of its
  µs over steps (the noise a diff compares against); and its `exposed` µs a step, the part of
  `busy` it alone accounts for (frontier_shares): under PDL a kernel's own µs include its wait
  for the kernel before it, so the own µs of a step's kernels add up to more than the step.

A diff matches kernels by name: added, removed, or changed when the means differ by more than
3 standard errors of the difference, 2% of the baseline's µs and `floor_us` (two server processes
run the same kernel up to ~1% apart: clocks, placement; the steps' spread inside one window
does not see that), or the calls per step differ by half a call or more (less is the window's
mix of steps, not a kernel launched more often).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from resident.profiling.timeline import DeviceOp, Timeline

NOISE_SIGMAS = 3.0
RELATIVE_FLOOR = 0.02
CALLS_FLOOR = 0.5


@dataclass(frozen=True)
class KernelStat:
    name: str
    us_per_step: float
    calls_per_step: float
    us_sd: float  # over the kind's steps
    # its share of the steps' busy time (frontier_shares); 0 in summaries written before it
    exposed_us_per_step: float = 0.0


@dataclass(frozen=True)
class KindSummary:
    kind: str
    steps: int
    period_us_mean: float | None
    period_us_median: float | None
    busy_us: float
    gaps_us: float
    graph_us_median: float | None
    idle_outside_graph_us: float | None
    ops_per_step: float
    kernels: tuple[KernelStat, ...]  # costliest first

    @property
    def busy_share(self) -> float | None:
        return self.busy_us / self.period_us_mean if self.period_us_mean else None

    @property
    def kernel_us(self) -> float:
        return sum(k.us_per_step for k in self.kernels)


@dataclass(frozen=True)
class ProfileSummary:
    tool: str
    activity: str
    window_us: float
    unattributed: int
    kinds: tuple[KindSummary, ...]

    def kind(self, name: str) -> KindSummary | None:
        return next((k for k in self.kinds if k.kind == name), None)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ProfileSummary:
        kinds = tuple(KindSummary(**{**k, "kernels": tuple(KernelStat(**s) for s in k["kernels"])})
                      for k in data["kinds"])
        return cls(data["tool"], data["activity"], data["window_us"], data["unattributed"],
                   kinds)


def summarize(timeline: Timeline) -> ProfileSummary:
    steps = timeline.steps
    window = steps[-1].end_us - steps[0].start_us if steps else 0.0
    ops_by_step: dict[int, list[DeviceOp]] = defaultdict(list)
    for op in timeline.ops:
        ops_by_step[op.step].append(op)
    periods = {i: steps[i + 1].start_us - steps[i].start_us for i in range(len(steps) - 1)}
    kinds = sorted({s.kind for s in steps})
    summaries = [_kind_summary(kind, [i for i, s in enumerate(steps) if s.kind == kind],
                               ops_by_step, periods) for kind in kinds]
    return ProfileSummary(timeline.tool, timeline.activity, window, timeline.unattributed,
                          tuple(summaries))


def _kind_summary(kind: str, indices: list[int], ops_by_step: dict[int, list[DeviceOp]],
                  periods: dict[int, float]) -> KindSummary:
    steps = [ops_by_step.get(i, []) for i in indices]
    shares = [frontier_shares([(op.start_us, op.end_us) for op in ops]) for ops in steps]
    per_step = [_step_numbers(ops, step_shares)
                for ops, step_shares in zip(steps, shares, strict=True)]
    own_periods = [periods[i] for i in indices if i in periods]
    graphs = [n["graph"] for n in per_step]
    has_graph = any(g > 0 for g in graphs)
    idle_outside = [periods[i] - n["graph"] for i, n in zip(indices, per_step, strict=True)
                    if i in periods]
    return KindSummary(
        kind=kind, steps=len(indices),
        period_us_mean=_mean(own_periods), period_us_median=_median(own_periods),
        busy_us=_mean([n["busy"] for n in per_step]) or 0.0,
        gaps_us=_mean([n["gaps"] for n in per_step]) or 0.0,
        graph_us_median=_median(graphs) if has_graph else None,
        idle_outside_graph_us=_mean(idle_outside) if has_graph else None,
        ops_per_step=sum(len(ops) for ops in steps) / len(indices),
        kernels=_kernel_table(steps, shares))


def _step_numbers(ops: list[DeviceOp], shares: list[float]) -> dict[str, float]:
    """shares: the ops' frontier_shares, which add up to the step's busy time."""
    if not ops:
        return {"busy": 0.0, "gaps": 0.0, "graph": 0.0}
    busy = sum(shares)
    span = max(op.end_us for op in ops) - min(op.start_us for op in ops)
    replays: dict[int, list[DeviceOp]] = defaultdict(list)
    for op in ops:
        if op.in_graph:
            replays[op.launch].append(op)
    graph = sum(max(o.end_us for o in r) - min(o.start_us for o in r) for r in replays.values())
    return {"busy": busy, "gaps": span - busy, "graph": graph}


def union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals: time the device was busy. Under PDL a
    kernel starts before the one ahead of it ends and waits inside, so summing durations would
    count that wait twice."""
    return sum(frontier_shares(list(intervals)))


def frontier_shares(intervals: list[tuple[float, float]]) -> list[float]:
    """Each (start, end) interval's share of their union, in the given order: the part of it
    past the latest end of the intervals that start before it (ties by end). The shares add up
    to union_us. A step's kernels under PDL: one that launched early and waited inside the
    kernel before it is charged only for the time it ran on alone, so the shares say what each
    kernel adds to the step, where their own durations overlap."""
    shares = [0.0] * len(intervals)
    covered = float("-inf")
    for index in sorted(range(len(intervals)), key=intervals.__getitem__):
        start, end = intervals[index]
        if end > covered:
            shares[index] = end - max(start, covered)
            covered = end
    return shares


def _kernel_table(steps: list[list[DeviceOp]],
                  shares: list[list[float]]) -> tuple[KernelStat, ...]:
    """Each kernel's µs a step, its calls and its exposed µs (its ops' frontier shares)."""
    us: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(steps))
    exposed: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for index, (ops, step_shares) in enumerate(zip(steps, shares, strict=True)):
        for op, share in zip(ops, step_shares, strict=True):
            us[op.name][index] += op.dur_us
            exposed[op.name] += share
            calls[op.name] += 1
    table = [KernelStat(name, statistics.fmean(values), calls[name] / len(steps),
                        statistics.stdev(values) if len(values) > 1 else 0.0,
                        exposed[name] / len(steps))
             for name, values in us.items()]
    return tuple(sorted(table, key=lambda k: (-k.us_per_step, k.name)))


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


# -- the diff -----------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelChange:
    name: str
    status: str  # added | removed | changed | same
    base_us: float
    head_us: float
    base_calls: float
    head_calls: float
    noise_us: float

    @property
    def delta_us(self) -> float:
        return self.head_us - self.base_us


@dataclass(frozen=True)
class KindDiff:
    """head against base for one step kind."""

    kind: str
    base: KindSummary
    head: KindSummary
    changes: tuple[KernelChange, ...]  # added, removed, changed, then same; largest first

    def of(self, status: str) -> list[KernelChange]:
        return [c for c in self.changes if c.status == status]

    def headline(self) -> str:
        """One sentence: what the head adds and drops, and what the kernels, launches and gaps
        sum to, per step."""
        parts = []
        for status, verb in (("added", "adds"), ("removed", "drops"), ("changed", "changes")):
            found = self.of(status)
            if found:
                delta = sum(c.delta_us for c in found)
                parts.append(f"{verb} {len(found)} kernel{'s' * (len(found) != 1)} "
                             f"({delta:+.1f} µs)")
        what = "; ".join(parts) if parts else "no kernel differs beyond the noise"
        base, head = self.base, self.head
        return (f"{self.kind}: the head {what}; kernels sum to {head.kernel_us:.1f} vs "
                f"{base.kernel_us:.1f} µs a step, {head.ops_per_step - base.ops_per_step:+.1f} "
                f"launches, gaps {head.gaps_us - base.gaps_us:+.1f} µs")


def diff(base: KindSummary, head: KindSummary, floor_us: float = 0.5) -> KindDiff:
    before = {k.name: k for k in base.kernels}
    after = {k.name: k for k in head.kernels}
    changes = [_change(before.get(name), after.get(name), name, base.steps, head.steps, floor_us)
               for name in before.keys() | after.keys()]
    order = {"added": 0, "removed": 1, "changed": 2, "same": 3}
    changes.sort(key=lambda c: (order[c.status], -abs(c.delta_us), c.name))
    return KindDiff(base.kind, base, head, tuple(changes))


def _change(before: KernelStat | None, after: KernelStat | None, name: str, base_steps: int,
            head_steps: int, floor_us: float) -> KernelChange:
    empty = KernelStat(name, 0.0, 0.0, 0.0)
    b, h = before or empty, after or empty
    noise = max(floor_us, RELATIVE_FLOOR * b.us_per_step,
                NOISE_SIGMAS * math.sqrt(b.us_sd ** 2 / max(base_steps, 1)
                                         + h.us_sd ** 2 / max(head_steps, 1)))
    if before is None:
        status = "added"
    elif after is None:
        status = "removed"
    elif (abs(h.us_per_step - b.us_per_step) > noise
          or abs(h.calls_per_step - b.calls_per_step) >= CALLS_FLOOR):
        status = "changed"
    else:
        status = "same"
    return KernelChange(name, status, b.us_per_step, h.us_per_step, b.calls_per_step,
                        h.calls_per_step, noise)
