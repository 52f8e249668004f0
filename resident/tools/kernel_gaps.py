"""Where two profile windows' graph replays differ between their kernels: for each pair of
kernels that follow each other inside a replay, the gap from the first's end to the second's
start, summed per step (median over the window's steps of one kind).

    python -m resident.tools.kernel_gaps BASE.json.gz [HEAD.json.gz] [--kind decode] [--top 20]

The traces are torch.profiler windows, as a gate session keeps them (profiles/*.json.gz). A
negative gap is programmatic dependent launch at work: the second kernel started before the
first ended and waited inside. The profile summary (profile.md) gives a step's total gaps; this
says between which kernels they changed (issue 39: results/2026-12-03-h200-c1-modes), and
how long the GPU sat idle between a step's launches (host time in series with it). Given one
window, it lists that window's largest gaps.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from resident.profiling.timeline import DeviceOp, Timeline
from resident.profiling.torch_trace import from_chrome_trace


def load(path: Path) -> Timeline:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as file:
        return from_chrome_trace(json.load(file))


def _launches_by_step(timeline: Timeline, kind: str,
                      graphs_only: bool) -> list[dict[int, list[DeviceOp]]]:
    """Each step of `kind`: its device ops by the launch that made them (graph replays only,
    or every launch)."""
    by_step: dict[int, dict[int, list[DeviceOp]]] = defaultdict(lambda: defaultdict(list))
    for op in timeline.ops:
        if (op.in_graph or not graphs_only) and timeline.steps[op.step].kind == kind:
            by_step[op.step][op.launch].append(op)
    return list(by_step.values())


def replay_gaps(timeline: Timeline, kind: str) -> tuple[dict[str, float], float | None]:
    """({"first -> second": median µs a step}, median graph span µs a step) over the steps of
    `kind`, from the kernels of each graph replay in start order."""
    pair_sums: list[dict[str, float]] = []
    spans = []
    for replays in _launches_by_step(timeline, kind, graphs_only=True):
        sums: dict[str, float] = defaultdict(float)
        for ops in replays.values():
            ops.sort(key=lambda op: op.start_us)
            spans.append(max(op.end_us for op in ops) - ops[0].start_us)
            for first, second in itertools.pairwise(ops):
                sums[f"{first.name[:40]} -> {second.name[:40]}"] += second.start_us - first.end_us
        pair_sums.append(sums)
    pairs = {name for sums in pair_sums for name in sums}
    medians = {name: statistics.median(sums.get(name, 0.0) for sums in pair_sums)
               for name in pairs}
    return medians, statistics.median(spans) if spans else None


def launch_gaps(timeline: Timeline, kind: str) -> float | None:
    """Median µs a step of `kind` that the GPU sat idle between the step's launches (a graph
    replay, an eager kernel or copy, in start order): from one launch's last op's end to the
    next one's first op's start. The gaps inside a replay are replay_gaps'."""
    sums = []
    for launches in _launches_by_step(timeline, kind, graphs_only=False):
        bounds = sorted((min(op.start_us for op in ops), max(op.end_us for op in ops))
                        for ops in launches.values())
        sums.append(sum(max(0.0, start - end)
                        for (_, end), (start, _) in itertools.pairwise(bounds)))
    return statistics.median(sums) if sums else None


def compare(base: Timeline, head: Timeline, kind: str) -> tuple[list[tuple[str, float, float]],
                                                              tuple[float | None, float | None]]:
    """Rows (pair, base µs, head µs), the largest change first, and both median spans; one
    window given as both is read once."""
    base_gaps, base_span = replay_gaps(base, kind)
    head_gaps, head_span = (base_gaps, base_span) if head is base else replay_gaps(head, kind)
    rows = [(name, base_gaps.get(name, 0.0), head_gaps.get(name, 0.0))
            for name in base_gaps.keys() | head_gaps.keys()]
    rows.sort(key=lambda row: -abs(row[2] - row[1]))
    return rows, (base_span, head_span)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path)
    parser.add_argument("head", type=Path, nargs="?",
                        help="a second window (left out: the base's own largest gaps)")
    parser.add_argument("--kind", default="decode", help="step kind (decode, mixed, prefill)")
    parser.add_argument("--top", type=int, default=20, help="pairs printed, largest first")
    args = parser.parse_args(argv)
    timelines = [load(args.base)] + ([load(args.head)] if args.head else [])
    rows, spans = compare(timelines[0], timelines[-1], args.kind)
    if not rows:
        print(f"no graph replays of {args.kind} steps in these traces", file=sys.stderr)
        return 1
    between = [launch_gaps(timeline, args.kind) for timeline in timelines]
    gaps = [sum(row[1] for row in rows), sum(row[2] for row in rows)]
    for what, values in ((f"{args.kind} graph span µs a step (median)", spans),
                         ("gaps µs a step", gaps), ("idle between launches µs a step", between)):
        print(f"{what}: " + (f"{values[0]:.1f}" if args.head is None
                             else f"base {values[0]:.1f}, head {values[1]:.1f}"))
    if args.head is None:
        print(f"{'µs':>9}  kernel pair")
        for name, base_us, _ in sorted(rows, key=lambda row: -row[1])[:args.top]:
            print(f"{base_us:9.1f}  {name}")
        return 0
    print(f"{'base µs':>9} {'head µs':>9} {'change':>8}  kernel pair")
    for name, base_us, head_us in rows[:args.top]:
        print(f"{base_us:9.1f} {head_us:9.1f} {head_us - base_us:+8.1f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
