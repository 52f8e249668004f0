"""A fake fast completions server: streams canned SSE events, nothing generated, so a load
client can be measured alone (load_client_bench.py drives the gate's client against it).

    python -m gate.tools.fake_sse [--port 8000] [--rate 0] [--processes 1]

`POST /v1/completions` with `"stream": true` answers `max_tokens` events shaped as the API's
(api._Completion._token_event: the envelope, one choice with a token's text and id), then
`data: [DONE]`. `--rate R` paces each stream to R events a second as a GPU server does: a tick
every 1/R s writes every open stream the events it is due, one a write while the server keeps up
(a step's token for each stream); 0: unpaced, one event a write as fast as the socket takes
them. `GET /health` answers 200.
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


class _Ticker:
    """A process's paced streams: every 1/rate s each is written the events it is due, by one
    timer for all (a per-stream timer costs the server more than the client it measures)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.streams: dict[_Connection, tuple[int, float, int]] = {}  # (sent, start, total)
        self._task: asyncio.Task | None = None

    def add(self, connection: _Connection, num_tokens: int) -> None:
        self.streams[connection] = (0, asyncio.get_running_loop().time(), num_tokens)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        tick = loop.time()
        while self.streams:
            now = loop.time()
            for connection, (sent, start, total) in list(self.streams.items()):
                due = min(total, int((now - start) * self.rate) + 1)
                written = due > sent and connection.write_events(due - sent, due == total)
                if connection.gone or (written and due == total):
                    del self.streams[connection]
                elif written:
                    self.streams[connection] = (due, start, total)
            tick += 1 / self.rate
            await asyncio.sleep(max(0.0, tick - loop.time()))


class _Connection(asyncio.Protocol):
    """One client connection: requests read one after another, each answered in turn, paced by
    `ticker` (None: unpaced)."""

    def __init__(self, ticker: _Ticker | None) -> None:
        self._ticker = ticker
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
        self._transport.write(STREAM_HEAD)
        if self._ticker is not None:
            self._ticker.add(self, num_tokens)
        else:
            asyncio.get_running_loop().create_task(self._unpaced(num_tokens))

    @property
    def gone(self) -> bool:
        return self._transport is None

    def write_events(self, count: int, last: bool) -> bool:
        """Writes `count` events in one write (and the end, when `last`); False while the
        client's buffers are full (the ticker tries again next tick)."""
        if self._transport is None or not self._writable.is_set():
            return False
        self._transport.write(_chunk(EVENT * count) + (_chunk(DONE) + b"0\r\n\r\n"
                                                       if last else b""))
        if last:
            self._busy = False
            self._next_request()
        return True

    async def _unpaced(self, num_tokens: int) -> None:
        """One event a write, as fast as the socket takes them."""
        for sent in range(1, num_tokens + 1):
            await self._writable.wait()
            if not self.write_events(1, sent == num_tokens):
                return
            if sent % 16 == 0:
                await asyncio.sleep(0)  # let the other streams write too


def listen(port: int) -> socket.socket:
    # IPPROTO_TCP by name: asyncio sets TCP_NODELAY only on sockets that say so, and with Nagle
    # a stream's first event waited for the ACK of its head (~40 ms a request)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
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
        ticker = _Ticker(rate) if rate else None
        server = await loop.create_server(lambda: _Connection(ticker), sock=listen(port))
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
