"""A streamed choice written to its client by the engine client's router, as each output arrives.

With one choice a completion's stream needs no task of its own between its first output and its
last: the router (client.py) calls `PushedStream.put_nowait` with each output, which renders the
output's SSE events and writes them, framed as the response's transfer encoding asks, straight
to the connection's transport. A streamed token then costs no queue, no task wake-up, no
generator resumption and no pass through aiohttp's writer; on the H200's host those were about
half of the API process's ~28 µs of CPU a token, which went to ~19.5 (py-spy,
results/2026-12-04-h200-frontend). The handler only waits for the end.

Until `start` (the response's headers and first events are out) outputs are held; `first`
waits for them. A write to a closing transport, or an error while rendering, ends the stream with
that error, raised where the handler waits (`wait`). A client that stops reading fills the
transport's buffer; the connection's stall timer (connections.py) then drops it, which cancels the
handler, which aborts the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from resident.engine.types import RequestOutput, plain_output


class PushedStream:
    """One choice's outputs (client.Pushed): held until `start`, then written as
    `events(outputs)` renders them, until `is_done()`; a plain output's event as
    `token_event(token, num_cached_tokens)` renders it (None: as `events` does)."""

    def __init__(self, events: Callable[[list[RequestOutput]], bytes],
                 token_event: Callable[[int, int], bytes | None],
                 is_done: Callable[[], bool]) -> None:
        loop = asyncio.get_running_loop()
        self._events, self._token_event, self._is_done = events, token_event, is_done
        self._held: list[RequestOutput] = []
        self._arrived = loop.create_future()
        self._ended = loop.create_future()
        self._transport: asyncio.Transport | None = None
        self._chunked = False
        self.finished = False  # the engine request's finished output came

    def put_nowait(self, output: RequestOutput) -> None:
        """The router's hand-off: never blocks, never raises."""
        if output.finished:
            self.finished = True
        if self._ended.done():
            return
        if self._transport is None:
            self._held.append(output)
            if not self._arrived.done():
                self._arrived.set_result(None)
        else:
            self._write([output])

    def put_token(self, request_id: str, token: int, num_cached_tokens: int) -> None:
        """`put_nowait` of a plain output (types.is_plain), given as its parts: written
        without building it where the stream is writing and its token event renders it."""
        data = None
        if self._transport is not None and not self._ended.done():
            try:
                data = self._token_event(token, num_cached_tokens)
            except Exception as error:  # noqa: BLE001 - raised in the handler, not the router
                self._ended.set_exception(error)
                return
        if data is None:
            self.put_nowait(plain_output(request_id, token, num_cached_tokens))
        else:
            self._send(data)

    async def first(self) -> list[RequestOutput]:
        """The outputs that arrived before the response started (at least one)."""
        await self._arrived
        held, self._held = self._held, []
        return held

    def start(self, request: web.Request, response: web.StreamResponse) -> None:
        """From now on outputs are written as they arrive; those held since `first` go now.
        Call once the response has written a non-empty body through aiohttp (which sends the
        headers it holds back until then)."""
        self._chunked = response.headers.get("Transfer-Encoding") == "chunked"
        self._transport = request.transport
        held, self._held = self._held, []
        if held:
            self._write(held)
        elif self._is_done():
            self._end()

    async def wait(self) -> None:
        """Until the choice is done; raises what ended the stream otherwise."""
        await self._ended

    def stop(self) -> None:
        """No more writes (the handler writes what follows itself)."""
        self._transport = None
        self._end()

    def _write(self, outputs: list[RequestOutput]) -> None:
        if self._ended.done():
            return
        try:
            data = self._events(outputs)
        except Exception as error:  # noqa: BLE001 - raised in the handler, not the router
            self._ended.set_exception(error)
            return
        if self._send(data) and self._is_done():
            self._end()

    def _send(self, data: bytes) -> bool:
        """Writes `data`, framed; False where it could not (the stream then ends with why)."""
        transport = self._transport
        try:
            if transport is None or transport.is_closing():
                raise ConnectionResetError("the client went away")
            if data:
                transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)
        except Exception as error:  # noqa: BLE001 - raised in the handler, not the router
            self._ended.set_exception(error)
            return False
        return True

    def _end(self) -> None:
        if not self._ended.done():
            self._ended.set_result(None)
