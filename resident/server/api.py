"""The HTTP API process: OpenAI-compatible completions and chat completions (streaming over SSE),
health, models and Prometheus metrics in front of an `EngineClient`; the /debug routes are
debug.py's and the handlers' shared state state.py's.

Built on aiohttp because it is already installed on the GPU host, which has no package registry
(FastAPI, uvicorn and pydantic are not, and would have to travel with the tree), and because it
gives a `StreamResponse` for SSE and cancels a handler whose client went away, which is how an
abandoned request gets aborted in the core. Request bodies are validated in validation.py (chat
bodies in chat.py, their messages rendered by chat_template.py); a request's `n` choices are
each their own engine request, whose outputs become text pieces (choices.py, which applies stop
strings) and then the endpoint's OpenAI shapes (responses.py). The engine's stats become metrics
in metrics.py; the error shape, request ids, the API key and the listener's limits are http.py's.

Limits (knobs, docs/engine.md "Limits and failures"): a completion is refused with 429 and
Retry-After past max_num_seqs + max_waiting engine requests in flight (a choice is one), and with
503 once the server drains; a body over max_body_mib is refused before it is read (413), one that
does not arrive within read_timeout_s gets 408, and a large one is parsed and tokenized off the
event loop; a completion that runs past request_timeout_s is aborted (504, or an error event on a
stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from resident.config import EngineConfig
from resident.engine.types import (
    FINISH_ABORT,
    EngineRequest,
    RequestOutput,
    SamplingParams,
    is_plain,
)
from resident.server.chat import parse_chat_request
from resident.server.chat_template import ChatTemplate, load_chat_template
from resident.server.choices import Choice
from resident.server.client import EngineClient, EngineUnavailable
from resident.server.debug import add_debug_routes
from resident.server.http import auth, errors, request_ids
from resident.server.jsonenc import FAST_LOADS, dumps, loads
from resident.server.pushed import PushedStream
from resident.server.responses import ChatFormat, TextFormat
from resident.server.state import STATE, ApiState, ready_client
from resident.server.token_event import TokenEvent
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


# -- the app --------------------------------------------------------------------------------


def create_app(client: EngineClient, tokenizer: Tokenizer, model_name: str,
               api_key: str | None, limits: EngineConfig,
               chat_template: ChatTemplate | None = None) -> web.Application:
    """The API's aiohttp application. With `api_key`, every route but /health needs
    `Authorization: Bearer <api_key>`; `limits` are the resolved knobs; `chat_template`
    renders chat messages (default: the ChatML fallback)."""
    state = ApiState(client, tokenizer, model_name, limits,
                     chat_template or load_chat_template(None))
    app = web.Application(client_max_size=state.max_body_bytes, middlewares=[
        request_ids, _count_requests, errors((EngineUnavailable,)), auth(api_key)])
    app[STATE] = state
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat_completions)
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
    """200 {"status": "ok"} while serving; 503 with "starting", "draining" (SIGTERM),
    "stalled" (the engine core has been silent for health_stall_s: it may recover) or "failed"
    (the engine core is dead or stuck: the server is about to exit)."""
    state = request.app[STATE]
    if state.client.fatal is not None:
        return web.json_response({"status": "failed", "error": state.client.fatal}, status=503)
    if not state.client.is_ready:
        return web.json_response({"status": "starting"}, status=503)
    if state.draining:
        return web.json_response({"status": "draining"}, status=503)
    silent_s = state.client.silent_s
    if silent_s > min(state.limits.health_stall_s, state.limits.core_stall_s):
        return web.json_response({"status": "stalled", "silent_s": round(silent_s, 1)},
                                 status=503)
    return web.json_response({"status": "ok"})


async def _models(request: web.Request) -> web.Response:
    info = ready_client(request).info
    state = request.app[STATE]
    model = {"id": state.model_name, "object": "model", "created": state.started,
             "owned_by": "resident",
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


def _parse(raw: bytes, state: ApiState, info: dict[str, Any], chat: bool) -> CompletionRequest:
    """The request a body asks for: read by the fast parser (jsonenc.loads) and validated; a
    body it refuses, or whose reading fails validation, is read again by the stdlib's json,
    whose reading decides (what it refuses is a 400). orjson reads an integer past 64 bits as a
    float, the one way the two differ on what both read, so an answer is always the one the
    stdlib's reading gives."""
    if FAST_LOADS:
        with contextlib.suppress(ValueError, RecursionError, ApiError):
            return _validated(loads(raw), state, info, chat)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    return _validated(body, state, info, chat)


def _validated(body: Any, state: ApiState, info: dict[str, Any], chat: bool
               ) -> CompletionRequest:
    if chat:
        return parse_chat_request(body, state.tokenizer, state.chat_template, state.model_name,
                                  info["vocab_size"], info["max_model_len"])
    return parse_completion_request(body, state.tokenizer, state.model_name,
                                    info["vocab_size"], info["max_model_len"])


def _admit(state: ApiState) -> None:
    """Back-pressure: no new completion while draining (503) or past max_in_flight (429)."""
    if state.draining:
        raise ApiError(503, "service_unavailable", SHUTTING_DOWN)
    _check_room(state, 1)


def _check_room(state: ApiState, num_requests: int) -> None:
    """429 unless `num_requests` more engine requests fit under max_in_flight."""
    if state.in_flight + num_requests > state.max_in_flight:
        raise ApiError(429, "rate_limit_error", f"{state.in_flight} requests are in flight, "
                       f"the most this server holds (max_num_seqs + max_waiting); retry later",
                       headers={"Retry-After": "1"})


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _answer(request, chat=False)


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    return await _answer(request, chat=True)


async def _answer(request: web.Request, chat: bool) -> web.StreamResponse:
    """Both endpoints: admit, read and parse the body, run its choices, answer (JSON or SSE).
    `in_flight` counts engine requests: one while the body is read, then one a choice."""
    received_s = time.monotonic()  # the request's arrival for the core's latency histograms
    state = request.app[STATE]
    info = ready_client(request).info
    _admit(state)
    state.in_flight += 1
    held = 1
    try:
        raw = await _read_body(request, state)
        if len(raw) >= BIG_BODY_BYTES:  # parsing and tokenizing it would stall other clients
            parsed = await asyncio.get_running_loop().run_in_executor(
                None, _parse, raw, state, info, chat)
        else:
            parsed = _parse(raw, state, info, chat)
        _check_room(state, parsed.n - 1)  # the choices past the first, each a request
        state.in_flight += parsed.n - 1
        held = parsed.n
        completion = _Completion(state, parsed, chat, received_s)
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
        state.in_flight -= held


class _Completion:
    """One completion request: its choices (each its own engine request), the core's outputs,
    and the JSON or SSE events they become (in `format`'s shape: responses.py)."""

    def __init__(self, state: ApiState, parsed: CompletionRequest, chat: bool,
                 received_s: float) -> None:
        self.state = state
        self.parsed = parsed
        shape = ChatFormat if chat else TextFormat
        self.format = shape(state.tokenizer, parsed.params.logprobs is not None,
                            parsed.return_tokens_as_token_ids)
        self.id = f"{self.format.id_prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.choices = [
            Choice(i, EngineRequest(self.id if parsed.n == 1 else f"{self.id}-{i}",
                                    parsed.prompt_ids, _choice_params(parsed.params, i),
                                    received_s, parsed.cache_salt),
                   state.tokenizer, parsed.stop, incremental=parsed.stream)
            for i in range(parsed.n)]
        # every stream event is this envelope around one chunk: its bytes made once
        self._event_head = b"data: " + dumps(self._envelope([], True))[:-len(b"]}")]
        # a single choice's plain tokens' events, from a template (token_event.py)
        self._token_event = TokenEvent.of(self.format.chunks, self._event, 0) \
            if parsed.stream and parsed.n == 1 and parsed.params.logprobs is None else None

    def _envelope(self, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
        return {"id": self.id, "object": self.format.chunk_object if chunk else self.format.object,
                "created": self.created, "model": self.state.model_name, "choices": choices}

    def _usage(self) -> dict[str, Any]:
        prompt = len(self.parsed.prompt_ids)
        completion = sum(len(choice.token_ids) for choice in self.choices)
        cached = max(choice.num_cached_tokens for choice in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    async def _outputs(self) -> AsyncIterator[tuple[Choice, list[RequestOutput]]]:
        """Each choice's outputs as they arrive (a choice and the outputs that came since it was
        last read) until every choice is done. A choice the consumer marked done (a stop
        string) stops being read, which aborts its engine request; so does leaving early."""
        if len(self.choices) == 1:  # the common case: no task, no second queue
            choice = self.choices[0]
            async with aclosing(self.state.client.generate(choice.request)) as batches:
                async for outputs in batches:
                    yield choice, outputs
                    if choice.done:
                        return
            return
        arrived: asyncio.Queue[tuple[Choice, list[RequestOutput] | Exception]] = asyncio.Queue()
        readers = {choice.index: asyncio.create_task(self._read(choice, arrived))
                   for choice in self.choices}
        try:
            while not all(choice.done for choice in self.choices):
                choice, outputs = await arrived.get()
                if isinstance(outputs, Exception):
                    raise outputs
                if choice.done:  # queued before its reader was stopped
                    continue
                yield choice, outputs
                if choice.done:
                    readers[choice.index].cancel()
        finally:
            for reader in readers.values():
                reader.cancel()
            await asyncio.gather(*readers.values(), return_exceptions=True)

    async def _read(self, choice: Choice, arrived: asyncio.Queue) -> None:
        """Moves one choice's outputs to `arrived`; cancelling it aborts the engine request."""
        try:
            async with aclosing(self.state.client.generate(choice.request)) as batches:
                async for outputs in batches:
                    arrived.put_nowait((choice, outputs))
        except Exception as error:  # noqa: BLE001 - the consumer raises it (EngineUnavailable)
            arrived.put_nowait((choice, error))

    async def respond(self) -> web.Response:
        """The whole answer once every choice is done; a choice that fails fails the request
        at once (leaving the loop aborts the other choices)."""
        async with aclosing(self._outputs()) as outputs:
            async for choice, batch in outputs:
                for output in batch:
                    choice.take(output)
                if choice.done and choice.final.error is not None:
                    raise _finish_error(choice.final)
        body = self._envelope([self.format.choice(choice) for choice in self.choices], False)
        return web.json_response({**body, "usage": self._usage()})

    async def stream(self, request: web.Request, timeout: float | None) -> web.StreamResponse:
        """SSE: each choice's events written as soon as its outputs arrive. Headers wait for
        the first output, so a request that fails at once gets a real HTTP error. Past
        `timeout` seconds the request is aborted: an error event, then [DONE]."""
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        if len(self.choices) == 1:  # the common case: the router writes its events (pushed.py)
            choice = self.choices[0]
            pushed = PushedStream(functools.partial(self._events, choice),
                                  functools.partial(self._token_events, choice),
                                  lambda: choice.done)
            async with self.state.client.pushed(choice.request, pushed):
                first = await pushed.first()
                return await self._stream(request, deadline, choice, first, pushed)
        async with aclosing(self._outputs()) as outputs:
            choice, first = await anext(outputs)
            return await self._stream(request, deadline, choice, first, outputs)

    async def _stream(self, request: web.Request, deadline: float | None, choice: Choice,
                      first: list[RequestOutput], rest) -> web.StreamResponse:
        """The SSE response from `first`, a choice's first outputs; `rest` brings the others
        (a PushedStream, or the _outputs generator). Leaving `rest`'s block aborts what is
        not finished."""
        if first[0].error is not None and not first[0].new_token_ids:
            raise _finish_error(first[0])
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        try:
            await response.prepare(request)
            opening = [self._event(chunk) for chunk in self.format.opening(self.choices)]
            # never empty (a text piece is always an event, a chat opens with its role chunk),
            # so aiohttp sends the headers with it, before any write of the PushedStream's
            await response.write(b"".join(opening) + self._events(choice, first))
            await self._stream_rest(request, response, rest, deadline)
            usage = _sse(self._envelope([], True) | {"usage": self._usage()}) \
                if self.parsed.include_usage else b""
            # with the response's end: one write, where three were a system call each
            await response.write_eof(usage + b"data: [DONE]\n\n")
        except ConnectionResetError:
            # The client went away; leaving `rest`'s block aborts the request.
            log.debug("client left during %s", self.id)
        except Exception:  # noqa: BLE001 - a bug after the headers went out: the client
            # gets an error event and [DONE] (not a hang), the log the traceback
            log.exception("streaming %s failed", self.id)
            with contextlib.suppress(ConnectionResetError):
                await response.write(_sse({"error": {"message": "internal error while "
                                                     "streaming; see the server log",
                                                     "type": "server_error"}})
                                     + b"data: [DONE]\n\n")
        return response

    async def _stream_rest(self, request: web.Request, response: web.StreamResponse, rest,
                           deadline: float | None) -> None:
        try:
            async with asyncio.timeout_at(deadline):
                if isinstance(rest, PushedStream):
                    rest.start(request, response)
                    await rest.wait()
                else:
                    async for choice, batch in rest:
                        await response.write(self._events(choice, batch))
        except TimeoutError:
            if isinstance(rest, PushedStream):
                rest.stop()
            await response.write(b"".join(
                self._events(choice, [RequestOutput(
                    choice.request.request_id, [], True, FINISH_ABORT,
                    f"the completion took longer than request_timeout_s; it was aborted after "
                    f"{len(choice.token_ids)} tokens")])
                for choice in self.choices if not choice.done))

    def _token_events(self, choice: Choice, token: int, num_cached_tokens: int) -> bytes | None:
        """The SSE event of a plain output (types.is_plain) of `token`, from the template; None,
        having taken nothing, where `_events` must render it."""
        if not self._templated(choice):
            return None
        return self._token_event.render(choice.take_token(token, num_cached_tokens), token)

    def _templated(self, choice: Choice) -> bool:
        """Whether the choice's plain outputs render from the template."""
        return self._token_event is not None and choice.takes_tokens

    def _events(self, choice: Choice, outputs: list[RequestOutput]) -> bytes:
        """The SSE events for some outputs of one choice, one write: plain ones' from the
        template where it serves, one event a token either way."""
        if self._templated(choice) and all(is_plain(output) for output in outputs):
            render, take = self._token_event.render, choice.take_token
            return b"".join(render(take(token, output.num_cached_tokens), token)
                            for output in outputs for token in output.new_token_ids)
        events = []
        for output in outputs:
            for piece in choice.take(output):
                chunks = self.format.chunks(piece)
                for i, chunk in enumerate(chunks):
                    if piece.error is not None and i == len(chunks) - 1:
                        events.append(_sse(self._envelope([chunk], True) | {"error": {
                            "message": piece.error, "type": "server_error"}}))
                    else:
                        events.append(self._event(chunk))
        return b"".join(events)

    def _event(self, chunk: dict[str, Any]) -> bytes:
        """The SSE event of one chunk: `_sse(self._envelope([chunk], True))`'s bytes."""
        return self._event_head + dumps(chunk) + b"]}\n\n"


def _choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """Choice `index` samples with seed + index (vLLM's rule): a seeded request's choices
    differ from one another, and each reproduces."""
    if params.seed is None or index == 0:
        return params
    seed = params.seed + index
    return dataclasses.replace(params, seed=seed - 2**64 if seed >= 2**64 else seed)


def _sse(event: dict[str, Any]) -> bytes:
    return b"data: " + dumps(event) + b"\n\n"


def _finish_error(output: RequestOutput) -> ApiError:
    """A request the engine refused (400), that failed in its step (500), or that ended because
    the engine or the server went away (503)."""
    message = output.error or "the request failed in the engine"
    if output.rejected:
        return ApiError(400, "invalid_request_error", message)
    if output.finish_reason == FINISH_ABORT or message.startswith("engine unavailable"):
        return ApiError(503, "service_unavailable", message)
    return ApiError(500, "server_error", message)
