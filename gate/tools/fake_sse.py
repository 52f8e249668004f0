"""A fake fast completions server: streams canned SSE events, nothing generated, so a load
client can be measured alone (load_client_bench.py drives the gate's client against it).

    python -m gate.tools.fake_sse [--port 8000] [--rate 0] [--processes 1]

`POST /v1/completions` with `"stream": true` answers `max_tokens` events shaped as the API's
(api._Completion._token_event: the envelope, one choice with a token's text and id), then
`data: [DONE]`. `--rate R` paces each stream to R events a second, one event a write while the
server keeps up (as the API writes at one token a step); 0: unpaced, one event a write as fast
as the socket takes them. `GET /health` answers 200.
Connections are kept alive (chunked responses). `--processes N` serves from N processes on
one port (SO_REUSEPORT), so the server is not what paces the client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import signal
import socket
import sys

EVENT = (b'data: {"id":"cmpl-fake","object":"text_completion","created":1764777600,'
         b'"model":"fake","choices":[{"index":0,"text":" the","token_ids":[279],'
         b'"finish_reason":null,"logprobs":null}]}\n\n')
DONE = b"data: [DONE]\n\n"
STREAM_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
               b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
HEALTH = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 16\r\n\r\n' \
         b'{"status": "ok"}'
BAD = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Connection(asyncio.Protocol):
    """One client connection: requests read one after another, each answered in turn."""

    def __init__(self, rate: float) -> None:
        self._rate = rate
        self._buffer = b""
        self._transport: asyncio.Transport | None = None
        self._busy = False
        self._writable = asyncio.Event()
        self._writable.set()

    def connection_made(self, transport) -> None:
        self._transport = transport

    def connection_lost(self, exc) -> None:
        self._transport = None
        self._writable.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if not self._busy:
            self._next_request()

    def _next_request(self) -> None:
        head, sep, rest = self._buffer.partition(b"\r\n\r\n")
        if not sep:
            return
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(rest) < length:
            return
        body, self._buffer = rest[:length], rest[length:]
        if head.startswith(b"GET /health"):
            self._transport.write(HEALTH)
            self._next_request()
            return
        try:
            num_tokens = int(json.loads(body)["max_tokens"])
        except (ValueError, KeyError, TypeError):
            self._transport.write(BAD)
            self._transport.close()
            return
        self._busy = True
        asyncio.get_running_loop().create_task(self._stream(num_tokens))

    async def _stream(self, num_tokens: int) -> None:
        """The events, each stream paced to `rate` a second: what is due goes out in one write
        (one event while the server keeps up; several once it is late, as the API writes a
        stream's pending events at once)."""
        loop = asyncio.get_running_loop()
        self._transport.write(STREAM_HEAD)
        start, sent = loop.time(), 0
        while sent < num_tokens:
            if self._rate:
                due = min(num_tokens, int((loop.time() - start) * self._rate) + 1)
                if due <= sent:
                    await asyncio.sleep(start + sent / self._rate - loop.time())
                    continue
            else:
                due = sent + 1
            await self._writable.wait()
            if self._transport is None:
                return
            self._transport.write(_chunk(EVENT * (due - sent)))
            sent = due
            if not self._rate and sent % 16 == 0:
                await asyncio.sleep(0)  # let the other streams write too
        self._transport.write(_chunk(DONE) + b"0\r\n\r\n")
        self._busy = False
        self._next_request()


def listen(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(4096)
    return sock


def serve_process(port: int, rate: float) -> None:
    """One serving process (runs until SIGTERM or SIGINT)."""
    async def run() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        server = await loop.create_server(lambda: _Connection(rate), sock=listen(port))
        async with server:
            await stop.wait()

    asyncio.run(run())


def start(port: int, rate: float, num_processes: int) -> list[multiprocessing.Process]:
    """`num_processes` serving processes on `port`, started; terminate() each to stop."""
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=serve_process, args=(port, rate), daemon=True)
                 for _ in range(num_processes)]
    for process in processes:
        process.start()
    return processes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--rate", type=float, default=0.0,
                        help="events a second a stream; 0: unpaced")
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args(argv)
    if args.rate < 0:
        parser.error(f"--rate must be >= 0, got {args.rate}")
    if args.processes < 1:
        parser.error(f"--processes must be >= 1, got {args.processes}")
    processes = start(args.port, args.rate, args.processes)
    print(f"fake SSE server on http://127.0.0.1:{args.port} ({args.processes} processes)")
    try:
        for process in processes:
            process.join()
    except KeyboardInterrupt:
        for process in processes:
            process.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
