"""resident/eventloop.py: the event loop chosen by name, the knob that names it, and a server's
API process on each loop the host has (uvloop where installed, asyncio's always): /debug/config
names the loop in use, and a streamed completion gives the tokens of the whole answer, with two
API processes (the server's own and a spawned one) on that loop."""

from __future__ import annotations

import asyncio
import re
import sys

import aiohttp
import pytest

from resident import eventloop
from resident.config import EngineConfig

from server_fixture import HOST_LOOPS, Server, get, post, run, sse_events


async def _running() -> str:
    await asyncio.sleep(0)
    return eventloop.running_name()


@pytest.mark.parametrize("name", HOST_LOOPS)
def test_run_runs_the_coroutine_on_the_loop_named(name):
    assert eventloop.resolve(name)[0] == name
    assert eventloop.run(_running(), name) == name


def test_an_unknown_loop_is_refused_by_name():
    with pytest.raises(ValueError, match="event_loop 'libev'"):
        eventloop.resolve("libev")
    with pytest.raises(ValueError, match="knob event_loop: 'libev'"):
        EngineConfig(event_loop="libev")


def test_uvloop_asked_where_it_is_missing_is_an_error_and_auto_falls_back(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # its import now raises ImportError
    with pytest.raises(ValueError, match="uvloop is not installed"):
        eventloop.resolve("uvloop")
    assert eventloop.resolve("auto") == ("asyncio", None)
    assert eventloop.run(_running(), "auto") == "asyncio"
    with pytest.raises(ValueError, match="event_loop uvloop: uvloop is not installed"):
        EngineConfig(event_loop="uvloop")  # the CLI's --set names it, no traceback


@pytest.mark.parametrize("name", HOST_LOOPS)
def test_a_server_streams_on_each_loop(name):
    # two API processes: the first runs in the server's process, the second is spawned
    server = Server("--set", "dtype=float64", "--set", f"event_loop={name}",
                    "--api-processes", "2").wait_ready()
    body = {"prompt": [3, 1, 4, 1, 5, 9, 2, 6], "max_tokens": 12, "ignore_eos": True}

    async def ask():
        async with aiohttp.ClientSession() as session:
            events = await sse_events(session, server.url + "/v1/completions",
                                      {**body, "stream": True})
        return (await get(server.url + "/debug/config"),
                await post(server.url + "/v1/completions", body), events)

    try:
        (status, config), (answered, whole), events = run(ask())
        log = server.log()
    finally:
        server.stop()
    assert (status, answered) == (200, 200)
    assert config["api_event_loop"] == name and config["knobs"]["event_loop"] == name
    for index in (0, 1):  # each process logs the loop it runs on
        assert re.search(rf"API process {index} \(pid \d+\) listening .*event loop: {name}\)$",
                         log, re.M), log
    streamed = [t for event in events for t in event["choices"][0]["token_ids"]]
    assert streamed == whole["choices"][0]["token_ids"] and len(streamed) == 12
