"""The load's HTTP client: streamed completions over kept-alive HTTP/1.1 connections, read by a
bare asyncio Protocol.

Each read of a connection reaches `data_received` straight from the event loop, which takes its
arrival time, takes the body's chunks apart and hands every whole SSE `data:` line to the
request's callback with that time; nothing waits on it but the request's end. A streamed token
then costs the client no task wake-up, stream reader or generator: at one event a read (a
served stream at a GPU's step rate) those made aiohttp's client ~26 µs of CPU a token on the
project's 2-core VM and ~55 µs on the H200's host (issue 35).

Plain http to a host and port (the gate's servers are local). An answer is read as its headers
frame it (chunked, Content-Length, or until the server closes); a non-200 answer's body comes
back whole, for its error. A request on a kept-alive connection that the server closed
meanwhile is sent again on a new one, once, when no byte of an answer came.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit

# an SSE `data:` line's payload and the time the read that completed it arrived (perf_counter)
OnEvent = Callable[[bytes, float], None]


def sse_data(pending: bytes, body: bytes) -> tuple[list[bytes], bytes]:
    """The payloads of the whole SSE `data:` lines in `pending + body` (`[DONE]`, comments and
    other fields left out), and the bytes after the last newline, which wait for more."""
    *lines, rest = (pending + body).split(b"\n")
    return [line[6:] for line in lines
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]")], rest


class HttpError(ConnectionError):
    """The connection failed or broke before the answer was whole."""


class _Connection(asyncio.Protocol):
    """One connection to the server, answering one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.keep_alive = True
        self.num_answers = 0  # answers read whole on this connection
        self.received = False  # a byte of the current answer came
        self._on_event: OnEvent | None = None
        self._done: asyncio.Future | None = None
        self._frame: Callable[[], bool] | None = None  # takes _buffer apart; False: needs more
        self._buffer = b""  # bytes not yet taken apart (the head, chunk framing)
        self._lines = b""  # body bytes after the last newline
        self._status = 0
        self._body: list[bytes] = []  # a non-200 answer's body
        self._remaining = 0  # bytes left of a chunk or a sized body
        self._now = 0.0

    def send(self, request: bytes, on_event: OnEvent) -> asyncio.Future:
        """Writes `request`; the future gets (status, non-200 body) once the answer is whole."""
        self._on_event, self._frame, self.received = on_event, self._head, False
        self._buffer, self._lines, self._body = b"", b"", []
        self._done = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self._done

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self._frame == self._to_close:  # an answer framed by the close is whole now
            self._finish()
        elif self._done is not None and not self._done.done():
            self._done.set_exception(HttpError(f"the connection closed mid-answer ({exc!r})"))

    def data_received(self, data: bytes) -> None:
        self._now = time.perf_counter()
        self.received = True
        self._buffer += data
        try:
            while self._frame is not None and self._frame():
                pass
        except Exception as error:  # noqa: BLE001 - fails its request, not the event loop
            if self._done is not None and not self._done.done():
                self._done.set_exception(HttpError(f"unreadable answer: {error!r}"))
            self._frame = None
            self.transport.abort()

    # -- framing: each takes what it can from _buffer, True when it moved on ----------------

    def _head(self) -> bool:
        head, sep, rest = self._buffer.partition(b"\r\n\r\n")
        if not sep:
            return False
        lines = head.split(b"\r\n")
        self._status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        self.keep_alive = headers.get(b"connection") != b"close"
        self._buffer = rest
        if headers.get(b"transfer-encoding") == b"chunked":
            self._frame = self._chunk_size
        elif b"content-length" in headers:
            self._remaining, self._frame = int(headers[b"content-length"]), self._sized
        else:
            self.keep_alive, self._frame = False, self._to_close
        return True

    def _chunk_size(self) -> bool:
        line, sep, rest = self._buffer.partition(b"\r\n")
        if not sep:
            return False
        self._remaining, self._buffer = int(line.split(b";")[0], 16), rest
        self._frame = self._chunk_data if self._remaining else self._trailer
        return True

    def _chunk_data(self) -> bool:
        if len(self._buffer) < self._remaining + 2:  # the data and its CRLF
            return False
        self._take(self._buffer[:self._remaining])
        self._buffer, self._frame = self._buffer[self._remaining + 2:], self._chunk_size
        return True

    def _trailer(self) -> bool:
        """After the last chunk: trailer lines (none, from our servers), then an empty one."""
        line, sep, rest = self._buffer.partition(b"\r\n")
        if not sep:
            return False
        self._buffer = rest
        if not line:
            self._finish()
        return True

    def _sized(self) -> bool:
        if not self._buffer and self._remaining:
            return False
        piece = self._buffer[:self._remaining]
        self._buffer, self._remaining = self._buffer[len(piece):], self._remaining - len(piece)
        self._take(piece)
        if not self._remaining:
            self._finish()
        return True

    def _to_close(self) -> bool:
        if not self._buffer:
            return False
        self._take(self._buffer)
        self._buffer = b""
        return True

    def _take(self, body: bytes) -> None:
        if self._status != 200:
            self._body.append(body)
            return
        payloads, self._lines = sse_data(self._lines, body)
        for payload in payloads:
            self._on_event(payload, self._now)

    def _finish(self) -> None:
        if self._status == 200:
            self._take(b"\n")  # a last line without its newline
        self._frame = None
        self.num_answers += 1
        if self._done is not None and not self._done.done():
            self._done.set_result((self._status, b"".join(self._body)))


class SseClient:
    """POSTs to one server, each caller (`slot`) on its own kept-alive connection."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the load client speaks plain http to a host: got {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        host_header = f"{self.host}:{self.port}"
        self._head = "".join(f"{name}: {value}\r\n" for name, value in
                             {"Host": host_header, "Content-Type": "application/json",
                              **(headers or {})}.items())
        self._connections: list[_Connection | None] = []

    async def post(self, slot: int, path: str, body: bytes,
                   on_event: OnEvent) -> tuple[int, bytes]:
        """POSTs `body` on slot `slot`'s connection; `on_event` gets each SSE data line as its
        read arrives. Returns (status, the body of a non-200 answer); HttpError when the
        connection fails."""
        request = (f"POST {path} HTTP/1.1\r\n{self._head}Content-Length: {len(body)}\r\n\r\n"
                   ).encode() + body
        connection = await self._connection(slot)
        try:
            return await self._send(connection, request, on_event)
        except HttpError:
            if not connection.num_answers or connection.received:
                raise
        # a kept-alive connection the server closed while it idled: once more, on a new one
        return await self._send(await self._connection(slot), request, on_event)

    @staticmethod
    async def _send(connection: _Connection, request: bytes,
                    on_event: OnEvent) -> tuple[int, bytes]:
        try:
            return await connection.send(request, on_event)
        except BaseException:  # broken, timed out or cancelled mid-answer: never reused
            connection.transport.abort()
            raise

    async def _connection(self, slot: int) -> _Connection:
        while len(self._connections) <= slot:
            self._connections.append(None)
        connection = self._connections[slot]
        if connection is None or connection.closed or connection.transport.is_closing() \
                or not connection.keep_alive:
            if connection is not None and connection.transport is not None:
                connection.transport.close()
            transport, connection = await asyncio.get_running_loop().create_connection(
                _Connection, self.host, self.port)
            # a request is one write, but Nagle must never hold one back behind an ACK
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP,
                                                          socket.TCP_NODELAY, 1)
            self._connections[slot] = connection
        return connection

    def close(self) -> None:
        for connection in self._connections:
            if connection is not None and connection.transport is not None:
                connection.transport.abort()
        self._connections.clear()
