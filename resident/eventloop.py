"""The asyncio event loop a process runs its coroutine on, chosen by name: `uvloop` (libuv's
loop: its transports, reads and writes in C, where the standard library's run Python per call),
`asyncio` (the standard library's), or `auto`: uvloop where it is installed, else asyncio.

A streamed token costs the gate's load client one read and a share of a loop wake-up, and the
API process one socket write, so the loop's own per-call cost is a large part of either's CPU a
token. On an H100 host the client at the c=256 cell's pace took 28-33 µs a token on asyncio's
loop and 11 on uvloop, and the API 15.0-16.4 against 13.0-13.8 at c=64
(results/2026-12-06-h100-event-loop). The client runs on `auto`; the API processes on the knob
`event_loop`, asyncio's by default (docs/engine.md "The server" says why).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

EVENT_LOOPS = ("auto", "asyncio", "uvloop")


def resolve(name: str) -> tuple[str, Callable[[], asyncio.AbstractEventLoop] | None]:
    """(the loop `name` gives here, "asyncio" or "uvloop"; its factory, None for asyncio's
    default). Raises ValueError for an unknown name, or uvloop asked where it is missing."""
    if name not in EVENT_LOOPS:
        raise ValueError(f"event_loop {name!r}: expected one of {', '.join(EVENT_LOOPS)}")
    if name == "asyncio":
        return "asyncio", None
    try:
        import uvloop
    except ImportError:
        if name == "uvloop":
            raise ValueError("event_loop uvloop: uvloop is not installed here "
                             "(pip install uvloop, or event_loop=auto)") from None
        return "asyncio", None
    return "uvloop", uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], name: str = "auto") -> T:
    """asyncio.run(main) on the loop `name` gives (resolve)."""
    _, factory = resolve(name)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def running_name() -> str:
    """The running loop's name: "uvloop" or "asyncio"."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") \
        else "asyncio"
