"""plan_ahead on CPU (float64): the step planned and staged while the last one runs (`on`),
and launched before its tokens are read back with its ids gathered from them on the device
(`launch`), gives the in-order path's greedy tokens, with planning off and auto, under KV and
slot pressure, with stop tokens that finish requests after their next step was planned, and
with aborts; every page, slot and request is given back."""

from __future__ import annotations

import pytest
import torch

from resident.config import EngineConfig
from resident.engine.buffers import SampledTokens, ids_from_sampled
from resident.engine.engine import Engine, build_engine
from resident.engine.types import EngineRequest, SamplingParams
from resident.model.config import load_model_config

from model_driver import run_engine, run_with_stops

TINY = load_model_config("tiny")
PRESSURE = {
    "none": {},
    "kv": {"num_kv_pages": 14, "prefill_token_budget": 32},
    "slot": {"decode_buckets": (1, 2, 4, 8), "decode_order": "turns", "max_num_seqs": 24},
    # padded prefill and mixed steps, as on CUDA, in small buckets
    "padded": {"padded_prefill": "on", "prefill_token_budget": 32, "decode_buckets": (1, 2, 4, 8),
               "prefill_buckets": (16, 40)},
}


def make_engine(plan_ahead: str, planning: str, **knobs) -> Engine:
    config = EngineConfig(dtype="float64", plan_ahead=plan_ahead, resident_planning=planning,
                          row_check="on" if planning == "auto" else "off", **knobs)
    return build_engine(TINY, config, "cpu")


def workload(count: int, seed: int) -> dict[str, tuple[list[int], int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 50, (count,), generator=generator).tolist()
    return {f"r{i}": (torch.randint(0, TINY.vocab_size, (n,), generator=generator).tolist(),
                      4 + (7 * i) % 23) for i, n in enumerate(lengths)}


def assert_all_given_back(engine: Engine, planning: str) -> None:
    assert not engine.requests and not engine.has_work()
    assert engine.kv.num_used == 0 and engine.states.num_used == 0
    if planning == "auto":
        assert engine.rowcheck_counts()["mismatches"] == 0
        assert not engine.planning.planner.ledger()["held"]


def assert_launched_ahead(engine: Engine) -> None:
    """Under launch every varlen step but the first ran ahead (a mixed one's decode rows
    gathered their ids on the device), and decode steps did."""
    stats = engine.stats()
    launched, steps = stats["steps_launched_ahead"], stats["steps"]
    assert launched["decode"] > 0 and launched["mixed"] == steps["mixed"] > 0
    assert launched["prefill"] == steps["prefill"] - 1


@pytest.mark.parametrize("planning", ["off", "auto"])
@pytest.mark.parametrize("pressure", sorted(PRESSURE))
def test_plan_ahead_gives_the_in_order_tokens(planning, pressure):
    requests = workload(24 if pressure == "slot" else 10, seed=len(pressure))
    concurrency = 24 if pressure == "slot" else 5
    runs = {}
    for plan_ahead in ("off", "on", "launch"):
        engine = make_engine(plan_ahead, planning, **PRESSURE[pressure])
        runs[plan_ahead] = run_engine(engine, requests, concurrency=concurrency)
        assert_all_given_back(engine, planning)
        if pressure == "kv":
            assert engine.scheduler.num_offloads > 0
        if pressure == "slot" and planning == "auto":
            assert engine.rowcheck_counts()["displaced"] > 0
        if plan_ahead == "launch":
            assert_launched_ahead(engine)
    assert runs["on"] == runs["off"]
    assert runs["launch"] == runs["off"]


def _stop_tokens_run(plan_ahead: str, planning: str, stops: dict[str, int]):
    """Each request stops at the token the in-order run gave it at some position."""
    engine = make_engine(plan_ahead, planning)
    return engine, run_with_stops(engine, workload(6, seed=5), stops)


@pytest.mark.parametrize("planning", ["off", "auto"])
@pytest.mark.parametrize("mode", ["on", "launch"])
def test_a_request_that_stops_after_its_next_step_was_planned(planning, mode):
    free_run = run_engine(make_engine("off", planning), workload(6, seed=5))
    stops = {rid: tokens[len(tokens) // 2] for rid, tokens in free_run.items() if len(tokens) > 4}
    in_order, want = _stop_tokens_run("off", planning, stops)
    ahead, got = _stop_tokens_run(mode, planning, stops)
    assert got == want
    assert any(len(want[rid]) < len(free_run[rid]) for rid in stops)  # some did stop early
    # their rows ran once more in the step planned ahead, then were given back
    assert ahead.counters["rows_after_finish"] > 0 == in_order.counters["rows_after_finish"]
    assert_all_given_back(ahead, planning)


@pytest.mark.parametrize("planning", ["off", "auto"])
@pytest.mark.parametrize("mode", ["on", "launch"])
def test_an_abort_between_steps_leaves_the_others_alone(planning, mode):
    requests = workload(6, seed=9)
    want = run_engine(make_engine("off", planning), requests)
    engine = make_engine(mode, planning)
    for rid, (prompt, max_tokens) in requests.items():
        engine.add_request(EngineRequest(rid, prompt, SamplingParams(max_tokens=max_tokens,
                                                                  ignore_eos=True)))
    got: dict[str, list[int]] = {rid: [] for rid in requests}
    for step in range(1000):
        if step == 6:
            engine.abort("r2")  # its row is in the step planned ahead
        if not engine.has_work():
            break
        for out in engine.step():
            got[out.request_id].extend(out.new_token_ids)
    assert engine.counters["aborts"] == 1 and engine.counters["rows_after_finish"] >= 1
    assert {rid: t for rid, t in got.items() if rid != "r2"} == \
        {rid: t for rid, t in want.items() if rid != "r2"}
    assert got["r2"] == want["r2"][:len(got["r2"])]
    assert_all_given_back(engine, planning)


def _batches(plan_ahead: str, planning: str, pressure: str) -> list[tuple]:
    """Every step's kind and rows (request, new tokens), all 12 requests queued before the
    first step, at most 4 running unless the pressure says otherwise: what a step computes,
    and in bf16 how it rounds, depends on its batch."""
    engine = make_engine(plan_ahead, planning, **{"max_num_seqs": 4, **PRESSURE[pressure]})
    batches = []
    schedule = engine.scheduler.schedule

    def recording_schedule():  # every step the scheduler plans runs, ahead or in order
        plan = schedule()
        if plan.rows:
            batches.append((plan.kind, [(row.request.request_id, row.num_new)
                                        for row in plan.rows]))
        return plan

    engine.scheduler.schedule = recording_schedule
    run_engine(engine, workload(12, seed=3))
    assert_all_given_back(engine, planning)
    return batches


@pytest.mark.parametrize("planning", ["off", "auto"])
@pytest.mark.parametrize("pressure", sorted(PRESSURE))
def test_plan_ahead_runs_the_in_order_batches(planning, pressure):
    """A max_tokens finish is known at commit, so its pages and slot go back before the next
    step is scheduled: planned ahead or not, the same requests join the same steps (the GPU
    test's bf16 tokens rely on it)."""
    in_order = _batches("off", planning, pressure)
    assert _batches("on", planning, pressure) == in_order
    assert _batches("launch", planning, pressure) == in_order


@pytest.mark.parametrize("padded", ["off", "on"])
def test_a_burst_of_prompts_runs_its_prefill_steps_ahead(padded):
    """Prompts that all arrive at once and end on their first token (the bench's burst): a
    run of prefill steps (budget 32, prompts of 40-49 tokens), each staged and launched while
    the one before runs; the in-order tokens."""
    generator = torch.Generator().manual_seed(11)
    requests = {f"b{i}": (torch.randint(0, TINY.vocab_size, (40 + i,),
                                        generator=generator).tolist(), 1) for i in range(10)}
    knobs = {"padded_prefill": padded, "prefill_token_budget": 32, "max_prefill_rows": 2}
    want = run_engine(make_engine("off", "auto", **knobs), requests, concurrency=10)
    engine = make_engine("launch", "auto", **knobs)
    assert run_engine(engine, requests, concurrency=10) == want
    launched, steps = (engine.stats()[key] for key in ("steps_launched_ahead", "steps"))
    assert launched["prefill"] == steps["prefill"] - 1 >= 5
    assert_all_given_back(engine, "auto")


@pytest.mark.parametrize("mode", ["on", "launch"])
def test_the_first_step_after_an_idle_runs_what_arrived(mode):
    """The last step before the engine drains plans nothing ahead: a request that arrives
    while it is idle runs in the very next step() (an empty plan kept from before the idle
    would have spent that step on nothing)."""
    engine = make_engine(mode, "auto")
    for rid, (prompt, max_tokens) in workload(2, seed=4).items():
        engine.add_request(EngineRequest(rid, prompt, SamplingParams(max_tokens=max_tokens,
                                                                  ignore_eos=True)))
    while engine.has_work():
        engine.step()
    engine.add_request(EngineRequest("late", [5, 6, 7], SamplingParams(max_tokens=2,
                                                                       ignore_eos=True)))
    outputs = engine.step()
    assert engine.last_step_kind == "prefill"
    assert [out.request_id for out in outputs] == ["late"]
    assert len(outputs[0].new_token_ids) == 1


@pytest.mark.parametrize("sources, want", [
    ([0, 1, -1, -1], [10, 11, 7, 7]),  # leading in the sampled order: one copy
    ([-1, 2, 0, -1], [7, 12, 10, 7]),  # anywhere else: the staged gather
    ([-1, -1, -1, -1], [7, 7, 7, 7]),  # nothing pending: the host's ids stay
])
def test_ids_from_sampled_moves_each_pending_row_its_token(sources, want):
    """The device gather both a decode step's and a varlen step's ids use (buffers.py)."""
    ids = torch.full((4,), 7)
    sampled = SampledTokens(torch.tensor([10, 11, 12]), {"a": 0, "b": 1, "c": 2})
    rows = torch.zeros(8, dtype=torch.int64)
    ids_from_sampled(ids, sources, sampled, rows.clone().numpy(), rows, torch.zeros(4).long())
    assert ids.tolist() == want


def test_a_mixed_steps_decode_row_without_its_last_token_is_refused():
    """A varlen step's decode row whose last token is pending must take it from the step
    before's sampled tokens: staged without them the step is refused, naming the request; with
    them its host id is zeroed for the device copy, and the others keep theirs."""
    from resident.engine.request import PENDING_TOKEN

    engine = make_engine("off", "off")
    for rid, (prompt, max_tokens) in workload(3, 4).items():
        engine.add_request(EngineRequest(rid, prompt, SamplingParams(max_tokens=max_tokens + 20,
                                                                     ignore_eos=True)))
    while not all(r.output_ids for r in engine.requests.values()):
        engine.step()
    engine.add_request(EngineRequest("late", [1, 2, 3], SamplingParams(max_tokens=2)))
    plan = engine.scheduler.schedule()
    assert plan.kind == "mixed" and plan.num_decode_rows == 3
    pending = plan.rows[1].request
    pending.output_ids[-1] = PENDING_TOKEN
    with pytest.raises(RuntimeError, match=pending.request_id):
        engine.inputs.varlen.stage(plan)
    sampled = SampledTokens(torch.tensor([5, 6]), {pending.request_id: 1})
    engine.inputs.varlen.stage(plan, sampled)
    host_ids = engine.inputs.varlen.host.input_ids[:3].tolist()
    assert host_ids[1] == 0 and host_ids[0] == plan.rows[0].request.output_ids[-1]
    assert int(engine.inputs.buffers.input_ids_gpu[1]) == 6
