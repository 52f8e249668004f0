"""The HTTP API process: OpenAI-compatible completions (streaming over SSE), health, models,
Prometheus metrics and the engine's config, in front of an `EngineClient`.

Built on aiohttp because it is already installed on the GPU host, which has no package registry
(FastAPI, uvicorn and pydantic are not, and would have to travel with the tree), and because it
gives a `StreamResponse` for SSE and cancels a handler whose client went away, which is how an
abandoned request gets aborted in the core. Request bodies are validated in validation.py
(`token_ids` is added to each choice); the engine's stats become metrics in metrics.py. A
request with `logprobs` gets each choice's `logprobs` in the OpenAI completions shape
(`completion_logprobs`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from resident.engine.types import FINISH_ERROR, EngineRequest, RequestOutput, TokenLogprobs
from resident.server.client import EngineClient, EngineUnavailable
from resident.server.metrics import EngineCollector
from resident.server.tokenizer import Tokenizer
from resident.server.validation import (
    ApiError,
    CompletionRequest,
    bad_request,
    parse_completion_request,
)

log = logging.getLogger("resident.api")

MAX_BODY_BYTES = 64 << 20  # a long prompt as a JSON list of ids is ~7 bytes a token
LOGPROB_FLOOR = -9999.0  # what -inf becomes in JSON (OpenAI's and vLLM's value)


def error_response(status: int, type: str, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": type}}, status=status)


# -- the app --------------------------------------------------------------------------------


@dataclass
class _State:
    client: EngineClient
    tokenizer: Tokenizer
    model_name: str
    api_key: str | None
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    engine_metrics: EngineCollector = field(default_factory=EngineCollector)
    http_requests: Counter = field(init=False)

    def __post_init__(self) -> None:
        self.registry.register(self.engine_metrics)
        self.http_requests = Counter("resident_http_requests", "HTTP requests answered.",
                                     ["route", "code"], registry=self.registry)


_STATE = web.AppKey("resident_state", _State)


def create_app(client: EngineClient, tokenizer: Tokenizer, model_name: str,
               api_key: str | None) -> web.Application:
    """The API's aiohttp application. With `api_key`, every route but /health needs
    `Authorization: Bearer <api_key>`."""
    app = web.Application(client_max_size=MAX_BODY_BYTES,
                          middlewares=[_count_requests, _errors, _auth])
    app[_STATE] = _State(client, tokenizer, model_name, api_key)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/debug/config", _debug_config)
    app.router.add_get("/debug/rowcheck", _debug_rowcheck)
    app.router.add_get("/debug/phases", _debug_phases)
    app.router.add_post("/debug/phases/reset", _debug_phases)
    return app


async def run_api(app: web.Application, host: str = "127.0.0.1", port: int = 8000,
                  backlog: int = 2048) -> web.AppRunner:
    """Serves `app` on host:port; returns the runner, whose `cleanup()` stops it. Handlers are
    cancelled when their client disconnects (so the core aborts the request), access logs are
    off (they cost time per request), and the backlog takes a benchmark's burst of connects."""
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, host, port, backlog=backlog).start()
    log.info("API listening on http://%s:%d", host, port)
    return runner


# -- middlewares ----------------------------------------------------------------------------


@web.middleware
async def _count_requests(request: web.Request, handler) -> web.StreamResponse:
    route = request.match_info.route.resource
    name = route.canonical if route is not None else "unmatched"
    code = 500
    try:
        response = await handler(request)
        code = response.status
        return response
    except web.HTTPException as exc:
        code = exc.status
        raise
    except asyncio.CancelledError:
        code = 499  # the client went away (nginx's code for it)
        raise
    finally:
        request.app[_STATE].http_requests.labels(name, str(code)).inc()


@web.middleware
async def _errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.type, exc.message)
    except EngineUnavailable as exc:
        # the core's traceback is in the server log; the client gets its last line
        reason = next((line for line in reversed(str(exc).splitlines()) if line.strip()), "")
        return error_response(503, "service_unavailable", f"engine unavailable: {reason}")
    except TimeoutError:
        return error_response(503, "service_unavailable", "the engine did not answer in time")
    except web.HTTPRequestEntityTooLarge:
        return error_response(413, "invalid_request_error",
                              f"the request body is over {MAX_BODY_BYTES} bytes")
    except web.HTTPException:
        raise
    except Exception as exc:
        log.exception("%s %s failed", request.method, request.path)
        return error_response(500, "server_error", f"internal error: {exc!r}")


@web.middleware
async def _auth(request: web.Request, handler) -> web.StreamResponse:
    key = request.app[_STATE].api_key
    if key is None or request.path == "/health":
        return await handler(request)
    given = request.headers.get("Authorization", "")
    if not hmac.compare_digest(given.encode(errors="surrogateescape"), f"Bearer {key}".encode()):
        raise ApiError(401, "authentication_error",
                       "a valid 'Authorization: Bearer <api key>' header is required")
    return await handler(request)


# -- handlers -------------------------------------------------------------------------------


def _ready_client(request: web.Request) -> EngineClient:
    client = request.app[_STATE].client
    if not client.is_ready:
        raise EngineUnavailable(client.fatal or "the engine is still starting")
    return client


async def _health(request: web.Request) -> web.Response:
    client = request.app[_STATE].client
    if client.fatal is not None:
        return web.json_response({"status": "failed", "error": client.fatal}, status=503)
    if not client.is_ready:
        return web.json_response({"status": "starting"}, status=503)
    return web.json_response({"status": "ok"})


async def _models(request: web.Request) -> web.Response:
    info = _ready_client(request).info
    model = {"id": request.app[_STATE].model_name, "object": "model", "owned_by": "resident",
             "max_model_len": info.get("max_model_len"), "vocab_size": info.get("vocab_size")}
    return web.json_response({"object": "list", "data": [model]})


async def _debug_config(request: web.Request) -> web.Response:
    info = _ready_client(request).info
    state = request.app[_STATE]
    return web.json_response({**info, "tokenizer": state.tokenizer.name},
                             dumps=lambda obj: json.dumps(obj, default=str))


async def _debug_rowcheck(request: web.Request) -> web.Response:
    """Row-check counts since start: steps, rows, mismatches, displaced, slot releases,
    offloads (all zero while row_check is off, except the planner's own counters)."""
    stats = await _ready_client(request).stats()
    return web.json_response(stats.get("rowcheck", {}))


async def _debug_phases(request: web.Request) -> web.Response:
    """GET: phase timing since the last reset, {"enabled", "kinds": {kind: {key: ms per
    step}}} (engine/phases.py). POST .../reset: the same, then the sums start over."""
    section = "phases_reset" if request.method == "POST" else "phases"
    return web.json_response(await _ready_client(request).stats(section=section))


async def _metrics(request: web.Request) -> web.Response:
    state = request.app[_STATE]
    stats = await _ready_client(request).stats()
    # No await between setting the stats and collecting them, so scrapes cannot interleave.
    state.engine_metrics.stats = stats
    body = generate_latest(state.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _read_json(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None


async def _completions(request: web.Request) -> web.StreamResponse:
    state = request.app[_STATE]
    info = _ready_client(request).info
    body = await _read_json(request)
    parsed = parse_completion_request(body, state.tokenizer, state.model_name,
                                      info["vocab_size"], info["max_model_len"])
    completion = _Completion(state, parsed)
    if parsed.stream:
        return await completion.stream(request)
    return await completion.respond()


class _Completion:
    """One completion request: its ids, the core's outputs, and the JSON it becomes."""

    def __init__(self, state: _State, parsed: CompletionRequest) -> None:
        self.state = state
        self.parsed = parsed
        self.request = EngineRequest(f"cmpl-{uuid.uuid4().hex}", parsed.prompt_ids,
                                     parsed.params)
        self.created = int(time.time())
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprobs] = []
        self.text_length = 0  # characters of text the stream has sent

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.request.request_id, "object": "text_completion",
                "created": self.created, "model": self.state.model_name, "choices": choices}

    def _usage(self) -> dict[str, int]:
        prompt = len(self.parsed.prompt_ids)
        return {"prompt_tokens": prompt, "completion_tokens": len(self.token_ids),
                "total_tokens": prompt + len(self.token_ids)}

    async def respond(self) -> web.Response:
        final: RequestOutput | None = None
        async with aclosing(self.state.client.generate(self.request)) as outputs:
            async for output in outputs:
                self.token_ids.extend(output.new_token_ids)
                self.logprobs.extend(output.logprobs or ())
                final = output
        assert final is not None and final.finished
        if final.finish_reason == FINISH_ERROR:
            raise _finish_error(final)
        choice = {"index": 0, "text": self.state.tokenizer.decode(self.token_ids),
                  "token_ids": self.token_ids, "finish_reason": final.finish_reason,
                  "logprobs": self._logprobs(self.token_ids, self.logprobs, 0)}
        return web.json_response({**self._envelope([choice]), "usage": self._usage()})

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """SSE: one event per generated token, written as soon as its output arrives. Headers
        wait for the first output, so a request that fails at once gets a real HTTP error."""
        async with aclosing(self.state.client.generate(self.request)) as outputs:
            first = await anext(outputs)
            if first.finish_reason == FINISH_ERROR and not first.new_token_ids:
                raise _finish_error(first)
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                                   "Cache-Control": "no-cache"})
            try:
                await response.prepare(request)
                await response.write(self._events(first))
                async for output in outputs:
                    await response.write(self._events(output))
                if self.parsed.include_usage:
                    await response.write(_sse(self._envelope([]) | {"usage": self._usage()}))
                await response.write(b"data: [DONE]\n\n")
            except ConnectionResetError:
                # The client went away; leaving the loop closes the generator, which aborts.
                log.debug("client left during %s", self.request.request_id)
        return response

    def _events(self, output: RequestOutput) -> bytes:
        """The SSE events for one output: one per new token, or one empty closing event."""
        events = []
        logprobs = output.logprobs or ()
        for i, token in enumerate(output.new_token_ids):
            last = output.finished and i == len(output.new_token_ids) - 1
            events.append(self._token_event([token], logprobs[i:i + 1], last, output))
        if output.finished and not output.new_token_ids:
            events.append(self._token_event([], (), True, output))
        return b"".join(events)

    def _token_event(self, tokens: list[int], logprobs: tuple[TokenLogprobs, ...], last: bool,
                     output: RequestOutput) -> bytes:
        """Records `tokens` (one, or none for a closing event) and returns their SSE event."""
        previous = len(self.token_ids)
        self.token_ids.extend(tokens)
        text = self.state.tokenizer.decode_delta(self.token_ids, previous, final=last)
        # vLLM's rule: a streamed token's text offset is the length of the text sent before it
        choice = {"index": 0, "text": text, "token_ids": tokens,
                  "finish_reason": output.finish_reason if last else None,
                  "logprobs": self._logprobs(tokens, logprobs, self.text_length)}
        self.text_length += len(text)
        event = self._envelope([choice])
        if last and output.error is not None:
            event["error"] = {"message": output.error, "type": "server_error"}
        return _sse(event)


    def _logprobs(self, tokens: list[int], logprobs: Sequence[TokenLogprobs],
                  first_offset: int) -> dict[str, list] | None:
        """The choice's `logprobs` for these tokens, or None when the request asked for none."""
        if self.parsed.params.logprobs is None:
            return None
        return completion_logprobs(tokens, logprobs, self.state.tokenizer, first_offset,
                                   self.parsed.return_tokens_as_token_ids)


def completion_logprobs(tokens: list[int], logprobs: Sequence[TokenLogprobs],
                        tokenizer: Tokenizer, first_offset: int,
                        tokens_as_ids: bool) -> dict[str, list]:
    """OpenAI completions `logprobs` of generated tokens: `tokens` (their text, or
    `token_id:<id>`), `token_logprobs`, `top_logprobs` (a mapping a token: the sampled token
    first, then the top k, as vLLM gives up to k + 1 entries) and `text_offset` (each token's
    offset in the completion's text, the first at `first_offset`)."""
    def name(token: int) -> str:
        return f"token_id:{token}" if tokens_as_ids else tokenizer.decode([token])

    body: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                             "text_offset": []}
    offset = first_offset
    for token, entry in zip(tokens, logprobs, strict=True):
        logprob = max(entry.logprob, LOGPROB_FLOOR)
        top = {name(token): logprob}
        for other, other_logprob in entry.top:
            top.setdefault(name(other), max(other_logprob, LOGPROB_FLOOR))
        body["tokens"].append(name(token))
        body["token_logprobs"].append(logprob)
        body["top_logprobs"].append(top)
        body["text_offset"].append(offset)
        offset += len(tokenizer.decode([token]))
    return body


def _sse(event: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def _finish_error(output: RequestOutput) -> ApiError:
    message = output.error or "the request failed in the engine"
    if output.rejected:
        return ApiError(400, "invalid_request_error", message)
    return ApiError(500, "server_error", message)
