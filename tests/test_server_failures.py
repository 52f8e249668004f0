"""One request, one dead process or one slow client never takes the server down (issue 22):
the tiny model through the real server (an API process and an engine core) on CPU."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from resident.server.serve import IPC_PREFIX, PID_FILE, remove_stale_ipc_dirs

from server_fixture import ROOT, Server, get, metrics, post, run

# long enough to be in flight when a test acts on the server (a tiny CPU step is ~1-2 ms)
STREAM = {"prompt": [1, 2, 3], "max_tokens": 3000, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def server():
    srv = Server("--set", "max_num_seqs=2", "--set", "max_waiting=2").wait_ready()
    yield srv
    srv.stop()
    assert "Traceback" not in srv.log()


async def _stream(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    """A streamed completion: its status, its events, whether [DONE] came, and its error."""
    events, done = [], False
    async with session.post(url + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            return {"status": resp.status, "body": await resp.json(content_type=None),
                    "headers": dict(resp.headers)}
        async for raw in resp.content:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                events.append(json.loads(line[6:]))
    last = events[-1] if events else {}
    return {"status": 200, "events": events, "done": done, "error": last.get("error"),
            "finish_reason": (last.get("choices") or [{}])[0].get("finish_reason")}


async def _streams_until(url: str, bodies: list[dict], action, delay_s: float = 1.0):
    """Starts the streams, waits delay_s, runs action(), returns the streams' results."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        tasks = [asyncio.ensure_future(_stream(session, url, body)) for body in bodies]
        await asyncio.sleep(delay_s)
        action()
        return await asyncio.gather(*tasks)


def _exit_code(process: subprocess.Popen, within_s: float) -> int | None:
    try:
        return process.wait(timeout=within_s)
    except subprocess.TimeoutExpired:
        return None


def test_a_poison_temperature_fails_nothing_and_the_others_finish(server):
    """temperature 1e-40 used to turn the sampler's probabilities into NaNs and raise inside
    the step, killing the core and every stream: now it samples greedily, beside two streams."""
    async def body():
        async with aiohttp.ClientSession() as session:
            streams = [asyncio.ensure_future(_stream(session, server.url, {**STREAM,
                                                                           "max_tokens": 30}))
                       for _ in range(2)]
            await asyncio.sleep(0.2)
            poison = await post(server.url + "/v1/completions",
                                {"prompt": "hi", "max_tokens": 4, "temperature": 1e-40})
            return poison, await asyncio.gather(*streams)

    (status, data), streams = run(body())
    assert status == 200 and len(data["choices"][0]["token_ids"]) == 4
    assert all(s["done"] and s["finish_reason"] == "length" and not s["error"] for s in streams)
    assert server.process.poll() is None


def test_every_error_is_one_json_shape_with_a_request_id(server):
    async def body():
        answers = [await get(server.url + "/nope"),
                   await get(server.url + "/v1/completions"),  # GET on a POST route
                   await post(server.url + "/v1/completions", {"prompt": "\ud800"}),
                   await post(server.url + "/v1/completions", "{not json")]
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        raw = (await reader.read(4096)).decode()
        writer.close()
        return answers, raw

    answers, raw = run(body())
    assert [status for status, _ in answers] == [404, 405, 400, 400]
    for _, data in answers:
        assert set(data) == {"error"} and set(data["error"]) == {"message", "type", "request_id"}
    assert "lone surrogate" in answers[2][1]["error"]["message"]
    head, _, payload = raw.partition("\r\n\r\n")
    assert head.split()[1] == "400" and json.loads(payload)["error"]["type"]
    assert "Traceback" not in server.log()


def test_a_burst_past_the_queue_gets_429_with_retry_after(server):
    """max_num_seqs 2 + max_waiting 2: at most 4 completions in flight; the rest are refused
    at once, and the ones taken all finish."""
    async def body():
        async with aiohttp.ClientSession() as session:
            return await asyncio.gather(*(_stream(session, server.url, {**STREAM,
                                                                          "max_tokens": 40})
                                          for _ in range(10)))

    results = run(body())
    refused = [r for r in results if r["status"] == 429]
    taken = [r for r in results if r["status"] == 200]
    assert len(taken) >= 4 and refused
    assert all(r["headers"].get("Retry-After") == "1" for r in refused)
    assert all(r["body"]["error"]["type"] == "rate_limit_error" for r in refused)
    assert all(r["done"] and r["finish_reason"] == "length" for r in taken)


def test_each_of_n_choices_counts_against_the_queue(server):
    """max_num_seqs 2 + max_waiting 2: n=4 fits an idle server, n=5 never does (429)."""
    body = {"prompt": [1, 2, 3], "max_tokens": 3, "ignore_eos": True}
    status, four = run(post(server.url + "/v1/completions", {**body, "n": 4}))
    assert status == 200 and [c["index"] for c in four["choices"]] == [0, 1, 2, 3]
    assert four["usage"]["completion_tokens"] == 12
    status, five = run(post(server.url + "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3,
                             "n": 5}))
    assert status == 429 and five["error"]["type"] == "rate_limit_error", five


def test_a_large_body_does_not_stall_other_clients(server):
    """A 20 MB body is refused before it is read (413); a 3 MB one (a token-id prompt far over
    max_model_len) is parsed off the event loop: /health keeps answering meanwhile."""
    big = json.dumps({"prompt": [7] * 1_000_000, "max_tokens": 1})
    huge = "x" * (20 << 20)

    async def body():
        async with aiohttp.ClientSession() as session:
            answered = []

            async def poll() -> None:
                while True:
                    async with session.get(server.url + "/health") as resp:
                        answered.append(resp.status)
                    await asyncio.sleep(0.005)

            poller = asyncio.ensure_future(poll())
            await asyncio.sleep(0.05)
            before = len(answered)
            async with session.post(server.url + "/v1/completions", data=big) as resp:
                big_answer = (resp.status, await resp.json())
            during = len(answered) - before
            async with session.post(server.url + "/v1/completions", data=huge) as resp:
                huge_answer = (resp.status, await resp.json())
            poller.cancel()
            return big_answer, huge_answer, during, answered

    (big_status, big_body), (huge_status, huge_body), during, answered = run(body())
    assert big_status == 400 and "max_model_len" in big_body["error"]["message"]
    assert huge_status == 413 and "max_body_mib" in huge_body["error"]["message"]
    assert during >= 1 and set(answered) == {200}


def test_a_half_sent_request_is_dropped_and_a_short_body_times_out():
    srv = Server("--set", "read_timeout_s=1").wait_ready()
    try:
        async def body():
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # no blank line
            await writer.drain()
            head_dropped = await asyncio.wait_for(reader.read(100), 10)
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"prompt\"")
            await writer.drain()
            short_body = await asyncio.wait_for(reader.read(4096), 10)
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: 1000000000000\r\n\r\n{")
            await writer.drain()
            declared_huge = await asyncio.wait_for(reader.read(4096), 10)
            return head_dropped, short_body.decode(), declared_huge.decode()

        head_dropped, short_body, declared_huge = run(body())
        assert head_dropped == b""  # closed with nothing sent
        assert short_body.startswith("HTTP/1.1 408")
        assert "read_timeout_s" in short_body
        assert declared_huge.startswith("HTTP/1.1 413") and "max_body_mib" in declared_huge
    finally:
        srv.stop()


def test_a_completion_past_request_timeout_is_aborted():
    """504 for a plain completion; a stream gets an error event with finish_reason abort, then
    [DONE]; the aborted requests free their place (a short request runs after). The server
    listens on every interface without a key here, which it warns about."""
    srv = Server("--set", "request_timeout_s=1", "--host", "0.0.0.0").wait_ready()
    try:
        long = {"prompt": [1, 2, 3], "max_tokens": 3000, "ignore_eos": True}

        async def body():
            async with aiohttp.ClientSession() as session:
                return await asyncio.gather(
                    post(srv.url + "/v1/completions", long),
                    _stream(session, srv.url, {**long, "stream": True}))

        (status, data), streamed = run(body())
        assert status == 504 and "request_timeout_s" in data["error"]["message"]
        assert streamed["done"] and streamed["finish_reason"] == "abort"
        assert "request_timeout_s" in streamed["error"]["message"]
        assert len(streamed["events"]) > 1  # it streamed tokens before the timeout
        status, data = run(post(srv.url + "/v1/completions", {**long, "max_tokens": 2}))
        assert status == 200 and len(data["choices"][0]["token_ids"]) == 2
        samples = run(metrics(srv.url))
        assert samples["resident_aborts_total"] == 2 and samples["resident_requests_running"] == 0
        assert "0.0.0.0 with no API key" in srv.log()  # listening beyond loopback, no key
    finally:
        srv.stop()


def test_a_killed_core_fails_every_stream_and_the_server_exits():
    srv = Server().wait_ready()
    try:
        core = srv.core_pid()
        results = run(_streams_until(srv.url, [STREAM] * 3,
                                     lambda: os.kill(core, signal.SIGKILL)))
        assert all(r["done"] and r["error"] for r in results), results
        assert all("engine" in r["error"]["message"] for r in results)
        assert not any("Traceback" in r["error"]["message"] for r in results)
        assert _exit_code(srv.process, 15) == 1
        log = srv.log()
        assert "engine core exited with code -9" in log and "Traceback" not in log
    finally:
        srv.stop()


def test_a_stopped_core_is_found_stuck_and_the_server_exits():
    """SIGSTOP: the core neither dies nor answers; after core_stall_s the streams end with an
    error, /health says failed, the core is killed and the server exits 1."""
    srv = Server("--set", "core_stall_s=2").wait_ready()
    core = srv.core_pid()
    try:
        results = run(_streams_until(srv.url, [STREAM] * 2,
                                     lambda: os.kill(core, signal.SIGSTOP)))
        assert all(r["done"] and "not answered" in r["error"]["message"] for r in results)
        assert _exit_code(srv.process, 15) == 1
    finally:
        srv.stop()
        if Path(f"/proc/{core}").exists():
            os.kill(core, signal.SIGKILL)


def test_sigterm_drains_then_aborts_with_a_reason():
    """Short requests finish within the grace; a long one is aborted after it with
    finish_reason `abort`; the server exits 0 and says what it did."""
    srv = Server("--set", "shutdown_grace_s=1").wait_ready()
    try:
        bodies = [{**STREAM, "max_tokens": 5}, {**STREAM, "max_tokens": 3000}]
        short, long = run(_streams_until(srv.url, bodies,
                                         lambda: srv.process.send_signal(signal.SIGTERM), 0.3))
        assert short["done"] and short["finish_reason"] == "length" and not short["error"]
        assert long["done"] and long["finish_reason"] == "abort"
        assert "shutting down" in long["error"]["message"]
        assert _exit_code(srv.process, 15) == 0
        log = srv.log()
        assert "draining" in log and "aborted" in log and "stopped" in log
    finally:
        srv.stop()


def _serve(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESIDENT_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "resident", "serve", "tiny", *args],
                          env=env, capture_output=True, text=True, timeout=timeout_s)


def test_start_up_errors_are_one_clear_line():
    empty_key = _serve("--device", "cpu", "--api-key", "")
    assert empty_key.returncode == 2 and "--api-key" in empty_key.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        in_use = _serve("--device", "cpu", "--port", str(port))
    assert in_use.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in in_use.stderr
    assert "engine core started" not in in_use.stderr and "Traceback" not in in_use.stderr
    import torch

    if not torch.cuda.is_available():
        # the API process takes --device cuda as given (it never imports torch): the core finds
        # no device first thing, and serve exits 1 naming it
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        no_cuda = _serve("--device", "cuda", "--port", str(port))
        assert no_cuda.returncode == 1
        assert "the engine core failed: RuntimeError: --device cuda: torch" in no_cuda.stderr
        assert "sees no CUDA device" in no_cuda.stderr
        assert "never retrieved" not in no_cuda.stderr


def test_stale_ipc_directories_of_dead_servers_are_removed(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for name, pid in (("dead", gone.pid), ("live", os.getpid())):
        directory = tmp_path / f"{IPC_PREFIX}{name}"
        directory.mkdir()
        (directory / PID_FILE).write_text(str(pid))
    (tmp_path / f"{IPC_PREFIX}foreign").mkdir()  # no pid file: not a server's
    assert remove_stale_ipc_dirs(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{IPC_PREFIX}foreign", f"{IPC_PREFIX}live"]


def test_a_killed_server_takes_its_core_with_it():
    """After kill -9 of `serve` its core goes too (PR_SET_PDEATHSIG): no orphan holds the GPU."""
    srv = Server().wait_ready()
    core = srv.core_pid()
    srv.process.kill()
    srv.process.wait()
    deadline = time.monotonic() + 15
    while Path(f"/proc/{core}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{core}").exists()
    srv.stop()
