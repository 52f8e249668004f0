"""The gate's load generator against a real tiny server: counts, timings and failures."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from gate.run.load import (
    LoadSpec,
    RequestResult,
    arrival_offsets,
    client_shares,
    make_prompts,
    run_load,
    summarize,
)

from server_fixture import HOST_LOOPS, Server, run


@pytest.fixture(scope="module")
def server():
    srv = Server().wait_ready()
    yield srv
    srv.stop()


def test_a_run_streams_every_token(server):
    spec = LoadSpec(concurrency=4, num_requests=8, prompt_len=24, output_len=6, num_warmup=2,
                    seed=3)
    metrics = run(run_load(server.url, spec)).metrics
    assert (metrics.completed, metrics.failed, metrics.max_concurrency) == (8, 0, 4)
    assert (metrics.total_output_tokens, metrics.total_input_tokens) == (48, 8 * 24)
    assert metrics.output_throughput == pytest.approx(48 / metrics.duration, rel=1e-3)
    assert metrics.request_throughput == pytest.approx(8 / metrics.duration, rel=1e-3)
    assert metrics.total_token_throughput == pytest.approx((48 + 8 * 24) / metrics.duration,
                                                           rel=1e-3)
    for name in ("ttft", "tpot", "itl", "e2el"):
        values = [getattr(metrics, f"{stat}_{name}_ms") for stat in ("median", "p90", "p99")]
        assert 0 < values[0] <= values[1] <= values[2], name
        assert getattr(metrics, f"mean_{name}_ms") > 0 and getattr(metrics, f"std_{name}_ms") >= 0
    # a request's whole time holds its first token and every gap after it
    assert metrics.median_e2el_ms > metrics.median_ttft_ms


@pytest.mark.parametrize("event_loop", HOST_LOOPS)
def test_client_processes_stream_every_token_and_one_wall_time(server, event_loop):
    """Three client processes share 7 slots: every request of every process is counted, once,
    and the run's wall time spans them all; on each event loop the host has."""
    spec = LoadSpec(concurrency=7, num_requests=21, prompt_len=16, output_len=6, num_warmup=3,
                    seed=5, num_clients=3, event_loop=event_loop)
    result = run(run_load(server.url, spec))
    metrics = result.metrics
    assert (metrics.completed, metrics.failed, metrics.max_concurrency) == (21, 0, 7)
    assert metrics.total_output_tokens == 21 * 6 and result.errors == ()
    # every request's whole time fits in the run's
    assert 0 < metrics.p99_e2el_ms <= metrics.duration * 1000
    assert metrics.output_throughput == pytest.approx(21 * 6 / metrics.duration, rel=1e-3)


def test_a_sampled_run_sends_its_sampling(server):
    """temperature, top_p and top_k reach the server: a sampled run streams every token, and a
    temperature the server refuses fails every request with its 400."""
    spec = LoadSpec(concurrency=4, num_requests=8, prompt_len=16, output_len=5, seed=2,
                    temperature=0.7, top_p=0.9, top_k=20)
    result = run(run_load(server.url, spec))
    assert (result.metrics.completed, result.metrics.failed) == (8, 0)
    refused = run(run_load(server.url, dataclasses.replace(spec, temperature=-1.0)))
    assert refused.metrics.failed == 8 and "'temperature'" in refused.errors[0]


def test_open_loop_arrivals_are_a_seeded_poisson_process():
    spec = LoadSpec(concurrency=8, num_requests=4000, request_rate=50.0, seed=3)
    offsets = arrival_offsets(spec, 4000)
    gaps = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    assert offsets[0] == 0 and all(gap >= 0 for gap in gaps)
    # exponential gaps: mean 1/rate, and as spread as their mean
    assert sum(gaps) / len(gaps) == pytest.approx(0.02, rel=0.06)
    assert statistics.pstdev(gaps) == pytest.approx(0.02, rel=0.1)
    assert arrival_offsets(spec, 4000) == offsets  # arms on one seed see the same arrivals
    assert arrival_offsets(dataclasses.replace(spec, run=1), 10) != offsets[:10]
    assert arrival_offsets(dataclasses.replace(spec, request_rate=0.0), 10) is None
    with pytest.raises(ValueError, match="request_rate must be >= 0 and finite"):
        dataclasses.replace(spec, request_rate=float("inf"))


def test_an_open_loop_sends_each_request_at_its_arrival(server):
    """At 20 requests a second each request leaves at its own time (the run lasts past the last
    arrival); at a million a second every request but the first finds the one slot busy."""
    spec = LoadSpec(concurrency=4, num_requests=6, prompt_len=8, output_len=4, seed=4,
                    request_rate=20.0)
    result = run(run_load(server.url, spec))
    assert (result.metrics.completed, result.metrics.failed) == (6, 0)
    assert result.metrics.duration >= arrival_offsets(spec, 6)[-1]
    burst = dataclasses.replace(spec, concurrency=1, num_requests=4, request_rate=1e6)
    result = run(run_load(server.url, burst))
    assert (result.metrics.completed, result.num_waited) == (4, 3)


def test_client_processes_share_an_open_loop(server):
    """Two processes, a slot each, a million requests a second: each process's first request
    takes its slot and the other two of its three wait; every request streams."""
    spec = LoadSpec(concurrency=2, num_requests=6, prompt_len=8, output_len=4, seed=6,
                    num_clients=2, request_rate=1e6)
    result = run(run_load(server.url, spec))
    assert (result.metrics.completed, result.metrics.failed, result.num_waited) == (6, 0, 4)


def test_client_processes_that_cannot_connect_fail_their_requests():
    spec = LoadSpec(concurrency=4, num_requests=6, prompt_len=8, output_len=4, num_clients=2,
                    timeout_s=30)
    result = run(run_load("http://127.0.0.1:9", spec))  # nothing listens on port 9
    assert (result.metrics.completed, result.metrics.failed) == (0, 6)
    assert result.errors


def test_client_shares_split_slots_and_prompts_evenly():
    spec = LoadSpec(concurrency=7, num_requests=21, num_clients=3)
    prompts = [[j] for j in range(21)]
    shares = client_shares(spec, prompts)
    assert [slots for slots, _ in shares] == [3, 2, 2]
    # prompt j goes to the process of slot j mod 7: slots 0, 3, 6 to the first
    assert [p[0] for p in shares[0][1]] == [0, 3, 6, 7, 10, 13, 14, 17, 20]
    assert sorted(p[0] for _, share in shares for p in share) == list(range(21))
    # never more processes than slots
    assert len(client_shares(dataclasses.replace(spec, concurrency=2), prompts)) == 2


def test_failures_are_counted_not_measured(server):
    spec = LoadSpec(concurrency=2, num_requests=3, prompt_len=8, output_len=5000)
    result = run(run_load(server.url, spec))  # past max_model_len: every request is a 400
    metrics = result.metrics
    assert (metrics.failed, metrics.completed, metrics.total_output_tokens) == (3, 0, 0)
    assert metrics.median_ttft_ms is None and metrics.p99_e2el_ms is None
    assert "HTTP 400" in result.errors[0]


def test_summary_follows_vllms_definitions():
    """Two requests of 3 tokens: TTFT, TPOT = (latency - TTFT) / (tokens - 1), every ITL gap
    and E2EL, with numpy's mean, median, population std and linear percentiles."""
    spec = LoadSpec(concurrency=2, num_requests=3, prompt_len=10, output_len=3)
    results = [RequestResult(True, 3, 0.010, [0.002, 0.004], 0.016),
               RequestResult(True, 3, 0.020, [0.003, 0.003], 0.026),
               RequestResult(False, error="HTTP 500")]
    metrics = summarize(spec, results, wall_s=0.5).metrics
    assert (metrics.completed, metrics.failed) == (2, 1)
    assert metrics.output_throughput == 12.0 and metrics.request_throughput == 4.0
    assert metrics.total_input_tokens == 20 and metrics.total_token_throughput == 52.0
    assert (metrics.mean_ttft_ms, metrics.median_ttft_ms, metrics.std_ttft_ms) == (15, 15, 5)
    assert metrics.p90_ttft_ms == pytest.approx(19.0)
    assert metrics.p99_ttft_ms == pytest.approx(19.9)
    assert metrics.mean_tpot_ms == pytest.approx(3.0)  # (16 - 10) / 2 and (26 - 20) / 2
    assert metrics.median_itl_ms == pytest.approx(3.0) and metrics.p99_itl_ms == pytest.approx(
        3.97)
    assert (metrics.median_e2el_ms, metrics.mean_e2el_ms) == (21.0, 21.0)


def test_prompts_are_seeded():
    spec = LoadSpec(concurrency=1, num_requests=2, prompt_len=16, vocab_size=100, seed=7)
    assert make_prompts(spec, 2, salt=2) == make_prompts(spec, 2, salt=2)
    assert make_prompts(spec, 2, 2) != make_prompts(dataclasses.replace(spec, seed=8), 2, 2)
    assert all(0 <= t < 100 for p in make_prompts(spec, 2, 2) for t in p)
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        LoadSpec(concurrency=0, num_requests=1)


def test_a_shared_prefix_opens_every_prompt_of_a_seed():
    spec = LoadSpec(concurrency=1, num_requests=3, prompt_len=8, vocab_size=100, seed=7,
                    shared_prefix_len=20)
    warm, measured = make_prompts(spec, 2, salt=1), make_prompts(spec, 3, salt=2)
    assert all(len(p) == 28 for p in warm + measured) and spec.total_prompt_len == 28
    assert len({tuple(p[:20]) for p in warm + measured}) == 1  # one prefix, warm-up's too
    assert len({tuple(p[20:]) for p in warm + measured}) == 5  # each its own tokens
    other = make_prompts(dataclasses.replace(spec, seed=8), 1, salt=1)[0]
    assert other[:20] != warm[0][:20]  # a fresh seed, a fresh prefix: rounds share nothing
    assert make_prompts(dataclasses.replace(spec, shared_prefix_len=0), 2, 1) == [
        p[20:] for p in warm]
    runs = [make_prompts(dataclasses.replace(spec, concurrency=c, run=r), 3, 2)
            for c in (1, 2) for r in (1, 2)]  # two cells' runs 1 and 2
    assert {tuple(p[:20]) for prompts in runs for p in prompts} == {tuple(warm[0][:20])}
    assert len({tuple(p[20:]) for prompts in runs for p in prompts}) == 12  # none repeated
    with pytest.raises(ValueError, match="shared_prefix_len must be >= 0"):
        LoadSpec(concurrency=1, num_requests=1, shared_prefix_len=-1)


def test_sse_events_survive_reads_that_split_lines():
    """The soak's SSE reader parses whatever each read brings: events split mid-line across
    reads, CRLF line ends, a comment line, and a last event without its blank line all come out
    whole, in order, and `[DONE]` does not."""
    import asyncio
    import json

    import aiohttp
    from aiohttp import web

    from gate.tools.soak import sse_events

    events = [{"choices": [{"token_ids": [i], "text": f" t{i}"}]} for i in range(5)]
    body = b"".join(b"data: %s\n\n" % json.dumps(e).encode() for e in events[:3])
    body += b": a comment\r\n\r\ndata: %s\r\n\r\n" % json.dumps(events[3]).encode()
    body += b"data: [DONE]\n\ndata: %s" % json.dumps(events[4]).encode()

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for start in range(0, len(body), 7):  # 7 bytes a read: every line is cut somewhere
            await response.write(body[start:start + 7])
            await asyncio.sleep(0.002)
        return response

    async def read() -> list[dict]:
        app = web.Application()
        app.router.add_get("/", stream)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with aiohttp.ClientSession() as session, \
                    session.get(f"http://127.0.0.1:{port}/") as resp:
                return [event async for event in sse_events(resp)]
        finally:
            await runner.cleanup()

    assert asyncio.run(read()) == events


def test_the_load_client_reads_answers_however_the_bytes_are_cut():
    """gate/run/sse_client.py against a raw server: chunked SSE answers whose chunk framing
    and lines are cut every 5 bytes arrive as whole events in order ([DONE], comments and CRLF
    ends as the SSE rules say), on one kept-alive connection; a 400's sized body comes back;
    a connection the server closed while it idled is replaced and the request sent once more;
    an answer framed by the close is whole when it closes."""
    import asyncio
    import json

    from gate.run.sse_client import SseClient

    events = [{"choices": [{"token_ids": [i], "text": f" t{i}"}]} for i in range(5)]
    body = b"".join(b"data: %s\n\n" % json.dumps(e).encode() for e in events[:3])
    body += b": a comment\r\n\r\ndata: %s\r\n\r\n" % json.dumps(events[3]).encode()
    body += b"data: [DONE]\n\ndata: %s" % json.dumps(events[4]).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 9]), body[i:i + 9])
                       for i in range(0, len(body), 9)) + b"0\r\n\r\n"
    answers = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked] * 2 + [
        b'HTTP/1.1 400 Bad Request\r\nContent-Length: 13\r\n\r\n{"error":"x"}',
        None,  # closes the connection unanswered, as a keep-alive timeout does
        b"HTTP/1.0 200 OK\r\n\r\n" + body]
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while answers:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            heads.append(head + await reader.readexactly(length))
            answer = answers.pop(0)
            if answer is None or answer.startswith(b"HTTP/1.0"):
                for start in range(0, len(answer or b""), 5):
                    writer.write(answer[start:start + 5])
                    await writer.drain()
                writer.close()
                return
            for start in range(0, len(answer), 5):
                writer.write(answer[start:start + 5])
                await writer.drain()
                await asyncio.sleep(0.001)

    async def run() -> list:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = SseClient(f"http://127.0.0.1:{port}", {"Authorization": "Bearer k"})
        got = []
        try:
            for _ in range(4):  # 200, 200, 400, then closed + retried: the HTTP/1.0 answer
                seen: list[dict] = []
                status, text = await client.post(0, "/v1/completions", b'{"a":1}',
                                                 lambda line, _t, s=seen: s.append(
                                                     json.loads(line)))
                got.append((status, text, seen))
        finally:
            client.close()
            server.close()
        return got

    got = asyncio.run(run())
    assert [status for status, _, _ in got] == [200, 200, 400, 200]
    assert got[0][2] == got[1][2] == got[3][2] == events
    assert got[2][1:] == (b'{"error":"x"}', [])
    assert len(heads) == 5 and all(h.startswith(b"POST /v1/completions HTTP/1.1\r\n")
                                   and b"Authorization: Bearer k\r\n" in h for h in heads)
    with pytest.raises(ValueError, match="plain http"):
        SseClient("https://example.com")


def test_the_load_client_bench_streams_paced_and_unpaced():
    """gate.tools.load_client_bench against fake_sse.py's processes: every token arrives, a paced
    run takes the time its pace sets (one tick of the fake server's a stream's event), an
    unpaced one less, and the client's CPU over the measured requests is counted."""
    from gate.tools.load_client_bench import measure

    spec = LoadSpec(concurrency=4, num_requests=8, output_len=32, num_clients=2)
    paced = measure(spec, server_processes=1, target=400.0, times=1.0)  # 100 events/s a stream
    unpaced = measure(spec, server_processes=1, target=400.0, times=0.0)
    for answer in (paced, unpaced):
        assert answer["tokens"] == 8 * 32 and answer["client_us_per_token"] > 0
        assert answer["client_processes"] == 2
    assert paced["wall_s"] >= 2 * 31 / 100  # two requests a slot, 31 gaps of 10 ms each
    assert paced["tok_per_s"] <= 400 * 1.05 and paced["itl_p50_ms"] == pytest.approx(10, abs=3)
    assert unpaced["wall_s"] < paced["wall_s"]
