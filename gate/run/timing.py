"""Where a session's time went: its wall time and each server's start-up, kept in the manifest.

The manifest's `timing` holds `wall_s` (every invocation of the session, resumptions added) and
`servers`: for each server launched, its round, arm, `launched_at` (the epoch), `health_s`
(launch to the first /health 200; None when it never answered), `stop_s` (stopping it) and, for
a resident server, `startup`:
where its engine core's start went (resident/engine/startup.py: imports, model, buffers, decode
and prefill graphs, total; the rest of health_s is the API process and the core's spawn).
Sessions from before this was kept have no `timing`; their reports say so.
"""

from __future__ import annotations

import statistics
from typing import Any


def server_entry(round_index: int, arm: str, health_s: float | None, stop_s: float | None,
                 startup: dict[str, float] | None = None, launch: str | None = None,
                 caches: dict[str, str | None] | None = None,
                 launched_at: float | None = None) -> dict[str, Any]:
    """A server's times, and the compile caches a resident server used; `launch` names a
    check's launch (its servers have no rounds)."""
    entry = {"round": round_index, "arm": arm, "launched_at": launched_at, "health_s": health_s,
             "stop_s": stop_s, "startup": startup, "caches": caches}
    return entry | ({"launch": launch} if launch else {})


def startup_wall(servers: list[dict[str, Any]]) -> float:
    """The wall time during which some server was starting (launch to /health 200): the union
    of their spans, which is their sum when they started one after another; the sum where a
    manifest from before `launched_at` lacks it."""
    started = [s for s in servers if s.get("health_s") is not None]
    spans = sorted((s["launched_at"], s["launched_at"] + s["health_s"]) for s in started
                   if s.get("launched_at") is not None)
    total, reach = 0.0, float("-inf")
    for start, end in spans:
        total += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return total + sum(s["health_s"] for s in started if s.get("launched_at") is None)


def time_summary(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """wall_s, startup_s (the wall time with a server starting: startup_wall), its share of
    the wall time, the number of servers launched, their median and longest start-up, and
    stop_s (their stops added up); None for a session that did not keep its times."""
    timing = manifest.get("timing")
    if not timing:
        return None
    servers = timing.get("servers") or []
    health = [s["health_s"] for s in servers if s.get("health_s") is not None]
    wall = timing.get("wall_s") or 0.0
    startup = round(startup_wall(servers), 3)
    return {
        "wall_s": round(wall, 3), "startup_s": startup,
        "startup_share": round(startup / wall, 4) if wall else None,
        "servers": len(servers), "servers_ready": len(health),
        "startup_median_s": round(statistics.median(health), 3) if health else None,
        "startup_max_s": max(health) if health else None,
        "stop_s": round(sum(s.get("stop_s") or 0.0 for s in servers), 3),
    }


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{seconds:.1f} s"


def time_line(manifest: dict[str, Any]) -> str:
    """The summary's sentence on where the session's time went."""
    summary = time_summary(manifest)
    if summary is None:
        return "Time: not recorded (a session from before the gate kept it)."
    together = ", the time servers started together counted once" \
        if manifest.get("parallel_start") else ""
    line = (f"Time: the session took {_duration(summary['wall_s'])}; server start-up (launch to "
            f"/health 200{together}) took {_duration(summary['startup_s'])} of it")
    if summary["startup_share"] is not None:
        line += f" ({summary['startup_share']:.0%})"
    line += f" over {summary['servers']} server starts"
    if summary["startup_median_s"] is not None:
        line += (f" (median {summary['startup_median_s']:.1f} s, longest "
                 f"{summary['startup_max_s']:.1f} s)")
    return line + f"; stopping them {_duration(summary['stop_s'])}. manifest.json has each."
