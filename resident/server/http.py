"""The HTTP layer under the API's routes: one error shape, request ids, the API key, and the
listener's own limits.

Every answer that is not a success is `{"error": {"message", "type", "request_id"}}` with an
HTTP status, whatever raised it: our validation (ApiError), aiohttp's own HTTP errors (404, 405,
413, ...), an engine that is gone (503), or a bug (500, whose traceback is logged once, with the
request id, and never sent). Every response carries `X-Request-Id`.

The listener: a request's headers must arrive within `read_timeout_s` of the connection opening
(or the connection is closed: half-sent requests do not hold sockets), and a request line or
header aiohttp cannot parse gets the JSON shape too and one log line, not a traceback. Both need
aiohttp's request handler, whose hooks are not public API: `serve_http` installs them where the
running aiohttp has them, and otherwise serves without them (and logs that it did).
"""

from __future__ import annotations

import hmac
import logging
import socket
import uuid
from collections.abc import Callable

from aiohttp import web

from resident.server.validation import ApiError

log = logging.getLogger("resident.api")
# a typed key where aiohttp has them (3.12+: plain string keys warn there); the GPU host's
# aiohttp may be older
REQUEST_ID = web.RequestKey("request_id", str) if hasattr(web, "RequestKey") else "request_id"


def error_response(status: int, type: str, message: str, request_id: str | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    error = {"message": message, "type": type}
    if request_id:
        error["request_id"] = request_id
    return web.json_response({"error": error}, status=status, headers=headers)


_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error",
          429: "rate_limit_error", 503: "service_unavailable", 504: "timeout_error"}


def request_id_of(request: web.Request) -> str:
    return request.get(REQUEST_ID) or ""


@web.middleware
async def request_ids(request: web.Request, handler) -> web.StreamResponse:
    """Gives each request an id (the client's X-Request-Id if it sent a short one) and puts it
    on the response."""
    given = request.headers.get("X-Request-Id", "")
    request[REQUEST_ID] = given if 0 < len(given) <= 64 and given.isprintable() \
        else uuid.uuid4().hex
    response = await handler(request)
    if not response.prepared:
        response.headers["X-Request-Id"] = request[REQUEST_ID]
    return response


def errors(engine_errors: tuple[type[Exception], ...]) -> Callable:
    """The error middleware: everything becomes the one JSON shape. `engine_errors` are
    answered 503 with their (one-line) message."""

    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:
        request_id = request_id_of(request)
        try:
            return await handler(request)
        except ApiError as exc:
            return error_response(exc.status, exc.type, exc.message, request_id, exc.headers)
        except engine_errors as exc:
            return error_response(503, "service_unavailable", str(exc), request_id)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            headers = {k: v for k, v in exc.headers.items() if k in ("Allow", "Retry-After")}
            return error_response(exc.status, _TYPES.get(exc.status, "invalid_request_error"),
                                  exc.reason, request_id, headers)
        except Exception:
            log.exception("%s %s failed (request %s)", request.method, request.path,
                          request_id)
            return error_response(500, "server_error",
                                  "internal error; the server log has it under this request id",
                                  request_id)

    return middleware


def auth(api_key: str | None) -> Callable:
    """With a key, every route but /health needs `Authorization: Bearer <key>` (the scheme's
    case is free, as RFC 7235 says; the key is compared in constant time)."""

    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:
        if api_key is None or request.path == "/health":
            return await handler(request)
        scheme, _, given = request.headers.get("Authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode(errors="surrogateescape"), api_key.encode()):
            raise ApiError(401, "authentication_error",
                           "a valid 'Authorization: Bearer <api key>' header is required")
        return await handler(request)

    return middleware


def bind(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """The listening socket, bound now so that a port in use fails before anything starts;
    OSError names the address."""
    try:
        return socket.create_server((host, port), backlog=backlog)
    except OSError as error:
        raise OSError(error.errno, f"cannot listen on {host}:{port}: {error.strerror}") from None


async def serve_http(app: web.Application, sock: socket.socket,
                     read_timeout_s: float) -> web.AppRunner:
    """Serves `app` on the bound socket; returns the runner, whose `cleanup()` stops it.
    Handlers are cancelled when their client disconnects (so the core aborts the request),
    access logs are off (they cost time per request)."""
    runner = _GuardedRunner(app, read_timeout_s, access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    return runner


class _GuardedRunner(web.AppRunner):
    """An AppRunner whose request handlers answer malformed requests in the JSON shape and drop
    connections that send no complete request head within read_timeout_s."""

    def __init__(self, app: web.Application, read_timeout_s: float, **kwargs) -> None:
        super().__init__(app, **kwargs)
        self._read_timeout_s = read_timeout_s

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        try:
            _guard(server, self._read_timeout_s)
        except AttributeError as error:  # another aiohttp: serve without the guards
            log.warning("aiohttp %s: serving without the header timeout and JSON parse errors "
                        "(%s)", web.__name__, error)
        return server


def _guard(server: web.Server, read_timeout_s: float) -> None:
    """Makes `server`, the protocol factory the site listens with, make our request handlers.
    Raises AttributeError (changing nothing) where aiohttp's server lacks what they need."""
    loop, kwargs = server._loop, server._kwargs  # noqa: SLF001 - read once, checked here
    probe = _GuardedHandler(server, loop=loop, **kwargs)
    if not hasattr(probe, "_request_count"):
        raise AttributeError("the request handler has no _request_count")

    def make(self) -> web.RequestHandler:
        return _GuardedHandler(self, loop=loop, read_timeout_s=read_timeout_s, **kwargs)

    # the site calls the server (a special method: looked up on the type)
    server.__class__ = type("_GuardedServer", (type(server),), {"__call__": make})


class _GuardedHandler(web.RequestHandler):
    """aiohttp's request handler, but a connection that sends no whole request head within
    read_timeout_s is closed, and a request it cannot parse gets the JSON error shape and one
    log line."""

    def __init__(self, manager, *, read_timeout_s: float = 0.0, **kwargs) -> None:
        super().__init__(manager, **kwargs)
        self._read_timeout_s = read_timeout_s

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if self._read_timeout_s:
            self._loop.call_later(self._read_timeout_s, self._drop_if_silent, transport)

    def _drop_if_silent(self, transport) -> None:
        if self._request_count == 0 and not transport.is_closing():
            log.info("closed a connection that sent no request head in %g s",
                     self._read_timeout_s)
            transport.close()

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        log.info("malformed request from %s: %s", getattr(request, "remote", "?"),
                 type(exc).__name__ if exc else message)
        response = error_response(status, _TYPES.get(status, "invalid_request_error"),
                                  "the request could not be parsed as HTTP")
        response.force_close()
        return response
