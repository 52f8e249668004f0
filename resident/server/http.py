"""The HTTP layer under the API's routes: one error shape, request ids and the API key (the
listener's limits are connections.py's).

Every answer that is not a success is `{"error": {"message", "type", "request_id"}}` with an
HTTP status, whatever raised it: our validation (ApiError), aiohttp's own HTTP errors (404, 405,
413, ...), an engine that is gone (503), or a bug (500, whose traceback is logged once, with the
request id, and never sent). Every response carries `X-Request-Id`.
"""

from __future__ import annotations

import hmac
import logging
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


def error_type(status: int) -> str:
    """The error shape's `type` for an HTTP status."""
    return _TYPES.get(status, "invalid_request_error")


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
            return error_response(exc.status, error_type(exc.status), exc.reason, request_id,
                                  headers)
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
