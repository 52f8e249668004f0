"""core_idle_spin: an engine core out of work polls for requests without waiting for a while
before it sleeps in zmq's poll (server/core.py); on by default on CUDA, off on CPU."""

from __future__ import annotations

import time

import pytest
import zmq

from resident.config import EngineConfig
from resident.model.config import load_model_config
from resident.server.core import input_arrived
from tests.server_fixture import Server, get, post, run


def test_auto_spins_on_cuda_only_and_a_bad_value_is_named():
    tiny = load_model_config("tiny")
    assert EngineConfig().resolve(tiny, "cuda").core_idle_spin == "on"
    assert EngineConfig().resolve(tiny, "cpu").core_idle_spin == "off"
    assert EngineConfig(core_idle_spin="on").resolve(tiny, "cpu").core_idle_spin == "on"
    assert not EngineConfig().is_resolved  # auto is filled by resolve
    with pytest.raises(ValueError, match="knob core_idle_spin: 'spin' is not one of"):
        EngineConfig(core_idle_spin="spin")


def test_a_message_is_taken_while_spinning_and_after_it():
    with zmq.Context() as context, context.socket(zmq.PULL) as pull, \
            context.socket(zmq.PUSH) as push:
        pull.bind("inproc://idle-spin")
        push.connect("inproc://idle-spin")
        push.send_pyobj("early")  # there before the spin: taken at once
        assert input_arrived(pull, time.monotonic() + 1.0) and pull.recv_pyobj() == "early"
        # nothing comes: the spin ends, then the wait
        assert not input_arrived(pull, time.monotonic() + 0.01)
        push.send_pyobj("late")  # no spin left: the wait takes it
        assert input_arrived(pull, 0.0) and pull.recv_pyobj() == "late"


def test_a_spinning_core_serves_the_same_tokens():
    """Requests one after another, each arriving while the core spins: the same tokens as a
    core that waits in its poll."""
    bodies = [{"prompt": [3, 1, 4, 1, 5, 9, 2, i], "max_tokens": 8, "ignore_eos": True}
              for i in range(4)]

    def tokens(spin: str) -> tuple[str, list[list[int]]]:
        server = Server("--set", "dtype=float64", "--set", f"core_idle_spin={spin}").wait_ready()

        async def ask():
            answers = [await post(server.url + "/v1/completions", body) for body in bodies]
            return await get(server.url + "/debug/config"), answers

        try:
            (_, config), answers = run(ask())
        finally:
            server.stop()
        assert [status for status, _ in answers] == [200] * len(bodies)
        return config["knobs"]["core_idle_spin"], [
            answer["choices"][0]["token_ids"] for _, answer in answers]

    spinning, waiting = tokens("on"), tokens("off")
    assert spinning[0] == "on" and waiting[0] == "off"
    assert spinning[1] == waiting[1] and all(len(ids) == 8 for ids in spinning[1])
