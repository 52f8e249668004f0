"""The listener's limits: how many connections the API process holds, how long one may idle or
take to send a request, how long a client may leave its stream unread, and what an accept
error costs. A hostile or broken client (idle sockets by the thousand, half-sent requests,
streams it never reads) costs a bounded number of descriptors and seconds, never /health.

- **Keep-alive**: a connection with no request in progress is closed `keepalive_timeout_s`
  after its last response (aiohttp's own timer; its default is an hour).
- **Request heads**: every request's head (not only a connection's first) must be whole within
  `read_timeout_s` of its first byte, or of the connection opening; else the connection closes.
  A body that does not arrive within `read_timeout_s` of its head fails the handler reading it
  with 408 (a handler that no longer reads it: the connection closes).
- **The cap**: at most `max_connections` open at once, below the descriptor limit
  (`connection_cap` checks it at start). At the cap a new connection closes the connection
  that has idled longest (no request in progress: a kept-alive or half-sent one), so a client
  that hoards sockets cannot lock out /health; with none idle it is closed at once. Either is
  logged at most once a second, with counts.
- **Unread streams**: each connection's kernel send buffer (SO_SNDBUF) and the transport's
  buffer above it hold `send_buffer_kib` each (Linux doubles the kernel's), not the megabytes
  the kernel would grow to, so a client that stops reading fills them within seconds; a
  response whose buffers then stay full for `send_stall_s` is dropped; dropping its
  connection cancels its handler, which aborts the request in the engine core (its pages and
  slot return).
- **Accept errors** (EMFILE, ENFILE, ...): asyncio already retries accepting a second later;
  `quiet_accept_errors` makes each a line a second at most instead of a traceback.

Requests aiohttp cannot parse get the JSON error shape; those and aiohttp's own connection
errors are logged a line a second at most. All this needs aiohttp's request handler, whose
hooks (`_waiter`, `_messages`, `_current_request`, `_handle_request`) are not public API:
`serve_http` installs them where the running aiohttp has them and otherwise serves with the
keep-alive timeout only (and logs that).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass

from aiohttp import web

from resident.server.http import error_response, error_type
from resident.server.validation import ApiError

log = logging.getLogger("resident.api")
RESERVED_FDS = 64  # descriptors kept for everything but client connections (IPC, logs, files)
AUTO_MAX_CONNECTIONS = 16384  # max_connections=0 takes the descriptor limit, up to this
ACCEPT_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


@dataclass(frozen=True)
class ConnectionLimits:
    """The listener's limits (knobs of the same names; `max_connections` resolved)."""

    max_connections: int
    keepalive_timeout_s: float
    read_timeout_s: float
    send_stall_s: float
    send_buffer_bytes: int

    def __post_init__(self) -> None:
        for name in ("max_connections", "send_buffer_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("keepalive_timeout_s", "read_timeout_s", "send_stall_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


def connection_cap(max_connections: int) -> int:
    """The connection cap: `max_connections`, or for 0 the descriptor limit less RESERVED_FDS
    (at most AUTO_MAX_CONNECTIONS). Raises the soft RLIMIT_NOFILE toward the hard one when the
    cap needs it; ValueError, naming the knob, when the hard limit cannot hold it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    hard_fds = AUTO_MAX_CONNECTIONS + RESERVED_FDS if hard == resource.RLIM_INFINITY else hard
    wanted = max_connections or min(AUTO_MAX_CONNECTIONS, hard_fds - RESERVED_FDS)
    if wanted < 1 or wanted + RESERVED_FDS > hard_fds:
        raise ValueError(f"knob max_connections: {max_connections or 'auto'} needs "
                         f"{wanted + RESERVED_FDS} file descriptors ({RESERVED_FDS} kept for "
                         f"the rest), over this process's hard limit of {hard} (ulimit -Hn)")
    if soft != resource.RLIM_INFINITY and wanted + RESERVED_FDS > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted + RESERVED_FDS, hard))
    return wanted


class RateLimitedLog:
    """Logs an event at most once every `period_s`: the first at once, later ones with how many
    came since the last line (a flood costs a line a second)."""

    def __init__(self, message: str, level: int = logging.WARNING, period_s: float = 1.0):
        self._message, self._level, self._period_s = message, level, period_s
        self._count = 0
        self._last = -period_s

    def event(self, detail: str = "") -> None:
        self._count += 1
        now = time.monotonic()
        if now - self._last >= self._period_s:
            count = f" ({self._count} since the last such line)" if self._count > 1 else ""
            log.log(self._level, "%s%s%s", self._message, f": {detail}" if detail else "",
                    count)
            self._count, self._last = 0, now


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Out-of-descriptor accept errors become a line a second at most (asyncio itself pauses
    accepting for a second after each); every other loop error goes to the default handler."""
    accept_errors = RateLimitedLog("accepting a connection failed (asyncio retries in 1 s)")

    def handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        error = context.get("exception")
        if isinstance(error, OSError) and error.errno in ACCEPT_ERRNOS:
            accept_errors.event(f"{errno.errorcode.get(error.errno, error.errno)}: "
                                f"{error.strerror}")
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


def bind(host: str, port: int, backlog: int = 2048, reuse_port: bool = False) -> socket.socket:
    """The listening socket, bound now so that a port in use fails before anything starts;
    OSError names the address. `reuse_port`: SO_REUSEPORT, for several API processes on one
    port (the kernel spreads new connections over them)."""
    try:
        return socket.create_server((host, port), backlog=backlog, reuse_port=reuse_port)
    except OSError as error:
        raise OSError(error.errno, f"cannot listen on {host}:{port}: {error.strerror}") from None


async def serve_http(app: web.Application, sock: socket.socket,
                     limits: ConnectionLimits) -> web.AppRunner:
    """Serves `app` on the bound socket under `limits`; returns the runner, whose `cleanup()`
    stops it. Handlers are cancelled when their client disconnects (so the core aborts the
    request), access logs are off (they cost time per request)."""
    quiet_accept_errors(asyncio.get_running_loop())
    runner = _GuardedRunner(app, limits, access_log=None, handler_cancellation=True,
                            keepalive_timeout=limits.keepalive_timeout_s)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    log.info("connections: at most %d (max_connections), keep-alive %g s, request heads and "
             "bodies within %g s, unread streams dropped after %g s (send buffers %d KiB)",
             limits.max_connections, limits.keepalive_timeout_s, limits.read_timeout_s,
             limits.send_stall_s, limits.send_buffer_bytes >> 10)
    return runner


class _GuardedRunner(web.AppRunner):
    """An AppRunner whose request handlers keep the module's limits."""

    def __init__(self, app: web.Application, limits: ConnectionLimits, **kwargs) -> None:
        super().__init__(app, **kwargs)
        self._limits = limits

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        try:
            _guard(server, _Connections(self._limits))
        except AttributeError as error:  # another aiohttp: serve with its keep-alive only
            log.warning("aiohttp: serving without the connection cap, request-head timeout, "
                        "unread-stream drop and JSON parse errors (%s)", error)
        return server


class _Connections:
    """The open connections of one listener: how many, and which idle, oldest first."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.num_open = 0
        self.idle: OrderedDict[_GuardedHandler, None] = OrderedDict()
        self.evicted = RateLimitedLog("at max_connections: closed the longest-idle connection "
                                      "for a new one", logging.INFO)
        self.refused = RateLimitedLog("at max_connections with none idle: refused a connection")
        self.slow_heads = RateLimitedLog("closed a connection whose request head did not "
                                         "arrive in read_timeout_s", logging.INFO)
        self.unparsable = RateLimitedLog("answered a request that could not be parsed as "
                                         "HTTP (400)", logging.INFO)
        self.handler_errors = RateLimitedLog("a connection failed in aiohttp", logging.INFO)
        self.unread = RateLimitedLog("dropped a stream its client did not read for "
                                     "send_stall_s (its request is aborted)")

    def admit(self) -> bool:
        """Room for a new connection: True, after closing the longest-idle one if at the cap;
        False (refuse it) when at the cap with none idle."""
        if self.num_open < self.limits.max_connections:
            return True
        if not self.idle:
            self.refused.event(f"{self.num_open} open")
            return False
        oldest, _ = self.idle.popitem(last=False)
        oldest.drop()
        self.evicted.event()
        return True


def _guard(server: web.Server, connections: _Connections) -> None:
    """Makes `server`, the protocol factory the site listens with, make our request handlers.
    Raises AttributeError (changing nothing) where aiohttp's handler lacks what they need."""
    loop, kwargs = server._loop, server._kwargs  # noqa: SLF001 - read once, checked here
    probe = _GuardedHandler(server, loop=loop, **kwargs)
    for hook in ("_waiter", "_messages", "_current_request", "_handle_request"):
        if not hasattr(probe, hook):
            raise AttributeError(f"the request handler has no {hook}")

    def make(self) -> web.RequestHandler:
        return _GuardedHandler(self, loop=loop, connections=connections, **kwargs)

    # the site calls the server (a special method: looked up on the type)
    server.__class__ = type("_GuardedServer", (type(server),), {"__call__": make})


def _limit_send_buffer(transport: asyncio.Transport, num_bytes: int) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, num_bytes)
    transport.set_write_buffer_limits(high=num_bytes)


class _GuardedHandler(web.RequestHandler):
    """aiohttp's request handler under the module's limits; a request it cannot parse gets the
    JSON error shape and one log line."""

    def __init__(self, manager, *, connections: _Connections | None = None, **kwargs) -> None:
        super().__init__(manager, **kwargs)
        self._connections = connections
        self._head_timer: asyncio.TimerHandle | None = None
        self._stall_timer: asyncio.TimerHandle | None = None
        self._counted = False

    # -- the cap and idle connections -------------------------------------------------------

    def connection_made(self, transport) -> None:
        connections = self._connections
        if connections is not None and not connections.admit():
            transport.abort()  # refused before aiohttp starts anything for it
            return
        super().connection_made(transport)
        if connections is not None:
            _limit_send_buffer(transport, connections.limits.send_buffer_bytes)
            connections.num_open += 1
            self._counted = True
            self._become_idle()
            self._head_timer = self._loop.call_later(connections.limits.read_timeout_s,
                                                     self._drop_slow_head)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._counted:
            self._counted = False
            self._connections.num_open -= 1
            self._connections.idle.pop(self, None)
            for timer in (self._head_timer, self._stall_timer):
                if timer is not None:
                    timer.cancel()
        super().connection_lost(exc)

    def drop(self) -> None:
        """Closes the connection now (its handler, if any, is cancelled)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()

    def _become_idle(self) -> None:
        self._connections.idle[self] = None
        self._connections.idle.move_to_end(self)

    async def _handle_request(self, request, start_time, request_handler):
        if self._connections is not None:
            self._connections.idle.pop(self, None)
        try:
            return await super()._handle_request(request, start_time, request_handler)
        finally:
            if self._counted:
                self._become_idle()

    # -- request heads and bodies -----------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        connections = self._connections
        if connections is None:
            super().data_received(data)
            return
        waiting = self._waiter is not None and not self._waiter.done()
        if waiting and self._head_timer is None:
            # the first bytes of a request head: it must be whole within read_timeout_s
            self._head_timer = self._loop.call_later(connections.limits.read_timeout_s,
                                                     self._drop_slow_head)
        super().data_received(data)
        if self._messages and self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
            _message, payload = self._messages[-1]
            if not payload.is_eof():
                self._loop.call_later(connections.limits.read_timeout_s, self._check_body,
                                      payload)

    def _drop_slow_head(self) -> None:
        self._head_timer = None
        if self._waiter is not None and not self._waiter.done() and not self._messages:
            self._connections.slow_heads.event()
            self.drop()

    def _check_body(self, payload) -> None:
        """read_timeout_s after a head: a body still short fails the handler reading it (408),
        or, with no handler on it any more, the connection."""
        if payload.is_eof() or self.transport is None or self.transport.is_closing():
            return
        limit = self._connections.limits.read_timeout_s
        if self._current_request is not None:
            payload.set_exception(ApiError(408, "timeout_error", f"the request body did not "
                                           f"arrive within read_timeout_s = {limit:g} s"))
        else:
            self.drop()

    # -- unread streams ---------------------------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._connections is not None and self._stall_timer is None:
            self._stall_timer = self._loop.call_later(self._connections.limits.send_stall_s,
                                                      self._drop_unread)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _drop_unread(self) -> None:
        self._stall_timer = None
        self._connections.unread.event()
        self.drop()

    # -- requests aiohttp cannot parse ------------------------------------------------------

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        self._connections.unparsable.event(type(exc).__name__ if exc else message or "")
        response = error_response(status, error_type(status),
                                  "the request could not be parsed as HTTP")
        response.force_close()
        return response

    def log_exception(self, *args, **kwargs) -> None:
        """aiohttp's own connection-level errors (a body that failed mid-read, a write to a
        gone client): a line a second at most, never a traceback per connection."""
        error = kwargs.get("exc_info")
        self._connections.handler_errors.event(
            type(error).__name__ if isinstance(error, BaseException) else str(args[0]))
