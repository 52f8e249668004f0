"""Two API processes on one port (`resident serve --api-processes 2`, api_processes.py): one real
server of the tiny model. Each request opens its own connection, so the kernel spreads them over
both processes (SO_REUSEPORT); with 16 at once the chance that all land on one is 2^-15."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time

import aiohttp
import pytest

from tests.server_fixture import Server, metrics, run

NUM_STREAMS = 16
PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def server():
    srv = Server("--api-processes", "2").wait_ready()
    yield srv
    srv.stop()


def _api_process_pid(server: Server) -> int:
    found = re.search(r"API process 1 started \(pid (\d+)\)", server.log())
    assert found, server.log()
    return int(found.group(1))


async def _settled(url: str, before: dict[str, float],
                   at_least: dict[str, float] | None = None) -> dict[str, float]:
    """The metrics once nothing runs, every page is back (an aborted request's pages return
    after the step planned ahead of the abort) and each counter of `at_least` has reached its
    value (a request is counted when its handler returns, just after its last bytes reach the
    client), or after 30 s."""
    deadline = time.monotonic() + 30
    while True:
        after = await metrics(url)
        if (after["resident_requests_running"] == 0
                and after["resident_kv_pages_free"] == before["resident_kv_pages_free"]
                and all(after.get(key, 0) >= value for key, value in (at_least or {}).items())) \
                or time.monotonic() > deadline:
            return after
        await asyncio.sleep(0.2)


async def _stream(url: str, body: dict, stop_after: int | None = None,
                  started: asyncio.Event | None = None) -> dict:
    """One stream on a connection of its own: its token count and how it ended."""
    tokens, finish, error = 0, None, None
    try:
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session, session.post(
                url + "/v1/completions", json={**body, "stream": True}) as resp:
            if resp.status != 200:
                return {"status": resp.status, "body": await resp.json()}
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                tokens += len(event["choices"][0]["token_ids"]) if event["choices"] else 0
                finish = event["choices"][0]["finish_reason"] if event["choices"] else finish
                if started is not None and tokens == 1:
                    started.set()
                if stop_after is not None and tokens >= stop_after:
                    return {"status": 200, "tokens": tokens, "finish": "client left"}
    except aiohttp.ClientError as err:
        error = type(err).__name__
    return {"status": 200, "tokens": tokens, "finish": finish, "error": error}


def test_interleaved_streams_over_two_processes_and_merged_metrics(server):
    """16 streams at once, spread over both processes, each gets all its tokens; /metrics
    (whichever process answers it) counts the completions of both."""
    body = {"prompt": PROMPT, "max_tokens": 12, "ignore_eos": True, "temperature": 0}

    key = 'resident_http_requests_total{code="200",route="/v1/completions"}'

    async def body_():
        before = await metrics(server.url)
        results = await asyncio.gather(*(_stream(server.url, body) for _ in range(NUM_STREAMS)))
        want = {key: before.get(key, 0) + NUM_STREAMS}
        scrapes = [await _settled(server.url, before, want) for _ in range(4)]  # either process
        return before, results, scrapes

    before, results, scrapes = run(body_())
    assert all(r["tokens"] == 12 and r["finish"] == "length" for r in results), results
    for samples in scrapes:
        assert samples[key] - before.get(key, 0) == NUM_STREAMS
        assert samples["resident_requests_running"] == 0


def test_aborts_and_errors_on_either_process(server):
    """Clients that hang up abort their requests in the core (the pages return); a bad request
    gets the JSON error shape from whichever process took it."""
    long = {"prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True}

    async def body_():
        before = await metrics(server.url)
        left = await asyncio.gather(*(_stream(server.url, long, stop_after=2)
                                      for _ in range(NUM_STREAMS)))
        bad = await asyncio.gather(*(_stream(server.url, {"prompt": PROMPT, "top_p": 0})
                                     for _ in range(8)))
        return before, left, bad, await _settled(server.url, before)

    before, left, bad, after = run(body_())
    assert all(r["finish"] == "client left" for r in left), left
    assert after["resident_aborts_total"] - before["resident_aborts_total"] == NUM_STREAMS
    assert after["resident_requests_running"] == 0
    assert after["resident_kv_pages_free"] == before["resident_kv_pages_free"]
    assert all(r["status"] == 400 and "top_p" in r["body"]["error"]["message"] for r in bad)


def test_a_killed_api_process_fails_only_its_own_streams(server):
    """SIGKILL API process 1 mid-stream: its streams end (their connections close), process
    0's stream on to their 60th token (then the client leaves), the core aborts the dead
    process's requests (pages return) and the server serves on, then exits 0 on SIGTERM. Last
    in this module: it stops the server."""
    # long enough that the core cannot finish the dead process's requests before its watch
    # (every WATCH_S) hears of the death: the core then has some of them to abort
    body = {"prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True}
    pid = _api_process_pid(server)

    async def body_():
        before = await metrics(server.url)
        started = [asyncio.Event() for _ in range(NUM_STREAMS)]
        streams = [asyncio.create_task(_stream(server.url, body, started=event, stop_after=60))
                   for event in started]
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in started)), 60)
        os.kill(pid, signal.SIGKILL)
        results = await asyncio.gather(*streams)
        after = await _settled(server.url, before)
        again = await _stream(server.url, {**body, "max_tokens": 5})
        return before, results, after, again

    before, results, after, again = run(body_())
    whole = [r for r in results if r["finish"] == "client left" and r["tokens"] == 60]
    cut = [r for r in results if r not in whole]
    assert whole and cut, results  # both processes had streams
    assert all(r["error"] is not None and r["tokens"] < 60 for r in cut), cut
    assert after["resident_requests_running"] == 0
    assert after["resident_kv_pages_free"] == before["resident_kv_pages_free"]
    assert again["tokens"] == 5 and again["finish"] == "length"
    assert server.process.poll() is None
    log = server.log()
    assert "API process 1 exited with code -9" in log
    server.process.send_signal(signal.SIGTERM)  # the one left drains and the server exits 0
    assert server.process.wait(timeout=30) == 0
    gone = re.search(r"API process 1 is gone: aborted its (\d+) requests", log)
    # the cut ones (all still running when the core heard), and none of the earlier tests'
    # aborted requests (aborts leave no owner behind)
    assert gone and int(gone.group(1)) == len(cut)
