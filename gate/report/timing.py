"""Where a session's time went: its wall time and each server's start-up, as the summary says it.

The manifest's `timing` (gate/manifest.py: Timing) holds `wall_s` (every invocation of the
session, resumptions added) and `servers`, a ServerTiming for each server launched; a resident
server's `startup` says where its engine core's start went (resident/engine/startup.py: imports,
model, buffers, decode and prefill graphs, total; the rest of health_s is the API process and
the core's spawn). Sessions from before this was kept have no `timing`; their reports say so.
"""

from __future__ import annotations

import statistics
from typing import Any

from gate.manifest import Manifest, ServerTiming


def startup_wall(servers: tuple[ServerTiming, ...]) -> float:
    """The wall time during which some server was starting (launch to /health 200): the union
    of their spans, which is their sum when they started one after another; the sum where a
    manifest from before `launched_at` lacks it."""
    started = [s for s in servers if s.health_s is not None]
    spans = sorted((s.launched_at, s.launched_at + s.health_s) for s in started
                   if s.launched_at is not None)
    total, reach = 0.0, float("-inf")
    for start, end in spans:
        total += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return total + sum(s.health_s for s in started if s.launched_at is None)


def time_summary(manifest: Manifest) -> dict[str, Any] | None:
    """wall_s, startup_s (the wall time with a server starting: startup_wall), its share of
    the wall time, the number of servers launched, their median and longest start-up, and
    stop_s (their stops added up); None for a session that did not keep its times."""
    timing = manifest.timing
    if timing is None:
        return None
    servers = timing.servers
    health = [s.health_s for s in servers if s.health_s is not None]
    wall = timing.wall_s or 0.0
    startup = round(startup_wall(servers), 3)
    return {
        "wall_s": round(wall, 3), "startup_s": startup,
        "startup_share": round(startup / wall, 4) if wall else None,
        "servers": len(servers), "servers_ready": len(health),
        "startup_median_s": round(statistics.median(health), 3) if health else None,
        "startup_max_s": max(health) if health else None,
        "stop_s": round(sum(s.stop_s or 0.0 for s in servers), 3),
    }


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{seconds:.1f} s"


def time_line(manifest: Manifest) -> str:
    """The summary's sentence on where the session's time went."""
    summary = time_summary(manifest)
    if summary is None:
        return "Time: not recorded (a session from before the gate kept it)."
    together = ", the time servers started together counted once" \
        if manifest.parallel_start else ""
    line = (f"Time: the session took {_duration(summary['wall_s'])}; server start-up (launch to "
            f"/health 200{together}) took {_duration(summary['startup_s'])} of it")
    if summary["startup_share"] is not None:
        line += f" ({summary['startup_share']:.0%})"
    line += f" over {summary['servers']} server starts"
    if summary["startup_median_s"] is not None:
        line += (f" (median {summary['startup_median_s']:.1f} s, longest "
                 f"{summary['startup_max_s']:.1f} s)")
    return line + f"; stopping them {_duration(summary['stop_s'])}. manifest.json has each."
