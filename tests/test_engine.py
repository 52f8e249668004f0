"""The engine in process on CPU: continuous batching, chunked prefill, offload under KV pressure and
turn-taking decode all give the tokens the model gives when run directly (float64)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from resident.config import EngineConfig
from resident.engine.engine import Engine, build_engine
from resident.engine.types import EngineRequest, SamplingParams
from resident.model.config import load_model_config

from model_driver import greedy_alone, run_sampled
from model_driver import run_engine as run

TINY = load_model_config("tiny")


def make_engine(**knobs) -> Engine:
    config = EngineConfig(dtype="float64", **knobs)
    return build_engine(TINY, config, "cpu")


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 60, (count,), generator=generator).tolist()
    return [torch.randint(0, TINY.vocab_size, (n,), generator=generator).tolist()
            for n in lengths]


@pytest.fixture(scope="module")
def reference_model():
    return make_engine().model


@pytest.fixture(scope="module")
def workload(reference_model):
    requests = {f"r{i}": (p, 5 + 3 * i) for i, p in enumerate(prompts(8))}
    expected = {rid: greedy_alone(reference_model, p, n) for rid, (p, n) in requests.items()}
    return requests, expected


def test_batched_greedy_equals_the_model_alone(workload):
    requests, expected = workload
    engine = make_engine(prefill_token_budget=64)
    assert run(engine, requests) == expected
    assert engine.counters["steps_mixed"] > 0 and engine.counters["steps_decode"] > 0


def test_kv_pressure_offloads_and_returns_everything(workload):
    requests, expected = workload
    engine = make_engine(num_kv_pages=12, prefill_token_budget=32)
    free_pages, free_slots = engine.kv.num_free, engine.states.num_free
    assert run(engine, requests) == expected
    assert engine.scheduler.num_offloads > 0
    assert engine.scheduler.num_reloads == engine.scheduler.num_offloads
    assert (engine.kv.num_free, engine.states.num_free) == (free_pages, free_slots)


def test_turns_share_a_narrow_bucket(workload):
    requests, expected = workload
    engine = make_engine(decode_buckets=(1, 2), decode_order="turns")
    assert run(engine, requests) == expected


def test_a_request_that_can_never_fit_fails_alone(workload):
    requests, expected = workload
    engine = make_engine(num_kv_pages=12)
    too_big = EngineRequest("huge", [1] * 150, SamplingParams(max_tokens=100))
    failed = engine.add_request(too_big)
    assert failed.finished and failed.finish_reason == "error"
    assert "can never fit" in failed.error
    assert run(engine, requests) == expected


def test_abort_frees_pages_and_slots(workload):
    requests, _ = workload
    engine = make_engine()
    free_pages, free_slots = engine.kv.num_free, engine.states.num_free
    for rid, (prompt, _) in requests.items():
        engine.add_request(EngineRequest(rid, prompt, SamplingParams(max_tokens=50)))
    for _ in range(3):
        engine.step()
    for rid in requests:
        engine.abort(rid)
    if engine.has_work():  # the step planned ahead (plan_ahead) runs their rows, unsampled
        assert engine.step() == []
    assert not engine.has_work()
    assert (engine.kv.num_free, engine.states.num_free) == (free_pages, free_slots)
    assert engine.counters["aborts"] == len(requests)


def test_seeded_sampling_is_reproducible():
    prompt = prompts(1, seed=5)[0]
    params = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, top_k=50, seed=42)

    def sample() -> list[int]:
        engine = make_engine()
        engine.add_request(EngineRequest("s", prompt, params))
        tokens = []
        while engine.has_work():
            tokens += [t for out in engine.step() for t in out.new_token_ids]
        return tokens

    first = sample()
    assert first == sample()
    assert len(first) == 12
    other = dataclasses.replace(params, seed=43)
    engine = make_engine()
    engine.add_request(EngineRequest("s", prompt, other))
    tokens = []
    while engine.has_work():
        tokens += [t for out in engine.step() for t in out.new_token_ids]
    assert tokens != first


def test_padded_prefill_gives_the_model_alone_tokens(workload, reference_model):
    """Every prefill and mixed step padded to its bucket (padding on the sink page and slot,
    past the rows' ends), with several requests at once: the tokens of the model alone. The
    100-token prompt is chunked: its first chunk samples nothing, its second continues it."""
    requests, expected = workload
    long_prompt = torch.randint(0, TINY.vocab_size, (100,),
                                generator=torch.Generator().manual_seed(5)).tolist()
    requests = {**requests, "long": (long_prompt, 4)}
    expected = {**expected, "long": greedy_alone(reference_model, long_prompt, 4)}
    engine = make_engine(padded_prefill="on", prefill_buckets=(8, 16, 64),
                         prefill_token_budget=64)
    assert run(engine, requests, concurrency=3) == expected
    steps = engine.stats()["steps"]
    assert engine.runner.num_padded_prefills == steps["prefill"] + steps["mixed"] > len(requests)


def test_a_poison_draw_fails_its_request_alone(workload):
    """A request at temperature 1e-40 (its logits overflow float32 in the draw) finishes with
    an error on its first draw; a sampled request and the greedy ones in the same steps finish
    as usual, the greedy ones with the model-alone tokens, and its pages and slot come back."""
    requests, expected = workload
    engine = make_engine()
    free_pages, free_slots = engine.kv.num_free, engine.states.num_free
    poison = SamplingParams(max_tokens=20, temperature=1e-40, seed=1)
    warm = SamplingParams(max_tokens=6, temperature=0.9, seed=2)
    engine.add_request(EngineRequest("poison", prompts(1, seed=9)[0], poison))
    engine.add_request(EngineRequest("warm", prompts(1, seed=8)[0], warm))
    outputs = {rid: [] for rid in requests}
    finished = {}
    for rid, (prompt, max_tokens) in requests.items():
        engine.add_request(EngineRequest(rid, prompt, SamplingParams(max_tokens=max_tokens,
                                                                     ignore_eos=True)))
    while engine.has_work():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                finished[out.request_id] = out
    assert finished["poison"].finish_reason == "error" and outputs["poison"] == []
    assert "sampling failed" in finished["poison"].error
    assert finished["warm"].finish_reason in ("length", "stop") and outputs["warm"]
    assert {rid: outputs[rid] for rid in requests} == expected
    assert engine.counters["failed_requests"] == 1
    # the failed draw is no generated token
    assert engine.counters["generated_tokens"] == sum(map(len, outputs.values()))
    assert (engine.kv.num_free, engine.states.num_free) == (free_pages, free_slots)


@pytest.mark.parametrize("alone_planning, crowd_planning", [("off", "auto"), ("auto", "off")])
def test_a_seeded_request_gives_the_same_tokens_alone_and_among_15(alone_planning,
                                                                   crowd_planning):
    """A seeded request alone, and then arriving third among 15 others (sampled, seeded or
    not, and greedy) that come and go around it, on the other planning arm (its row by slot
    on the device, or uploaded each step): the same tokens. Unseeded requests with one
    prompt and the same parameters give different tokens."""
    prompt = prompts(1, seed=5)[0]
    me = SamplingParams(max_tokens=16, temperature=0.8, top_p=0.9, top_k=50, seed=42,
                        ignore_eos=True)
    alone = make_engine(resident_planning=alone_planning)
    mine = run_sampled(alone, {"me": (prompt, me)}, 1)["me"]
    assert len(mine) == 16
    crowd = make_engine(resident_planning=crowd_planning, max_num_seqs=8,
                        decode_buckets=(1, 2, 4, 8))
    assert {alone.planning.mode, crowd.planning.mode} == {"off", "resident"}
    others = {f"o{i}": (p, SamplingParams(max_tokens=3 + i % 7, temperature=(i % 3) * 0.6,
                                          top_p=0.8, seed=i if i % 2 else None,
                                          ignore_eos=True))
              for i, p in enumerate(prompts(15, seed=11))}
    order = list(others.items())
    requests = dict(order[:2] + [("me", (prompt, me))] + order[2:])
    outputs = run_sampled(crowd, requests, concurrency=6)
    assert outputs["me"] == mine
    resident = alone if alone.planning.mode == "resident" else crowd
    assert resident.sampler.slots.rows_written >= 1
    unseeded = SamplingParams(max_tokens=8, temperature=1.0, ignore_eos=True)
    free = run_sampled(make_engine(), {f"u{i}": (prompt, unseeded) for i in range(4)}, 4)
    assert len({tuple(tokens) for tokens in free.values()}) == 4


def test_what_the_core_sends_unpickles_without_torch_or_numpy():
    """The API process never imports torch: it unpickles every core message, and one torch or
    numpy object in them imports that library there. torch.__version__ (a TorchVersion) in the
    Ready info did: 1.3 s on this CPU, and the 2.7-4.8 s between a warm H200 core's start-up
    and /health 200 (the API's ready line, every start)."""
    import pickle
    import subprocess
    import sys

    from resident.server.core import _answer
    from resident.server.protocol import Ready, StatsReply, StepOutputs

    engine = build_engine(TINY, EngineConfig(phase_timing="on"), "cpu")
    outputs: list = []
    engine.add_request(EngineRequest("a", [3, 1, 4, 1, 5], SamplingParams(max_tokens=3)))
    while engine.has_work():
        outputs.extend(engine.step())
    messages = [Ready(engine.info()), StepOutputs.of(outputs)]
    messages += [StatsReply(0, _answer(engine, section)) for section in ("stats", "phases")]
    code = ("import pickle, sys; pickle.loads(sys.stdin.buffer.read()); "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    for message in messages:
        loaded = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(message),
                                capture_output=True, check=True, timeout=60)
        assert loaded.stdout.decode().strip() == "[]", type(message).__name__


def test_each_plans_sampling_requests_are_its_rows_that_sample(workload):
    """StepPlan.sampling, which the scheduler takes from its list of decode requests, is the
    requests of the plan's rows that sample, in row order, at every step. Under KV pressure
    offloads turn ready requests away from a step's decode rows; taking turns in a narrow
    bucket, a row's admission offloads a request ahead of the step's last row: a request in the
    middle of the list is turned away (once in this workload; the planted bug of taking the
    ready list's head fails here)."""
    requests, expected = workload
    engine = make_engine(num_kv_pages=16, prefill_token_budget=32, decode_order="turns",
                         decode_buckets=(1, 2))
    schedule, plans = engine.scheduler.schedule, []

    def recorded():
        plans.append(schedule())
        return plans[-1]

    engine.scheduler.schedule = recorded
    assert run(engine, requests) == expected
    assert engine.scheduler.num_offloads > 0
    for plan in plans:
        assert [id(r) for r in plan.sampling] == [id(row.request) for row in plan.rows
                                                   if row.samples]
