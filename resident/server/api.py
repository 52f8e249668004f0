"""The HTTP API process: OpenAI-compatible completions (streaming over SSE), health, models,
Prometheus metrics and the engine's config, in front of an `EngineClient`.

Built on aiohttp because it is already installed on the GPU host, which has no package registry
(FastAPI, uvicorn and pydantic are not, and would have to travel with the tree), and because it
gives a `StreamResponse` for SSE and cancels a handler whose client went away, which is how an
abandoned request gets aborted in the core.

Departures from OpenAI: `temperature` defaults to 0 (greedy), not 1; a null optional field
means its default; `token_ids` is added to each choice; fields we cannot honour (`logprobs`,
`echo`, `n`, `stop` strings, penalties, ...) are rejected unless they hold their neutral value.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    UnknownMetricFamily,
)

from resident.server.client import EngineClient, EngineUnavailable
from resident.server.protocol import (
    FINISH_ERROR,
    AddRequest,
    RequestOutput,
    SamplingParams,
)
from resident.server.tokenizer import Tokenizer

log = logging.getLogger("resident.api")

MAX_BODY_BYTES = 64 << 20  # a long prompt as a JSON list of ids is ~7 bytes a token
DEFAULT_MAX_TOKENS = 16
class ApiError(Exception):
    """An error answered as `{"error": {"message", "type"}}` with an HTTP status."""

    def __init__(self, status: int, type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.message = message


def _bad(message: str) -> ApiError:
    return ApiError(400, "invalid_request_error", message)


def error_response(status: int, type: str, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": type}}, status=status)


# -- request validation ---------------------------------------------------------------------


class CompletionRequest(NamedTuple):
    """A validated completion request."""

    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool


# Fields OpenAI clients send that we cannot honour: accepted only with one of these values.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "logprobs": (None,),
    "echo": (None, False),
    "n": (None, 1),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "stop": (None, "", []),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1),
}


def _show(value: Any) -> str:
    text = json.dumps(value) if _is_json(value) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_float(value: Any) -> float | None:
    """`value` as a finite float, or None if it is not a finite number (bools are not)."""
    if not (_is_int(value) or isinstance(value, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _check_neutral(body: dict[str, Any]) -> None:
    for name, accepted in _NEUTRAL.items():
        value = body.get(name)
        if not any(_same(value, ok) for ok in accepted):
            allowed = " or ".join(json.dumps(ok) for ok in accepted)
            raise _bad(f"'{name}' = {_show(value)} is not supported (only {allowed})")


def _same(value: Any, neutral: Any) -> bool:
    # True == 1 and False == 0 in Python; a bool must match only a bool.
    return isinstance(value, bool) == isinstance(neutral, bool) and value == neutral


def _field(body: dict[str, Any], name: str, default: Any, convert, expected: str) -> Any:
    """The field's value through `convert` (None when it does not fit), or its default when the
    field is absent or null."""
    value = body.get(name)
    if value is None:
        return default
    converted = convert(value)
    if converted is None:
        raise _bad(f"'{name}' must be {expected}, got {_show(value)}")
    return converted


def _int_field(body: dict[str, Any], name: str, default: int) -> int:
    return _field(body, name, default, lambda v: v if _is_int(v) else None, "an integer")


def _number_field(body: dict[str, Any], name: str, default: float) -> float:
    return _field(body, name, default, _as_float, "a finite number")


def _bool_field(body: dict[str, Any], name: str, default: bool) -> bool:
    return _field(body, name, default, lambda v: v if isinstance(v, bool) else None,
                  "true or false")


def _token_ids(value: list[Any], name: str, vocab_size: int) -> list[int]:
    for i, token in enumerate(value):
        if not _is_int(token):
            raise _bad(f"'{name}[{i}]' must be an integer token id, got {_show(token)}")
        if not 0 <= token < vocab_size:
            raise _bad(f"'{name}[{i}]' = {token} is outside the vocabulary [0, {vocab_size})")
    return value


def _prompt(body: dict[str, Any], tokenizer: Tokenizer, vocab_size: int) -> list[int]:
    prompt = body.get("prompt")
    if prompt is None:
        raise _bad("'prompt' is required")
    if isinstance(prompt, str):
        if not prompt:
            raise _bad("'prompt' must not be empty")
        ids = tokenizer.encode(prompt)
        if not ids:
            raise _bad(f"'prompt' = {_show(prompt)} encodes to no tokens")
        outside = [t for t in ids if not 0 <= t < vocab_size]
        if outside:
            raise _bad(f"'prompt' encodes to token {outside[0]}, outside [0, {vocab_size})")
        return ids
    if not isinstance(prompt, list):
        raise _bad(f"'prompt' must be a string or a list of token ids, got {_show(prompt)}")
    if not prompt:
        raise _bad("'prompt' must not be empty")
    return _token_ids(prompt, "prompt", vocab_size)


def _sampling(body: dict[str, Any], vocab_size: int) -> SamplingParams:
    temperature = _number_field(body, "temperature", 0.0)
    if temperature < 0:
        raise _bad(f"'temperature' must be >= 0, got {_show(body['temperature'])}")
    top_p = _number_field(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise _bad(f"'top_p' must be in (0, 1], got {_show(body['top_p'])}")
    top_k = _int_field(body, "top_k", 0)
    if top_k < -1:
        raise _bad(f"'top_k' must be >= 0 (or -1 for off), got {top_k}")
    seed = body.get("seed")
    if seed is not None and not (_is_int(seed) and -(2**63) <= seed < 2**64):
        raise _bad(f"'seed' must be null or a 64-bit integer, got {_show(seed)}")
    stop_ids = body.get("stop_token_ids")
    if stop_ids is not None and not isinstance(stop_ids, list):
        raise _bad(f"'stop_token_ids' must be a list of token ids, got {_show(stop_ids)}")
    return SamplingParams(
        max_tokens=_int_field(body, "max_tokens", DEFAULT_MAX_TOKENS),
        temperature=temperature,
        top_p=top_p,
        # -1 is off as in vLLM; k >= vocab_size keeps every token, which is off too.
        top_k=0 if top_k == -1 or top_k >= vocab_size else top_k,
        seed=seed,
        ignore_eos=_bool_field(body, "ignore_eos", False),
        stop_token_ids=tuple(_token_ids(stop_ids or [], "stop_token_ids", vocab_size)),
    )


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise _bad(f"'stream_options' must be an object, got {_show(options)}")
    return _bool_field(options, "include_usage", False)


def parse_completion_request(
    body: Any, tokenizer: Tokenizer, model_name: str, vocab_size: int, max_model_len: int
) -> CompletionRequest:
    """Validates a /v1/completions body; unpacks as (prompt_ids, params, stream, include_usage).

    Raises ApiError: 404 for another model's name, 400 naming the field for anything else.
    Unknown fields are ignored; null means a field's default."""
    if not isinstance(body, dict):
        raise _bad(f"the request body must be a JSON object, got {_show(body)}")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad(f"'model' must be a string, got {_show(model)}")
    if model is not None and model != model_name:
        raise ApiError(404, "not_found_error", f"model {model!r} is not served here "
                       f"(this server serves {model_name!r})")
    _check_neutral(body)
    prompt_ids = _prompt(body, tokenizer, vocab_size)
    params = _sampling(body, vocab_size)
    if params.max_tokens <= 0:
        raise _bad(f"'max_tokens' must be > 0, got {params.max_tokens}")
    total = len(prompt_ids) + params.max_tokens
    if total > max_model_len:
        raise _bad(f"the prompt's {len(prompt_ids)} tokens plus 'max_tokens' = "
                   f"{params.max_tokens} make {total}, over max_model_len {max_model_len}")
    return CompletionRequest(prompt_ids, params, _bool_field(body, "stream", False),
                             _include_usage(body))


# -- metrics --------------------------------------------------------------------------------

# stats key -> (metric name, kind, help). Counters get `_total` in the exposition.
_ENGINE_METRICS: dict[str, tuple[str, str, str]] = {
    "num_running": ("resident_requests_running", "gauge", "Requests being generated."),
    "num_waiting": ("resident_requests_waiting", "gauge", "Requests waiting to start."),
    "num_offloaded": ("resident_requests_offloaded", "gauge", "Requests offloaded to host."),
    "kv_pages_used": ("resident_kv_pages_used", "gauge", "KV cache pages in use."),
    "kv_pages_free": ("resident_kv_pages_free", "gauge", "KV cache pages free."),
    "gdn_slots_used": ("resident_gdn_slots_used", "gauge", "GDN state slots in use."),
    "gdn_slots_free": ("resident_gdn_slots_free", "gauge", "GDN state slots free."),
    "steps": ("resident_steps", "counter", "Engine steps by kind."),
    "step_seconds": ("resident_step_seconds", "counter",
                     "Wall seconds of engine steps by kind, schedule to sampled tokens."),
    "prefills_padded": ("resident_prefills_padded", "counter",
                        "Prefill steps of one fresh row run padded to a prefill bucket."),
    "generated_tokens": ("resident_generated_tokens", "counter", "Tokens generated."),
    "offloads": ("resident_offloads", "counter", "Requests offloaded."),
    "reloads": ("resident_reloads", "counter", "Requests reloaded."),
    "aborts": ("resident_aborts", "counter", "Requests aborted."),
    "failed_requests": ("resident_failed_requests", "counter", "Requests that failed."),
    "rows_after_finish": ("resident_rows_after_finish", "counter",
                          "Rows a step planned ahead ran for a request that finished or was "
                          "aborted meanwhile (released after that step)."),
}
_METRIC_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_FAMILIES = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily,
             "unknown": UnknownMetricFamily}


def _stat_metric(key: str, value: Any) -> Metric | None:
    """One stat as a metric family; a dict becomes one sample per key, labelled `kind`.
    Stats without an entry in _ENGINE_METRICS are exposed untyped as `resident_<key>`."""
    name, kind, doc = _ENGINE_METRICS.get(key, (f"resident_{key}", "unknown", f"Engine {key}."))
    if not _METRIC_NAME.fullmatch(name):
        return None
    if isinstance(value, dict):
        family = _FAMILIES[kind](name, doc, labels=["kind"])
        for label, sample in value.items():
            if _as_float(sample) is not None:
                family.add_metric([str(label)], sample)
        return family
    if _as_float(value) is None:
        return None
    return _FAMILIES[kind](name, doc, value=value)


class _EngineCollector:
    """Exposes the engine stats that the scrape handler fetched just before collecting."""

    def __init__(self) -> None:
        self.stats: dict[str, Any] = {}

    def collect(self) -> Iterator[Metric]:
        for key, value in self.stats.items():
            metric = _stat_metric(key, value)
            if metric is not None:
                yield metric


# -- the app --------------------------------------------------------------------------------


@dataclass
class _State:
    client: EngineClient
    tokenizer: Tokenizer
    model_name: str
    api_key: str | None
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    engine_metrics: _EngineCollector = field(default_factory=_EngineCollector)
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
        raise _bad(f"the request body is not valid JSON: {exc}") from None


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
        self.request = AddRequest(f"cmpl-{uuid.uuid4().hex}", parsed.prompt_ids, parsed.params)
        self.created = int(time.time())
        self.token_ids: list[int] = []

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
                final = output
        assert final is not None and final.finished
        if final.finish_reason == FINISH_ERROR:
            raise _finish_error(final)
        choice = {"index": 0, "text": self.state.tokenizer.decode(self.token_ids),
                  "token_ids": self.token_ids, "finish_reason": final.finish_reason,
                  "logprobs": None}
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
        for i, token in enumerate(output.new_token_ids):
            last = output.finished and i == len(output.new_token_ids) - 1
            events.append(self._token_event([token], last, output))
        if output.finished and not output.new_token_ids:
            events.append(self._token_event([], True, output))
        return b"".join(events)

    def _token_event(self, tokens: list[int], last: bool, output: RequestOutput) -> bytes:
        """Records `tokens` (one, or none for a closing event) and returns their SSE event."""
        previous = len(self.token_ids)
        self.token_ids.extend(tokens)
        text = self.state.tokenizer.decode_delta(self.token_ids, previous, final=last)
        choice = {"index": 0, "text": text, "token_ids": tokens,
                  "finish_reason": output.finish_reason if last else None, "logprobs": None}
        event = self._envelope([choice])
        if last and output.error is not None:
            event["error"] = {"message": output.error, "type": "server_error"}
        return _sse(event)


def _sse(event: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def _finish_error(output: RequestOutput) -> ApiError:
    message = output.error or "the request failed in the engine"
    if output.rejected:
        return ApiError(400, "invalid_request_error", message)
    return ApiError(500, "server_error", message)
