"""The API process's EngineClient against a real engine core (tiny model, CPU), no HTTP."""

from __future__ import annotations

import asyncio
import multiprocessing
import tempfile
import time
from contextlib import aclosing

import zmq

from resident.config import build_engine_config, model_yaml_knobs
from resident.engine.types import EngineRequest, SamplingParams
from resident.model.config import load_model_config
from resident.server.client import EngineClient
from resident.server.core import run_engine_core
from resident.server.protocol import AbortRequest, AddRequest

MAX_TOKENS = 24


async def _batches(client: EngineClient, request_id: str, pause_s: float,
                   block_loop: bool = False) -> list[list]:
    """generate()'s batches for one greedy request; after the first the consumer sleeps, or
    (block_loop) holds the whole event loop, as a busy API process does."""
    request = EngineRequest(request_id, [7, 8, 9, 10],
                            SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    batches = []
    async with aclosing(client.generate(request)) as outputs:
        async for batch in outputs:
            batches.append(batch)
            if len(batches) == 1 and block_loop:
                time.sleep(pause_s)  # the core's messages queue up in the socket meanwhile
            elif len(batches) == 1:
                await asyncio.sleep(pause_s)
    return batches


def _tokens(batches: list[list]) -> list[int]:
    return [token for batch in batches for output in batch for token in output.new_token_ids]


def test_outputs_that_arrive_while_the_consumer_is_busy_come_as_one_batch():
    """A stream that falls behind its core writes what queued up at once (api.py), in order
    and complete, whether its consumer slept or the whole event loop was busy (the client
    routes every queued core message before a stream runs); one that keeps up gets the same
    tokens."""
    model = load_model_config("tiny")
    config = build_engine_config(model_yaml_knobs("tiny"), {}).resolve(model, "cpu")

    async def body():
        with tempfile.TemporaryDirectory(prefix="rclient") as directory:
            addrs = (f"ipc://{directory}/requests", f"ipc://{directory}/outputs")
            client = EngineClient(*addrs)
            core = multiprocessing.get_context("spawn").Process(
                target=run_engine_core, args=(model, config, "cpu", [addrs[0]], [addrs[1]]),
                daemon=True)
            core.start()
            client.start()
            try:
                await asyncio.wait_for(client.wait_ready(), 120)
                behind = await _batches(client, "behind", pause_s=2.0)
                blocked = await _batches(client, "blocked", pause_s=2.0, block_loop=True)
                along = await _batches(client, "along", pause_s=0.0)
            finally:
                await client.close()
                core.kill()
                core.join(10)
        # the first batch is what arrived before the consumer first ran (one output, or two
        # where the core's next step beat the event loop: the full suite saw [2, 22] once); the
        # core ran the rest while the consumer slept, and one batch holds them all
        for batches in (behind, blocked):
            assert len(batches) == 2 and sum(map(len, batches)) == MAX_TOKENS
            assert batches[-1][-1].finished and not any(o.finished for o in batches[-1][:-1])
            assert _tokens(batches) == _tokens(along)
        assert len(_tokens(along)) == MAX_TOKENS

    asyncio.run(body())


def test_what_one_turn_of_the_loop_queues_reaches_the_core_as_one_message_in_order():
    """Requests and aborts queued in one turn of the event loop leave as one list, in order
    (the core handles each); one queued alone leaves as itself. Read at the core's end of the
    pipe by a plain PULL socket."""
    request = EngineRequest("a", [1, 2], SamplingParams(max_tokens=2))

    async def body():
        with tempfile.TemporaryDirectory(prefix="rclient") as directory:
            addrs = (f"ipc://{directory}/requests", f"ipc://{directory}/outputs")
            client = EngineClient(*addrs)
            core_end = zmq.Context.instance().socket(zmq.PULL)
            core_end.connect(addrs[0])
            try:
                await asyncio.sleep(0.2)  # connected, as a core is before its Ready
                client._post(AddRequest(request))
                client._post(AbortRequest("a"))
                client._post(AddRequest(request, api_index=1))
                await asyncio.sleep(0)  # the turn ends: one flush
                client._post(AbortRequest("b"))
                await asyncio.sleep(0.05)
                assert core_end.poll(5000)
                first = core_end.recv_pyobj()
                assert core_end.poll(5000)
                second = core_end.recv_pyobj()
            finally:
                core_end.close(linger=0)
                await client.close()
        assert first == [AddRequest(request), AbortRequest("a"), AddRequest(request, 1)]
        assert second == AbortRequest("b")

    asyncio.run(body())


def test_a_message_the_pipe_cannot_take_yet_leaves_once_it_can():
    """Queued before the core's end connects (zmq refuses a PUSH with no peer), a request is
    retried every FLUSH_RETRY_S and arrives once the core is there, with what came after it."""
    async def body():
        with tempfile.TemporaryDirectory(prefix="rclient") as directory:
            addrs = (f"ipc://{directory}/requests", f"ipc://{directory}/outputs")
            client = EngineClient(*addrs)
            core_end = zmq.Context.instance().socket(zmq.PULL)
            try:
                client._post(AbortRequest("early"))
                await asyncio.sleep(0.05)  # retried a few times: nobody is connected
                client._post(AbortRequest("later"))
                core_end.connect(addrs[0])
                await asyncio.sleep(0.3)
                assert core_end.poll(5000)
                return core_end.recv_pyobj()
            finally:
                core_end.close(linger=0)
                await client.close()

    assert asyncio.run(body()) == [AbortRequest("early"), AbortRequest("later")]
