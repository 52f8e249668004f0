"""The /debug routes: the engine's config, row-check counts, phase timing and profile windows.
Behind the API key like every route but /health."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from resident import eventloop
from resident.server.profile_window import TOOLS
from resident.server.state import STATE, ready_client
from resident.server.validation import ApiError, as_float, bad_request

MAX_PROFILE_STEPS = 100_000
MAX_PROFILE_SECONDS = 600.0


def add_debug_routes(app: web.Application) -> None:
    app.router.add_get("/debug/config", _config)
    app.router.add_get("/debug/rowcheck", _rowcheck)
    app.router.add_get("/debug/phases", _phases)
    app.router.add_post("/debug/phases/reset", _phases)
    app.router.add_post("/debug/profile", _profile)


async def _config(request: web.Request) -> web.Response:
    info = ready_client(request).info
    state = request.app[STATE]
    return web.json_response({**info, "tokenizer": state.tokenizer.name,
                              "chat_template": state.chat_template.source,
                              "api_event_loop": eventloop.running_name()},
                             dumps=lambda obj: json.dumps(obj, default=str))


async def _rowcheck(request: web.Request) -> web.Response:
    """Row-check counts since start: steps, rows, mismatches, displaced, slot releases,
    offloads (all zero while row_check is off, except the planner's own counters)."""
    stats = await ready_client(request).stats()
    return web.json_response(stats.get("rowcheck", {}))


async def _phases(request: web.Request) -> web.Response:
    """GET: phase timing since the last reset, {"enabled", "kinds": {kind: {key: ms per
    step}}} (engine/phases.py). POST .../reset: the same, then the sums start over."""
    section = "phases_reset" if request.method == "POST" else "phases"
    return web.json_response(await ready_client(request).stats(section=section))


async def _profile(request: web.Request) -> web.Response:
    """POST {"steps": 100, "seconds": 30, "tool": "torch"}: profiles the engine core's next
    `steps` steps (or `seconds`, whichever ends first) and answers once the window closed:
    {"tool", "steps", "seconds", "trace" (a gzipped Chrome trace on the server's disk),
    "summary" (per step kind: period, GPU busy, gaps, graph time, kernels; profiling/)}.
    409 while another window is open."""
    client = ready_client(request)
    steps, seconds, tool = _profile_request(await request.text())
    answer = await client.profile(steps, seconds, tool)
    if "error" in answer:
        raise ApiError(answer.get("status", 500), "profile_error", answer["error"])
    return web.json_response(answer)


def _profile_request(text: str) -> tuple[int, float, str]:
    try:
        body: Any = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    steps = body.get("steps", 100)
    if isinstance(steps, bool) or not isinstance(steps, int) \
            or not 1 <= steps <= MAX_PROFILE_STEPS:
        raise bad_request(f"'steps' must be an integer in [1, {MAX_PROFILE_STEPS}], "
                          f"got {steps!r}")
    seconds = as_float(body.get("seconds", 30.0))
    if seconds is None or not 0 < seconds <= MAX_PROFILE_SECONDS:
        raise bad_request(f"'seconds' must be a number in (0, {MAX_PROFILE_SECONDS:g}], "
                          f"got {body.get('seconds')!r}")
    tool = body.get("tool", "torch")
    if tool not in TOOLS:
        raise bad_request(f"'tool' must be one of {', '.join(TOOLS)}, got {tool!r}")
    return steps, seconds, tool
