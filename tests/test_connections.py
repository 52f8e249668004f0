"""The listener's limits against a hostile client (server/connections.py), on one real server of
the tiny model started under a 256-descriptor limit: its connection cap is then 192 (the limit
less 64). Timeouts are short here (2-6 s) so the test takes seconds."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time

import pytest

from resident.server.connections import quiet_accept_errors
from tests.server_fixture import ROOT, Server, get, metrics, run

FD_LIMIT = 256
CAP = FD_LIMIT - 64  # connection_cap's auto value under this limit
TIMEOUT_S = 2.0  # send_stall_s
READ_TIMEOUT_S = 4.0  # long enough to hold the cap's worth of busy requests on a busy host
KEEPALIVE_S = 6.0  # longer than read_timeout_s: each closes what it should, not the other
CLOSE_SLACK_S = 10.0  # a connection closed this long past its timeout was held, not closed
HEALTH_BOUND_S = 1.0  # the issue asks 100 ms; a busy 2-CPU CI host gets 10x (see the test)
HEALTH_STALL_S = 3.0


@pytest.fixture(scope="module")
def server():
    srv = Server("--set", f"read_timeout_s={READ_TIMEOUT_S}", "--set",
                 f"keepalive_timeout_s={KEEPALIVE_S}", "--set", f"send_stall_s={TIMEOUT_S}",
                 "--set", "send_buffer_kib=4", "--set", f"health_stall_s={HEALTH_STALL_S}",
                 fd_limit=FD_LIMIT).wait_ready()
    yield srv
    srv.stop()


async def _open(port: int, first: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if first:
        writer.write(first)
        await writer.drain()
    return reader, writer


async def _hostile(port: int, kind: str):
    """One connection of a kind: idle from the start, a half-sent first head, a kept-alive one
    after a whole request, or one that sends half of a second request's head."""
    if kind == "idle":
        return await _open(port, b"")
    if kind == "half head":
        return await _open(port, b"GET /health HTTP/1.1\r\nHost: x\r\n")
    reader, writer = await _open(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = await reader.readuntil(b"}")  # the whole /health JSON body
    assert answer.startswith(b"HTTP/1.1 "), answer
    if kind == "half second head":
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-")
        await writer.drain()
    return reader, writer


async def _closed_within(reader: asyncio.StreamReader, limit_s: float) -> bool:
    """True once the server closes the connection (EOF or reset) within limit_s."""
    try:
        async with asyncio.timeout(limit_s):
            while await reader.read(4096):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


async def _poll_health(url: str, stop: asyncio.Event, answers: list[tuple[int, float]]) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        status, _ = await get(url + "/health")
        answers.append((status, time.perf_counter() - start))
        await asyncio.sleep(0.05)


def test_idle_and_half_sent_connections_cannot_lock_out_health(server):
    """2x the cap of idle, half-sent and kept-alive connections: /health answers 200 throughout
    (a new connection at the cap closes the longest-idle one), every held connection is closed
    within its timeout, and the log stays small (a line a second, not a line a connection).

    The latency bound is the issue's correctness criterion (100 ms); asserted at 1 s so a busy
    2-CPU CI host does not fail it, the measured numbers in the failure message."""
    kinds = ["idle", "half head", "kept alive", "half second head"]

    async def body():
        stop, answers = asyncio.Event(), []
        poller = asyncio.create_task(_poll_health(server.url, stop, answers))
        held = [await _hostile(server.port, kinds[i % len(kinds)]) for i in range(2 * CAP)]
        closed = await asyncio.gather(*(_closed_within(reader, KEEPALIVE_S + CLOSE_SLACK_S)
                                        for reader, _ in held))
        stop.set()
        await poller
        for _, writer in held:
            writer.close()
        return answers, closed

    answers, closed = run(body())
    latencies = [seconds for _, seconds in answers]
    report = (f"{len(answers)} /health answers, median {statistics.median(latencies) * 1e3:.1f}"
              f" ms, max {max(latencies) * 1e3:.1f} ms")
    print(report)
    assert len(answers) >= 5 and {status for status, _ in answers} == {200}, report
    assert max(latencies) < HEALTH_BOUND_S, report
    assert all(closed), f"{closed.count(False)} of {len(closed)} connections still open"
    log = server.log()
    assert len(log.encode()) < 1 << 20 and "Traceback" not in log
    assert "at max_connections: closed the longest-idle connection" in log
    assert "request head did not arrive in read_timeout_s" in log


def test_at_the_cap_with_every_connection_busy_a_new_one_is_refused(server):
    """The cap's worth of requests whose bodies never finish: all busy (none idle to close), so
    a new connection is closed at once with nothing sent; read_timeout_s later each busy one
    gets 408 and new connections are served again."""
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{")

    async def body():
        busy = [await _open(server.port, head) for _ in range(CAP)]
        await asyncio.sleep(0.5)  # every head parsed: every connection in a request
        reader, writer = await _open(server.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        try:  # closed with nothing sent: EOF, or a reset (the request was left unread)
            refused = await asyncio.wait_for(reader.read(100), READ_TIMEOUT_S)
        except ConnectionResetError:
            refused = b""
        writer.close()
        answers = await asyncio.gather(*(asyncio.wait_for(r.read(4096), READ_TIMEOUT_S + 15)
                                         for r, _ in busy))
        for _, w in busy:
            w.close()
        return refused, answers, await get(server.url + "/health")

    refused, answers, (status, _) = run(body())
    assert refused == b""
    assert all(a.startswith(b"HTTP/1.1 408") and b"read_timeout_s" in a for a in answers)
    assert status == 200
    assert "at max_connections with none idle: refused a connection" in server.log()


def test_a_stream_its_client_never_reads_is_aborted_and_frees_its_pages(server):
    """A client that reads nothing (a small receive buffer, so the server's small send buffers
    fill within a second): send_stall_s later its connection is dropped, the request aborted
    in the core and its KV pages returned."""
    before = run(metrics(server.url))
    body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 3000, "ignore_eos": True,
                       "stream": True, "logprobs": 5}).encode()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        # an aborted request's pages return after the step planned ahead of the abort
        after = _wait_for(lambda: run(metrics(server.url)),
                          lambda m: m["resident_aborts_total"] > before["resident_aborts_total"]
                          and m["resident_kv_pages_free"] == before["resident_kv_pages_free"],
                          60)
        assert after["resident_generated_tokens_total"] > before["resident_generated_tokens_total"]
        assert after["resident_kv_pages_free"] == before["resident_kv_pages_free"]
        assert after["resident_requests_running"] == 0
        sock.settimeout(10)
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(1 << 16):  # what the server sent, then its close
                received += chunk
        assert received.startswith(b"HTTP/1.1 200") and b"[DONE]" not in received
    assert "dropped a stream its client did not read for send_stall_s" in server.log()


def test_a_stalled_core_is_reported_by_health_before_the_exit(server):
    """SIGSTOP the core: /health says 503 "stalled" after health_stall_s (not core_stall_s, 60
    s, when the server would exit), and 200 again once the core runs."""
    core = server.core_pid()
    os.kill(core, signal.SIGSTOP)
    try:
        status, answer = _wait_for(lambda: run(get(server.url + "/health")),
                                   lambda a: a[0] == 503, HEALTH_STALL_S + 15)
        assert answer["status"] == "stalled" and answer["silent_s"] >= HEALTH_STALL_S
        assert server.process.poll() is None
    finally:
        os.kill(core, signal.SIGCONT)
    status, _ = _wait_for(lambda: run(get(server.url + "/health")), lambda a: a[0] == 200, 15)
    assert status == 200


def test_a_connection_cap_over_the_descriptor_limit_fails_at_start():
    result = subprocess.run(
        [sys.executable, "-m", "resident", "serve", "tiny", "--device", "cpu", "--set",
         "max_connections=100000"], env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=60,
        preexec_fn=lambda: _set_fd_limit(FD_LIMIT))
    assert result.returncode == 2, result.stderr
    assert "max_connections" in result.stderr and "hard limit of 256" in result.stderr
    assert "Traceback" not in result.stderr


def _set_fd_limit(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def _wait_for(read, done, within_s: float):
    deadline = time.monotonic() + within_s
    while True:
        value = read()
        if done(value) or time.monotonic() > deadline:
            assert done(value), value
            return value
        time.sleep(0.2)


def test_accept_errors_cost_a_log_line_a_second(caplog):
    """A flood of out-of-descriptor accept errors (asyncio pauses accepting a second after
    each) logs one line, naming the error, not a traceback each; other loop errors still
    reach the default handler."""
    loop = asyncio.new_event_loop()
    try:
        quiet_accept_errors(loop)
        handler = loop.get_exception_handler()
        with caplog.at_level(logging.INFO):
            for _ in range(1000):
                handler(loop, {"message": "socket.accept() out of system resource",
                               "exception": OSError(errno.EMFILE, "Too many open files")})
            handler(loop, {"message": "something else", "exception": ValueError("x")})
    finally:
        loop.close()
    accept_lines = [r for r in caplog.records if "accepting a connection failed" in r.message]
    assert len(accept_lines) == 1 and "EMFILE" in accept_lines[0].message
    assert accept_lines[0].exc_info is None
    assert any("something else" in r.message for r in caplog.records)
