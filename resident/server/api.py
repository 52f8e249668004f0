"""The HTTP API process: OpenAI-compatible completions (streaming over SSE), health, models and
Prometheus metrics in front of an `EngineClient`; the /debug routes are debug.py's and the
handlers' shared state state.py's.

Built on aiohttp because it is already installed on the GPU host, which has no package registry
(FastAPI, uvicorn and pydantic are not, and would have to travel with the tree), and because it
gives a `StreamResponse` for SSE and cancels a handler whose client went away, which is how an
abandoned request gets aborted in the core. Request bodies are validated in validation.py
(`token_ids` is added to each choice); the engine's stats become metrics in metrics.py; the error
shape, request ids, the API key and the listener's limits are http.py's. A request with
`logprobs` gets each choice's `logprobs` in the OpenAI completions shape (`completion_logprobs`).

Limits (knobs, docs/engine.md "Limits and failures"): a completion is refused with 429 and
Retry-After past max_num_seqs + max_waiting in flight, and with 503 once the server drains; a body
over max_body_mib is refused before it is read (413), one that does not arrive within read_timeout_s
gets 408, and a large one is parsed and tokenized off the event loop; a completion that runs past
request_timeout_s is aborted (504, or an error event on a stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Sequence
from contextlib import aclosing
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from resident.config import EngineConfig
from resident.engine.types import FINISH_ABORT, EngineRequest, RequestOutput, TokenLogprobs
from resident.server.client import EngineClient, EngineUnavailable
from resident.server.debug import add_debug_routes
from resident.server.http import auth, errors, request_ids
from resident.server.state import STATE, ApiState, ready_client
from resident.server.tokenizer import Tokenizer
from resident.server.validation import (
    ApiError,
    CompletionRequest,
    bad_request,
    parse_completion_request,
)

log = logging.getLogger("resident.api")

BIG_BODY_BYTES = 256 << 10  # parsed and checked off the event loop from this size
SHUTTING_DOWN = "the server is shutting down"
LOGPROB_FLOOR = -9999.0  # what -inf becomes in JSON (OpenAI's and vLLM's value)


# -- the app --------------------------------------------------------------------------------


def create_app(client: EngineClient, tokenizer: Tokenizer, model_name: str,
               api_key: str | None, limits: EngineConfig) -> web.Application:
    """The API's aiohttp application. With `api_key`, every route but /health needs
    `Authorization: Bearer <api_key>`; `limits` are the resolved knobs."""
    state = ApiState(client, tokenizer, model_name, limits)
    app = web.Application(client_max_size=state.max_body_bytes, middlewares=[
        request_ids, _count_requests, errors((EngineUnavailable,)), auth(api_key)])
    app[STATE] = state
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/metrics", _metrics)
    add_debug_routes(app)
    return app


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
        request.app[STATE].http_requests.labels(name, str(code)).inc()


# -- handlers -------------------------------------------------------------------------------


async def _health(request: web.Request) -> web.Response:
    """200 {"status": "ok"} while serving; 503 with "starting", "draining" (SIGTERM) or
    "failed" (the engine core is dead or stuck: the server is about to exit)."""
    state = request.app[STATE]
    if state.client.fatal is not None:
        return web.json_response({"status": "failed", "error": state.client.fatal}, status=503)
    if not state.client.is_ready:
        return web.json_response({"status": "starting"}, status=503)
    if state.draining:
        return web.json_response({"status": "draining"}, status=503)
    return web.json_response({"status": "ok"})


async def _models(request: web.Request) -> web.Response:
    info = ready_client(request).info
    model = {"id": request.app[STATE].model_name, "object": "model", "owned_by": "resident",
             "max_model_len": info.get("max_model_len"), "vocab_size": info.get("vocab_size")}
    return web.json_response({"object": "list", "data": [model]})


async def _metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    stats = await ready_client(request).stats()
    # No await between setting the stats and collecting them, so scrapes cannot interleave.
    state.engine_metrics.stats = stats
    body = generate_latest(state.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _read_body(request: web.Request, state: ApiState) -> bytes:
    """The body, refused before it is read when it declares more than the cap (413), and
    within read_timeout_s (408: a body that never comes does not hold the handler)."""
    declared = request.content_length
    if declared is not None and declared > state.max_body_bytes:
        raise ApiError(413, "invalid_request_error", f"the request body declares {declared} "
                       f"bytes, over the {state.max_body_bytes} this server takes "
                       f"(max_body_mib)")
    try:
        async with asyncio.timeout(state.limits.read_timeout_s):
            return await request.read()
    except TimeoutError:
        raise ApiError(408, "timeout_error", f"the request body did not arrive within "
                       f"read_timeout_s = {state.limits.read_timeout_s:g} s") from None


def _parse(raw: bytes, state: ApiState, info: dict[str, Any]) -> CompletionRequest:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    return parse_completion_request(body, state.tokenizer, state.model_name,
                                    info["vocab_size"], info["max_model_len"])


def _admit(state: ApiState) -> None:
    """Back-pressure: no new completion while draining (503) or past max_in_flight (429)."""
    if state.draining:
        raise ApiError(503, "service_unavailable", SHUTTING_DOWN)
    if state.in_flight >= state.max_in_flight:
        raise ApiError(429, "rate_limit_error", f"{state.in_flight} requests are in flight, "
                       f"the most this server holds (max_num_seqs + max_waiting); retry later",
                       headers={"Retry-After": "1"})


async def _completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    info = ready_client(request).info
    _admit(state)
    state.in_flight += 1
    try:
        raw = await _read_body(request, state)
        if len(raw) >= BIG_BODY_BYTES:  # parsing and tokenizing it would stall other clients
            parsed = await asyncio.get_running_loop().run_in_executor(
                None, _parse, raw, state, info)
        else:
            parsed = _parse(raw, state, info)
        completion = _Completion(state, parsed)
        timeout = state.limits.request_timeout_s or None
        if parsed.stream:
            return await completion.stream(request, timeout)
        try:
            async with asyncio.timeout(timeout):
                return await completion.respond()
        except TimeoutError:
            raise ApiError(504, "timeout_error", f"the completion took longer than "
                           f"request_timeout_s = {timeout:g} s; it was aborted") from None
    finally:
        state.in_flight -= 1


class _Completion:
    """One completion request: its ids, the core's outputs, and the JSON it becomes."""

    def __init__(self, state: ApiState, parsed: CompletionRequest) -> None:
        self.state = state
        self.parsed = parsed
        self.request = EngineRequest(f"cmpl-{uuid.uuid4().hex}", parsed.prompt_ids,
                                     parsed.params)
        self.created = int(time.time())
        self.token_ids: list[int] = []
        self.num_cached_tokens = 0  # prompt tokens the prefix cache restored
        self.logprobs: list[TokenLogprobs] = []
        self.text_length = 0  # characters of text the stream has sent

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.request.request_id, "object": "text_completion",
                "created": self.created, "model": self.state.model_name, "choices": choices}

    def _usage(self) -> dict[str, int]:
        prompt = len(self.parsed.prompt_ids)
        return {"prompt_tokens": prompt, "completion_tokens": len(self.token_ids),
                "total_tokens": prompt + len(self.token_ids),
                "prompt_tokens_details": {"cached_tokens": self.num_cached_tokens}}

    async def respond(self) -> web.Response:
        final: RequestOutput | None = None
        async with aclosing(self.state.client.generate(self.request)) as batches:
            async for outputs in batches:
                for output in outputs:
                    self.token_ids.extend(output.new_token_ids)
                    self.num_cached_tokens = max(self.num_cached_tokens,
                                                 output.num_cached_tokens)
                    self.logprobs.extend(output.logprobs or ())
                final = outputs[-1]
        assert final is not None and final.finished
        if final.error is not None:
            raise _finish_error(final)
        choice = {"index": 0, "text": self.state.tokenizer.decode(self.token_ids),
                  "token_ids": self.token_ids, "finish_reason": final.finish_reason,
                  "logprobs": self._logprobs(self.token_ids, self.logprobs, 0)}
        return web.json_response({**self._envelope([choice]), "usage": self._usage()})

    async def stream(self, request: web.Request, timeout: float | None) -> web.StreamResponse:
        """SSE: one event per generated token, written as soon as its output arrives. Headers
        wait for the first output, so a request that fails at once gets a real HTTP error.
        Past `timeout` seconds the request is aborted: an error event, then [DONE]."""
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        async with aclosing(self.state.client.generate(self.request)) as batches:
            first = await anext(batches)
            if first[0].error is not None and not first[0].new_token_ids:
                raise _finish_error(first[0])
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                                   "Cache-Control": "no-cache"})
            try:
                await response.prepare(request)
                await response.write(self._events(first))
                await self._stream_rest(response, batches, deadline)
                if self.parsed.include_usage:
                    await response.write(_sse(self._envelope([]) | {"usage": self._usage()}))
                await response.write(b"data: [DONE]\n\n")
            except ConnectionResetError:
                # The client went away; leaving the loop closes the generator, which aborts.
                log.debug("client left during %s", self.request.request_id)
            except Exception:  # noqa: BLE001 - a bug after the headers went out: the client
                # gets an error event and [DONE] (not a hang), the log the traceback
                log.exception("streaming %s failed", self.request.request_id)
                with contextlib.suppress(ConnectionResetError):
                    await response.write(_sse({"error": {"message": "internal error while "
                                                         "streaming; see the server log",
                                                         "type": "server_error"}})
                                         + b"data: [DONE]\n\n")
        return response

    async def _stream_rest(self, response: web.StreamResponse, batches,
                           deadline: float | None) -> None:
        try:
            async with asyncio.timeout_at(deadline):
                async for outputs in batches:
                    await response.write(self._events(outputs))
        except TimeoutError:
            message = (f"the completion took longer than request_timeout_s; it was aborted "
                       f"after {len(self.token_ids)} tokens")
            await response.write(self._token_event([], (), True, RequestOutput(
                self.request.request_id, [], True, FINISH_ABORT, message)))

    def _events(self, outputs: list[RequestOutput]) -> bytes:
        """The SSE events for some outputs, one write: an event per new token, or one empty
        closing event."""
        events = []
        for output in outputs:
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
        self.num_cached_tokens = max(self.num_cached_tokens, output.num_cached_tokens)
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
    """A request the engine refused (400), that failed in its step (500), or that ended because
    the engine or the server went away (503)."""
    message = output.error or "the request failed in the engine"
    if output.rejected:
        return ApiError(400, "invalid_request_error", message)
    if output.finish_reason == FINISH_ABORT or message.startswith("engine unavailable"):
        return ApiError(503, "service_unavailable", message)
    return ApiError(500, "server_error", message)
