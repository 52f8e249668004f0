"""EngineClient: an API process's asyncio handle on the engine core.

Each API process (`api_index`, 0 for the first: the one that spawned the core) binds its two
IPC pipes and the core connects, so the core may start (and fail)
after the API is listening. One reader task routes core messages: a request's outputs to its
stream, stats replies to their waiters, Ready and Fatal to whoever waits on startup. Every message
(Heartbeat included) stamps `last_heard`, so serve.py can tell a stuck or dead core from a quiet
one; `fail` and `abort_all` end every open stream when it cannot go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import zmq
import zmq.asyncio

from resident.engine.types import (
    FINISH_ABORT,
    FINISH_ERROR,
    EngineRequest,
    RequestOutput,
    plain_output,
)
from resident.server.protocol import (
    AbortRequest,
    AddRequest,
    ApiGone,
    Fatal,
    ProfileQuery,
    Ready,
    Shutdown,
    StatsQuery,
    StatsReply,
    StepOutputs,
)

log = logging.getLogger("resident.api")
FLUSH_RETRY_S = 0.001  # a queued request waits this long when the core's pipe is full
PROFILE_EXPORT_S = 300.0  # a window's trace written and summarized within this, after it closes
# zmq.POLLIN as a plain int: `events & zmq.POLLIN` runs enum.Flag's Python operator (~0.6 µs),
# twice a step in _drain
POLLIN = int(zmq.POLLIN)


class EngineUnavailable(RuntimeError):
    """The core is not ready, or has failed; carries the reason."""


class _Stream(Protocol):
    """Where the router puts one request's outputs: an `_Outputs` queue, or a `Pushed`.
    `put_token` takes a plain output (types.is_plain) as its parts."""

    def put_nowait(self, output: RequestOutput) -> None: ...

    def put_token(self, request_id: str, token: int, num_cached_tokens: int) -> None: ...


class _Outputs(asyncio.Queue):
    """A request's outputs for `generate` to yield."""

    def put_token(self, request_id: str, token: int, num_cached_tokens: int) -> None:
        self.put_nowait(plain_output(request_id, token, num_cached_tokens))


class Pushed(_Stream, Protocol):
    """A stream that takes each output as the router routes it (server/pushed.py): its
    `put_nowait` never blocks or raises, and `finished` says whether the finished output
    came."""

    finished: bool


class EngineClient:
    def __init__(self, request_addr: str, output_addr: str, api_index: int = 0) -> None:
        self.api_index = api_index
        self._context = zmq.asyncio.Context()
        self._requests = self._context.socket(zmq.PUSH)
        self._requests.bind(request_addr)
        # requests and aborts, queued in a turn of the event loop and sent as one (_post)
        self._sending = zmq.Socket.shadow(self._requests.underlying)
        self._outbox: list[Any] = []
        self._outputs = self._context.socket(zmq.PULL)
        self._outputs.bind(output_addr)
        self._streams: dict[str, _Stream] = {}
        self._stats_waiters: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._nonces = itertools.count()
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        # the output pipe read by the event loop's own reader callback (start)
        self._reading = zmq.Socket.shadow(self._outputs.underlying)
        self._reader_fd: int | None = None
        self.fatal: str | None = None
        self.info: dict[str, Any] = {}
        self.last_heard = time.monotonic()

    @property
    def num_streams(self) -> int:
        """Requests in flight: submitted and not finished."""
        return len(self._streams)

    @property
    def silent_s(self) -> float:
        """Seconds since the core's last message (it sends one at least every second)."""
        return time.monotonic() - self.last_heard

    @property
    def is_ready(self) -> bool:
        return self._ready is not None and self._ready.done() and self.fatal is None

    def start(self) -> None:
        """Starts routing core messages; call from the running event loop."""
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._reader_fd = self._reading.getsockopt(zmq.FD)
        loop.add_reader(self._reader_fd, self._drain)
        loop.call_soon(self._drain)  # what came before the reader was added

    async def wait_ready(self) -> dict[str, Any]:
        assert self._ready is not None, "start() first"
        return await asyncio.shield(self._ready)

    async def generate(self, request: EngineRequest) -> AsyncIterator[list[RequestOutput]]:
        """Submits a request and yields its outputs until the finished one: each time, every
        output that arrived since the consumer last asked (one while it keeps up; more once it
        falls behind, so a stream writes them at once, as vLLM's output collector merges them).
        Leaving the loop early (a client that went away) aborts the request in the core."""
        queue: _Outputs[RequestOutput] = _Outputs()
        finished = False
        async with self._submitted(request, queue, lambda: finished):
            while not finished:
                outputs = [await queue.get()]
                while not outputs[-1].finished and not queue.empty():
                    outputs.append(queue.get_nowait())
                finished = outputs[-1].finished
                yield outputs

    @contextlib.asynccontextmanager
    async def pushed(self, request: EngineRequest, stream: Pushed):
        """Submits a request whose outputs the router hands to `stream` as each arrives, in
        the event loop, before any stream task runs: a streamed token then costs no task
        wake-up, queue or generator (issue 35). Leaving the block before the finished output
        aborts the request in the core."""
        async with self._submitted(request, stream, lambda: stream.finished):
            yield

    @contextlib.asynccontextmanager
    async def _submitted(self, request: EngineRequest, stream: _Stream,
                         finished: Callable[[], bool]):
        """`request` sent to the core with its outputs routed to `stream`; on leaving, routing
        stops and an unfinished request is aborted."""
        if not self.is_ready:
            raise EngineUnavailable(self.fatal or "the engine is still starting")
        self._streams[request.request_id] = stream
        try:
            self._post(AddRequest(request, self.api_index))
            yield
        finally:
            self._streams.pop(request.request_id, None)
            if not finished() and self.fatal is None:
                self._post(AbortRequest(request.request_id))

    def _post(self, message: Any) -> None:
        """Queues a request or an abort for the core. What a turn of the event loop queues
        leaves as one message (a list) at its end: pyzmq wakes its I/O thread once for them,
        where a lone send costs ~50 µs of CPU (results/2026-12-05-cpu-intake), and a wave of
        requests handled in one turn costs one wake. Order is kept."""
        self._outbox.append(message)
        if len(self._outbox) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        batch, self._outbox = self._outbox, []
        try:
            self._sending.send_pyobj(batch if len(batch) > 1 else batch[0], flags=zmq.NOBLOCK)
        except zmq.Again:  # the pipe to the core is full (the core is behind): try again soon
            if self.fatal is None:  # else the core is gone and fail() has ended every stream
                self._outbox[:0] = batch
                asyncio.get_running_loop().call_later(FLUSH_RETRY_S, self._flush)
        except zmq.ZMQError:  # closed: the core is gone, and fail() ends the streams
            pass

    async def stats(self, timeout: float = 10.0, section: str = "stats") -> dict[str, Any]:
        """The core's answer to a StatsQuery of that section (protocol.StatsQuery)."""
        return await self._query(lambda nonce: StatsQuery(nonce, section, self.api_index),
                                 timeout)

    async def profile(self, steps: int, seconds: float, tool: str) -> dict[str, Any]:
        """Opens a profile window in the core; its answer once the window closes (writing and
        summarizing the trace may take a while after it)."""
        return await self._query(
            lambda nonce: ProfileQuery(nonce, steps, seconds, tool, self.api_index),
            seconds + PROFILE_EXPORT_S)

    async def _query(self, message, timeout: float) -> dict[str, Any]:
        """Sends message(nonce) and waits for the StatsReply carrying that nonce."""
        if not self.is_ready:
            raise EngineUnavailable(self.fatal or "the engine is still starting")
        nonce = next(self._nonces)
        waiter = asyncio.get_running_loop().create_future()
        self._stats_waiters[nonce] = waiter
        try:
            await self._requests.send_pyobj(message(nonce))
            return await asyncio.wait_for(waiter, timeout)
        finally:
            self._stats_waiters.pop(nonce, None)

    async def api_gone(self, api_index: int) -> None:
        """Tells the core another API process died (its requests are aborted)."""
        with contextlib.suppress(zmq.ZMQError):
            await self._requests.send_pyobj(ApiGone(api_index), flags=zmq.NOBLOCK)

    async def close(self) -> None:
        """Stops routing and closes the pipes; the first API process (api_index 0, whose
        child the core is) also tells the core to exit, after what is still queued."""
        if self._outbox:
            self._flush()
        if self.fatal is None and self.api_index == 0:
            with contextlib.suppress(zmq.ZMQError):
                await self._requests.send_pyobj(Shutdown(), flags=zmq.NOBLOCK)
        self._stop_reading()
        self._requests.close(linger=100)
        self._outputs.close(linger=0)
        self._context.term()

    def _drain(self) -> None:
        """Routes every core message queued on the output pipe, as the loop finds it readable:
        no future or task a message (pyzmq's asyncio recv made two; at c=4 and a 1 ms step the
        API's CPU a token went 65 -> 47 µs on the project's VM, results/2026-12-04-h200-frontend).
        zmq's descriptor is edge-triggered: it is read until zmq says nothing more is queued. A
        stream that fell behind finds all its outputs routed before it runs, and writes them at
        once."""
        try:
            while self._reader_fd is not None \
                    and self._reading.getsockopt(zmq.EVENTS) & POLLIN:
                try:
                    message = self._reading.recv_pyobj(zmq.NOBLOCK)
                except zmq.Again:  # zmq said a message was there and it was not: wait again
                    return
                if not self._route(message):
                    self._stop_reading()
        except Exception as err:  # noqa: BLE001 - every open stream must learn the pipe broke
            self._stop_reading()
            self.fail(f"reading from the engine core failed: {type(err).__name__}")

    def _stop_reading(self) -> None:
        if self._reader_fd is not None:
            asyncio.get_running_loop().remove_reader(self._reader_fd)
            self._reader_fd = None

    def _route(self, message) -> bool:
        """One core message to whoever waits for it; False once the core has failed."""
        self.last_heard = time.monotonic()
        if isinstance(message, StepOutputs):
            streams = self._streams
            for request_id, token, cached in zip(message.request_ids, message.tokens,
                                                 message.num_cached_tokens, strict=True):
                stream = streams.get(request_id)
                if stream is not None:
                    stream.put_token(request_id, token, cached)
            for output in message.others:
                stream = streams.get(output.request_id)
                if stream is not None:
                    stream.put_nowait(output)
        elif isinstance(message, StatsReply):
            waiter = self._stats_waiters.get(message.nonce)
            if waiter is not None and not waiter.done():
                waiter.set_result(message.stats)
        elif isinstance(message, Ready):
            self.info = message.info
            if not self._ready.done():
                self._ready.set_result(message.info)
        elif isinstance(message, Fatal):
            self.fail(message.message)
            return False
        return True

    def fail(self, reason: str) -> None:
        """The core cannot go on: every open stream ends with an error, every waiter fails,
        and the client refuses new work. `reason` is one line: clients see it."""
        if self.fatal is not None:
            return
        log.error("engine core failed: %s", reason)
        self.fatal = reason
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(EngineUnavailable(reason))
            # retrieved here: a core that fails before Ready may have no waiter, and asyncio
            # would log the unretrieved exception with a traceback at exit
            self._ready.exception()
        self._end_streams(FINISH_ERROR, f"engine unavailable: {reason}")
        for waiter in self._stats_waiters.values():
            if not waiter.done():
                waiter.set_exception(EngineUnavailable(reason))

    def abort_all(self, reason: str) -> int:
        """Aborts every request in flight (the core frees them; each stream ends with
        finish_reason `abort` and `reason`); returns how many."""
        request_ids = list(self._streams)
        for request_id in request_ids:  # after any add still queued (_post keeps the order)
            self._post(AbortRequest(request_id))
        self._end_streams(FINISH_ABORT, reason)
        return len(request_ids)

    def _end_streams(self, finish_reason: str, error: str) -> None:
        for request_id, queue in self._streams.items():
            queue.put_nowait(RequestOutput(request_id, [], finished=True,
                                           finish_reason=finish_reason, error=error))
