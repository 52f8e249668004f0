"""A step's outputs on their way to the API processes (server/protocol.py StepOutputs,
server/routing.py OutputRouter): plain outputs in columns and the others whole, every output
arriving at the process that owns its request, equal to what the engine gave."""

from __future__ import annotations

import pickle

import zmq

from resident.engine.types import FINISH_LENGTH, RequestOutput, TokenLogprobs
from resident.server.protocol import StepOutputs
from resident.server.routing import OutputRouter

OUTPUTS = [RequestOutput("a", [5]), RequestOutput("b", [6], num_cached_tokens=32),
           RequestOutput("c", [7], True, FINISH_LENGTH),
           RequestOutput("d", [8], logprobs=(TokenLogprobs(-0.25, ((8, -0.25),)),)),
           RequestOutput("e", [], True, "error", "the draw failed"), RequestOutput("f", [9])]


def test_plain_outputs_travel_as_columns_and_come_back_equal():
    step = pickle.loads(pickle.dumps(StepOutputs.of(OUTPUTS)))
    assert step.request_ids == ["a", "b", "f"] and step.tokens == [5, 6, 9]
    assert step.num_cached_tokens == [0, 32, 0]
    assert [output.request_id for output in step.others] == ["c", "d", "e"]
    assert sorted(step.outputs()) == sorted(OUTPUTS)
    assert all(type(output) is RequestOutput for output in step.outputs())


def test_the_router_sends_each_process_its_own_requests_outputs():
    context = zmq.Context()
    pulls = []
    for index in range(2):
        pull = context.socket(zmq.PULL)
        pull.bind(f"inproc://outputs-{index}")
        pulls.append(pull)
    router = OutputRouter(context, [f"inproc://outputs-{index}" for index in range(2)], 1.0)
    try:
        for output, owner in zip(OUTPUTS, [0, 1, 0, 1, 0, 0], strict=True):
            router.own(output.request_id, owner)
        router.send_outputs(OUTPUTS)
        received = [pull.recv_pyobj(zmq.NOBLOCK).outputs() for pull in pulls]
        assert sorted(received[0]) == sorted(OUTPUTS[i] for i in (0, 2, 4, 5))
        assert sorted(received[1]) == sorted(OUTPUTS[i] for i in (1, 3))
        # a finished request is no longer owned: a late output of it goes nowhere
        router.send_outputs([RequestOutput("c", [1])])
        assert pulls[0].poll(50) == 0
    finally:
        router.close(0)
        for pull in pulls:
            pull.close(0)
        context.term()
