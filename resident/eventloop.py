"""The asyncio event loop a process runs its coroutine on, chosen by name (knob `event_loop`):
`uvloop` (libuv's loop: its transports, reads and writes in C, where the standard library's
run Python per call), `asyncio` (the standard library's), or `auto`: uvloop where it is
installed, else asyncio. A streamed token costs the API process one socket write and its client
one read and a share of a loop wake-up, so the loop's own per-call cost is a large part of
either's CPU a token (on the project's VM: the gate's client 8.8-9.5 -> 7.2 µs a token at c=256,
the API 7.2-8.2 -> 6.6-6.9 at c=64; docs/engine.md "The server").
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
