"""The summary's notes: what to read with care in a session's numbers (short runs, an event loop
at its limit, a busy host) and what to do next when a verdict needs more rounds."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from gate.manifest import Manifest

# a run whose median TTFT is more than this share of its wall time is mostly its start burst
# and drain (every request starts at once): its tok/s moves with them
BURST_SHARE = 0.1
# an API process or a client busy this share of a core or more is at its event loop's limit
CPU_BOUND_SHARE = 0.9
# the host counts as busy when its 1-minute load average passed this many runnable tasks per
# CPU the session was placed on: more work wanted those CPUs than the session itself
BUSY_LOAD_PER_CPU = 1.0
TOO_FEW = "too few rounds"


def short_run_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A line per cell whose runs are short against their requests' TTFT."""
    lines = []
    for cell in dict.fromkeys(row["cell"] for row in rows):
        mine = [r for r in rows if r["cell"] == cell and r["duration"] and r["median_ttft_ms"]]
        if not mine:
            continue
        duration = statistics.median(r["duration"] for r in mine)
        ttft_s = statistics.median(r["median_ttft_ms"] for r in mine) / 1000
        if ttft_s > BURST_SHARE * duration:
            lines.append(f"- {cell}: a run lasts {duration:.2f} s and a request waits "
                         f"{ttft_s * 1000:.0f} ms for its first token (median): much of each run "
                         "is the start burst and the drain, and its tok/s moves with them; more "
                         "requests a run (--requests-per-slot) measure the steady state.")
    return lines


def cpu_bound_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A line per cell and arm whose API process or the gate's client was near one full core
    over its runs: one event loop each, so that one, not the engine, may set the pace. Where
    none was, one line says so with the busiest of each."""
    lines, busiest = [], {}
    for row in rows:
        client = row["client_cpu_share"]
        for share, who in ((row["api_cpu_share"], "the API process"),
                           (client and client / (row["num_clients"] or 1), "each client")):
            if share is None:
                continue
            busiest[who] = max(busiest.get(who, 0.0), share)
            if share >= CPU_BOUND_SHARE:
                lines.append(f"- {row['cell']} {row['arm']}: {who} was busy {share:.2f} of a "
                             "core over the runs: its one event loop, not the engine, may set "
                             "this cell's pace.")
    if busiest and not lines:
        most = ", ".join(f"{who} {share:.2f}" for who, share in busiest.items())
        lines.append(f"- No API process or load client was busy {CPU_BOUND_SHARE} of a core in "
                     f"any cell (the busiest: {most}): neither set a cell's pace.")
    return lines


def prefix_cache_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A line per cell where some arm's server hit its prefix cache: each arm's hits against
    its requests and the prompt tokens a hit restored, so a cache's gain reads beside what it
    served (the measured runs; the warm-up fills the cache before them)."""
    lines = []
    for cell in dict.fromkeys(row["cell"] for row in rows):
        mine = [r for r in rows if r["cell"] == cell and r["prefix_hits"] is not None]
        if not any(r["prefix_hits"] for r in mine):
            continue
        parts = [f"{r['arm']} {r['prefix_hits']:,} of {r['prefix_requests']:,} requests"
                 + (f" ({r['prefix_saved_tokens'] / r['prefix_hits']:,.0f} prompt tokens "
                    "restored a hit)" if r["prefix_hits"] else "") for r in mine]
        lines.append(f"- {cell}: prefix cache hits over the runs: {'; '.join(parts)}.")
    return lines


def window_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A line per cell where some arm's late launch took requests into the step after the one
    running when they came (each a decode step sooner to its first token), against the
    requests it served."""
    lines = []
    for cell in dict.fromkeys(row["cell"] for row in rows):
        mine = [r for r in rows if r["cell"] == cell and r.get("window_arrivals")]
        if mine:
            parts = [f"{r['arm']} {r['window_arrivals']:,} of "
                     f"{(r['completed'] or 0) + (r['failed'] or 0):,} requests" for r in mine]
            lines.append(f"- {cell}: late launch took requests into the step after the one "
                         f"running when they came: {'; '.join(parts)}.")
    return lines


# a cell's note names the engine core's garbage collection from this share of a run's wall
GC_NOTE_SHARE = 0.005


def gc_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A line per cell where some arm's engine core spent at least GC_NOTE_SHARE of a run's
    wall in garbage collection (a pause stops every row of the step it falls in)."""
    lines = []
    for cell in dict.fromkeys(row["cell"] for row in rows):
        mine = [r for r in rows if r["cell"] == cell and r.get("core_gc_share") is not None]
        if any(r["core_gc_share"] >= GC_NOTE_SHARE for r in mine):
            parts = [f"{r['arm']} {r['core_gc_share']:.1%}" for r in mine]
            lines.append(f"- {cell}: the engine core's garbage collector paused it for this share "
                         f"of a run's wall (median): {'; '.join(parts)}.")
    return lines


def core_ttft_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A line per cell where the servers timed their TTFT to the engine core's output: each
    arm's mean TTFT at the client against the server's (API arrival to the first token out of
    the core: queue + prefill), so what the request's way in and its first token's way out
    add reads beside what the server does inside (means over each run's requests, the median
    over runs)."""
    lines = []
    for cell in dict.fromkeys(row["cell"] for row in rows):
        mine = [r for r in rows if r["cell"] == cell and r.get("core_ttft_ms") is not None
                and r["mean_ttft_ms"] is not None]
        if not mine:
            continue
        parts = [f"{r['arm']} {r['mean_ttft_ms']:.2f} ms, the server's {r['core_ttft_ms']:.2f} "
                 f"(queue {r['core_queue_ms']:.2f} + prefill {r['core_prefill_ms']:.2f}), the "
                 f"rest {r['mean_ttft_ms'] - r['core_ttft_ms']:.2f}" for r in mine]
        lines.append(f"- {cell}: TTFT mean at the client against the server's (the API's "
                     f"arrival to the first token out of the engine core; the rest is the "
                     f"request's way in and the token's way out): {'; '.join(parts)}.")
    return lines


def waited_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A line per cell and arm of an open loop where requests arrived with every slot busy:
    they waited in the client, so that cell ran partly as a closed loop at its concurrency."""
    return [f"- {row['cell']} {row['arm']}: {row['requests_waited']:,} of "
            f"{(row['completed'] or 0) + (row['failed'] or 0):,} requests arrived with all "
            f"{row['max_concurrency']} slots busy and waited for one (not counted in their TTFT, "
            "as vLLM counts it): the rate asked more than the cell's concurrency let through."
            for row in rows if row.get("requests_waited")]


def _session_cpus(manifest: Manifest) -> int:
    """The CPUs the session's servers and client were placed on (the host's, unrecorded)."""
    placement = manifest.placement
    cpus = set(placement.get("server_cpus") or ()) | set(placement.get("client_cpus") or ())
    return len(cpus) or max((load.cpus for load in manifest.host_load), default=1)


def host_load_lines(manifest: Manifest) -> list[str]:
    """A line when the host's load average, read before and after each round, passed the
    CPUs the session used (BUSY_LOAD_PER_CPU): other work competed for them."""
    cpus = _session_cpus(manifest)
    busy = [load for load in manifest.host_load
            if max(load.before[0], load.after[0]) > BUSY_LOAD_PER_CPU * cpus]
    if not busy:
        return []
    peak = max(max(load.before[0], load.after[0]) for load in busy)
    rounds = ", ".join(f"r{load.round + 1}" for load in busy)
    return [f"- The host was busy: its 1-minute load average reached {peak:.1f} on "
            f"{busy[0].cpus} CPUs, {cpus} of them the session's, around rounds {rounds} "
            "(manifest.json's host_load): other work competed for the session's CPUs, so read "
            "small differences with care, or run again on a quieter host."]


def next_step_lines(rows: list[dict[str, Any]], manifest: Manifest,
                    directory: Path | None = None) -> list[str]:
    """A line naming the way on when some arm's verdict is `too few rounds`: more rounds in
    this session (--resume), or a session that adds rounds until a verdict."""
    open_cells = [f"{row['cell']} {row['arm']}" for row in rows if row["verdict"] == TOO_FEW]
    if not open_cells:
        return []
    ran = manifest.rounds_run or manifest.rounds or 0
    out = directory if directory is not None else "<this session's directory>"
    more = (f"--until-verdict --max-rounds {max(ran + 2, 2 * ran)}" if manifest.until_verdict
            else f"--rounds {max(ran + 2, 2 * ran)}")
    return [f"- {TOO_FEW} ({', '.join(open_cells)}): {ran} rounds cannot tell these arms "
            f"apart yet. Next: add rounds to this session with `resident-gate run --resume "
            f"--out {out} {more}` (the same options otherwise), or start one with "
            "`--until-verdict --max-rounds N`, which stops as soon as every cell has a verdict."]
