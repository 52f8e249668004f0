"""late_launch: the step after a decode step launched late, the engine core's intake polled until
then, so a request that arrives meanwhile runs its prompt in that step (engine/launch_window.py,
Engine.intake, server/core.py). Tiny model on CPU, float64: the tokens are the same, the taken
request's first token comes a step sooner, the window's deadline follows the engine's timings,
and the core keeps the API's other messages in their order."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
import zmq

from resident.config import EngineConfig
from resident.engine.engine import Engine, build_engine
from resident.engine.launch_window import LaunchWindow, poll_until
from resident.engine.types import EngineRequest, SamplingParams
from resident.model.config import load_model_config
from resident.server.core import _window_intake
from resident.server.protocol import AbortRequest, AddRequest
from tests.server_fixture import Server, post, run

TINY = load_model_config("tiny")


def prompt(seed: int, length: int = 12) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY.vocab_size, (length,), generator=generator).tolist()


def request(name: str, seed: int, max_tokens: int = 6) -> EngineRequest:
    return EngineRequest(name, prompt(seed), SamplingParams(max_tokens=max_tokens,
                                                            ignore_eos=True))


def make_engine(**knobs) -> Engine:
    return build_engine(TINY, EngineConfig(dtype="float64", **knobs), "cpu")


# -- the window's deadline -------------------------------------------------------------------

def test_the_deadline_is_the_step_start_plus_its_least_gpu_time_less_the_lead():
    window = LaunchWindow(history=4, margin_s=0.1)
    waited = 0.01  # each read below waited for its tokens: it saw the GPU finish
    assert window.deadline(8, launched_s=5.0) is None  # no sample of the bucket yet
    window.read(0, launched_s=0.0, read_s=1.0, waited_s=waited)  # a varlen step: not sampled
    assert window.deadline(8, launched_s=0.5) is None
    window.read(8, launched_s=0.5, read_s=3.0, waited_s=waited)  # ran from the last read: 2.0
    window.read(8, launched_s=4.0, read_s=9.0, waited_s=waited)  # launched later: ran 4.0-9.0
    window.led(0.2)
    window.led(0.3)
    # the least GPU time (2.0), the most lead (0.3) and the margin; started at the last read
    assert window.deadline(8, launched_s=1.0) == pytest.approx(9.0 + 2.0 - 0.4)
    # launched after the last read: started at its launch
    assert window.deadline(8, launched_s=10.0) == pytest.approx(10.0 + 2.0 - 0.4)
    for read_s in (12.0, 15.0, 18.0, 21.0):  # history 4: the 2.0 sample leaves
        window.read(8, launched_s=0.0, read_s=read_s, waited_s=waited)
    assert window.deadline(8, launched_s=0.0) == pytest.approx(21.0 + 3.0 - 0.4)
    with pytest.raises(ValueError, match="history >= 1"):
        LaunchWindow(history=0)


def test_a_read_that_found_its_tokens_there_opens_no_window_and_samples_nothing():
    """The host was late (or on CPU the forward ran inside its launch): the read says nothing
    of when the GPU finished, so neither the next step's start nor this step's time is known."""
    window = LaunchWindow(margin_s=0.0)
    window.read(8, launched_s=0.0, read_s=1.0, waited_s=0.5)
    window.read(8, launched_s=0.5, read_s=2.0, waited_s=0.5)  # sampled: 1.0
    window.read(8, launched_s=1.5, read_s=9.0, waited_s=0.0)  # host-bound: not sampled
    assert window.deadline(8, launched_s=8.0) is None  # queued before a read that did not wait
    assert window.deadline(8, launched_s=9.5) == pytest.approx(10.5)  # launched after it
    window.read(8, launched_s=9.5, read_s=10.5, waited_s=0.5)
    assert window.deadline(8, launched_s=10.0) == pytest.approx(11.5)


def test_poll_until_stops_at_the_first_arrival_or_the_deadline():
    calls = []

    def arrives_third():
        calls.append(1)
        return len(calls) == 3

    assert poll_until(float("inf"), arrives_third) and len(calls) == 3
    calls.clear()
    assert not poll_until(None, arrives_third) and len(calls) == 1  # no deadline: one poll
    calls.clear()
    assert not poll_until(0.0, arrives_third) and len(calls) == 1  # already past


def test_late_launch_needs_plan_ahead_launch_and_one_rank():
    assert EngineConfig().resolve(TINY, "cuda").late_launch == "on"
    assert EngineConfig().resolve(TINY, "cpu").late_launch == "off"
    assert EngineConfig(plan_ahead="on").resolve(TINY, "cuda").late_launch == "off"
    assert EngineConfig(late_launch="on").resolve(TINY, "cpu").late_launch == "on"
    assert not EngineConfig().is_resolved  # auto is filled by resolve
    with pytest.raises(ValueError, match="knob late_launch: on needs plan_ahead=launch"):
        EngineConfig(late_launch="on", plan_ahead="on")
    with pytest.raises(ValueError, match="tensor_parallel=2"):
        EngineConfig(late_launch="on", tensor_parallel=2)
    with pytest.raises(ValueError, match="knob late_launch: 'late' is not one of"):
        EngineConfig(late_launch="late")


# -- the engine: a request taken in a window ----------------------------------------------

def first_token_steps(engine: Engine, arrivals: dict[int, EngineRequest],
                      through_window: bool) -> tuple[dict[str, int], dict[str, list[int]]]:
    """Steps the engine with "a" running; the request arrivals[n] arrives while step() call n
    runs (taken by the window), or just after it (added between calls). Returns each request's
    first-token call and its tokens."""
    engine.add_request(request("a", 0, max_tokens=12))
    calls, first, tokens = 0, {}, {}

    def intake() -> int:
        new = arrivals.pop(calls, None)
        if new is not None:
            assert engine.add_request(new) is None
        return int(new is not None)

    engine.intake = intake if through_window else None
    while engine.has_work():
        for output in engine.step():
            tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
            first.setdefault(output.request_id, calls)
        if not through_window and calls in arrivals:
            engine.add_request(arrivals.pop(calls))
        calls += 1
    return first, tokens


@pytest.mark.parametrize("planning", ["off", "auto"])
def test_a_request_taken_in_the_window_has_its_first_token_a_step_sooner(planning):
    def go(through_window: bool):
        engine = make_engine(resident_planning=planning,
                             row_check="on" if planning == "auto" else "off")
        result = first_token_steps(engine, {3: request("b", 1), 5: request("c", 2)},
                                   through_window)
        assert not engine.requests and engine.kv.num_used == 0 and engine.states.num_used == 0
        if planning == "auto":
            assert engine.rowcheck_counts()["mismatches"] == 0
        return result, engine.stats()

    (late, late_tokens), stats = go(True)
    (early, early_tokens), _ = go(False)
    assert late_tokens == early_tokens and all(len(t) == 6 for k, t in late_tokens.items()
                                                if k != "a")
    # taken while call 3 ran, its prompt ran in the step call 3 launched ahead: its first
    # token is call 4's; added after call 3, its prompt waited for the step after that one
    assert late["b"] == 4 and early["b"] == 5
    assert late["c"] == 6 and early["c"] == 7
    assert stats["window_arrivals"] == 2


@pytest.mark.parametrize("slow_reads", [False, True])
def test_no_window_while_a_request_waits_or_on_a_varlen_step(slow_reads):
    """slow_reads: each read of a step's tokens takes 2 ms, as a busy host's can; on CPU that is
    no GPU time, and no window opens (one did, under a loaded suite, and polled 69,025 times)."""
    engine = make_engine(max_num_seqs=1)
    polled = []
    engine.intake = lambda: polled.append(engine.last_step_kind) or False
    if slow_reads:
        wait = engine.readback.wait
        engine.readback.wait = lambda: time.sleep(0.002) or wait()
    engine.add_request(request("a", 0, max_tokens=4))
    engine.add_request(request("b", 1, max_tokens=4))  # waits for a's sequence
    while engine.has_work():
        engine.step()
    # a's decode steps wait on b (no poll), then b's prefill is a varlen step (no poll); only
    # b's decode steps, with nothing waiting, poll
    assert polled and set(polled) == {"decode"}
    assert len(polled) <= 3


# -- the engine core's window intake --------------------------------------------------------

def test_the_core_takes_new_requests_and_keeps_the_rest_in_order():
    with zmq.Context() as context, context.socket(zmq.PULL) as pull, \
            context.socket(zmq.PUSH) as push:
        pull.bind("inproc://window")
        push.connect("inproc://window")
        handled, deferred = [], []

        def handle(message) -> bool:
            handled.append(message)
            return True

        assert _window_intake(pull, handle, deferred) == 0  # nothing there
        add_a, add_b = AddRequest(request("a", 0), 0), AddRequest(request("b", 1), 0)
        abort_x = AbortRequest("x")
        push.send_pyobj([add_a, abort_x, add_b])  # one turn of an API's loop
        assert _window_intake(pull, handle, deferred) == 1
        # a is taken; the abort waits for the boundary, and b after it, so they keep order
        assert [m.request.request_id for m in handled] == ["a"]
        assert [type(m) for m in deferred] == [AbortRequest, AddRequest]
        push.send_pyobj(AddRequest(request("c", 2), 0))
        assert _window_intake(pull, handle, deferred) == 0  # nothing more while one waits
        assert len(handled) == 1 and pull.poll(0)
        pull.recv_pyobj()
        deferred.clear()
        push.send_pyobj([AddRequest(request("d", 3), 0), AddRequest(request("e", 4), 0)])
        assert _window_intake(pull, handle, deferred) == 2  # the requests, not the message


def test_a_late_launching_server_serves_the_same_tokens():
    """Requests that arrive while others decode, late_launch on against off: the same tokens,
    and the API's aborts still act (a request cancelled by its client frees its place)."""
    bodies = [{"prompt": prompt(i, 6 + i), "max_tokens": 12 + 3 * i, "ignore_eos": True}
              for i in range(6)]

    def tokens(late: str) -> list[list[int]]:
        server = Server("--set", "dtype=float64", "--set", f"late_launch={late}").wait_ready()

        async def ask():
            async def one(i, body):
                await asyncio.sleep(0.02 * i)  # arrivals while the earlier ones decode
                return await post(server.url + "/v1/completions", body)

            return await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))

        try:
            answers = run(ask())
        finally:
            server.stop()
        assert [status for status, _ in answers] == [200] * len(bodies)
        return [answer["choices"][0]["token_ids"] for _, answer in answers]

    late, early = tokens("on"), tokens("off")
    assert late == early
    assert [len(ids) for ids in late] == [12 + 3 * i for i in range(6)]
