"""Tensor parallelism on CPU (docs/parallel.md): two gloo ranks of the tiny model in float64
serve what one rank serves, agree step by step (the same requests hold planner slots and are
displaced), and a real `resident serve --set tensor_parallel=2` answers as tensor_parallel=1
does, fails clearly on a bad value and fails cleanly when a rank dies."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import re
import signal
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from resident.config import EngineConfig
from resident.engine.engine import Engine
from resident.engine.types import EngineRequest, SamplingParams
from resident.model.config import load_model_config
from resident.model.weights import load_model
from resident.parallel.group import RankGroup, free_port, init_group, single_rank
from resident.parallel.lockstep import Beat, Lockstep, LockstepError, step_digest
from resident.parallel.shard import RankShard

from model_driver import ModelDriver
from server_fixture import Server, get, post, run

TINY = load_model_config("tiny")
CPU = torch.device("cpu")
RANK_TIMEOUT_S = 120


def _rank_main(fn, rank: int, ranks: int, port: int, queue, args) -> None:
    torch.set_num_threads(1)  # two ranks share the 2 CPUs
    try:
        group = init_group(rank, ranks, port, "cpu", timeout_s=RANK_TIMEOUT_S)
        result = fn(group, *args)
        group.close()
    except BaseException:  # noqa: BLE001 - the test must see why a rank failed
        result = RuntimeError(traceback.format_exc())
    # plain pickle: the queue's own would pass tensors as shared memory, by a descriptor this
    # process must outlive the parent's read to hand over
    queue.put(pickle.dumps((rank, result)))


def in_ranks(ranks: int, fn, *args) -> list:
    """fn(group, *args) on each of `ranks` spawned gloo ranks; their results in rank order."""
    context = multiprocessing.get_context("spawn")
    queue, port = context.Queue(), free_port()
    processes = [context.Process(target=_rank_main, args=(fn, rank, ranks, port, queue, args))
                 for rank in range(ranks)]
    for process in processes:
        process.start()
    results = dict(pickle.loads(queue.get(timeout=RANK_TIMEOUT_S)) for _ in processes)
    for process in processes:
        process.join(timeout=10)
    failed = [r for r in results.values() if isinstance(r, Exception)]
    if failed:
        raise failed[0]
    return [results[rank] for rank in range(ranks)]


def _prompts(count: int, seed: int = 3) -> dict[str, list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return {f"r{i}": torch.randint(0, TINY.vocab_size - 1, (3 + 5 * i,),
                                   generator=generator).tolist() for i in range(count)}


def _model_logits(group: RankGroup, prompts: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    """Each prompt's prefill logits then 4 greedy decode steps', the model run directly."""
    model = load_model(TINY, CPU, torch.float64, shard=RankShard(group.rank, group.size))
    if group.size > 1:
        model.all_reduce = group.all_reduce
    driver, out = ModelDriver(model), {}
    for name, prompt in prompts.items():
        logits = [driver.step({name: prompt})[name]]
        for _ in range(4):
            logits.append(driver.step({name: [int(logits[-1][-1].argmax())]})[name])
        out[name] = torch.cat(logits)
    return out


def _engine_run(group: RankGroup, knobs: dict, prompts: dict[str, list[int]],
                max_tokens: int) -> dict:
    """Every prompt in at once, greedy; per step the digest (parallel/lockstep.py) and which
    requests hold planner slots."""
    config = EngineConfig(**knobs, tensor_parallel=group.size).resolve(TINY, "cpu")
    engine = Engine(TINY, config, CPU, group=group)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for name, prompt in prompts.items():
        assert engine.add_request(EngineRequest(name, prompt, params)) is None
    tokens: dict[str, list[int]] = {name: [] for name in prompts}
    steps = []
    while engine.has_work():
        outputs = engine.step()
        for output in outputs:
            tokens[output.request_id].extend(output.new_token_ids)
        holders = engine.slot_holders()
        steps.append((step_digest(engine.last_step_kind, outputs, holders), sorted(holders)))
    return {"tokens": tokens, "steps": steps, "fingerprint": engine.fingerprint,
            "displaced": engine.planning.planner.counters["displaced"]}


def test_shards_cover_every_weight_once():
    """The ranks' slices of each tensor are the whole tensor's, every element in one of them,
    where `locate` (the fingerprint's inverse of `take`) says."""
    whole = load_model(TINY, CPU, torch.float64)
    parts = [load_model(TINY, CPU, torch.float64, shard=RankShard(r, 2)) for r in range(2)]
    shard = RankShard(0, 2)
    for name, param in whole.named_parameters():
        halves = [dict(p.named_parameters())[name] for p in parts]
        rebuilt = [RankShard(r, 2).take(name, param, TINY) for r in range(2)]
        for half, expected in zip(halves, rebuilt, strict=True):
            assert torch.equal(half, expected), name
        if shard.full_shape(name, halves[0].shape, TINY) != halves[0].shape:
            assert not torch.equal(halves[0], halves[1]), name  # split, not copied
        for flat in range(0, param.numel(), 7):
            rank, local = shard.locate(name, param.shape, TINY, flat)
            assert halves[rank].reshape(-1)[local] == param.reshape(-1)[flat], (name, flat)


def test_two_ranks_give_one_ranks_logits_and_greedy_tokens():
    prompts = _prompts(3)
    reference = _model_logits(single_rank(CPU), prompts)
    rank0, rank1 = in_ranks(2, _model_logits, prompts)
    for name in prompts:
        torch.testing.assert_close(rank0[name], reference[name], rtol=0, atol=1e-9)
        assert torch.equal(rank0[name], rank1[name])  # the all-reduce leaves every rank alike
        assert torch.equal(rank0[name].argmax(-1), reference[name].argmax(-1))


def test_two_engine_ranks_serve_one_ranks_tokens_and_displace_alike():
    """Under slot pressure (widest bucket 2: 4 slots for 6 requests taking decode turns) both
    ranks displace the same requests at the same steps, and their tokens are one rank's."""
    knobs = {"dtype": "float64", "decode_buckets": (1, 2), "max_num_seqs": 6,
             "decode_order": "turns"}
    prompts = _prompts(6, seed=5)
    reference = _engine_run(single_rank(CPU), knobs, prompts, 6)
    rank0, rank1 = in_ranks(2, _engine_run, knobs, prompts, 6)
    assert rank0["tokens"] == reference["tokens"]
    # the whole model's fingerprint on every rank: the gate sees one model at any rank count
    assert rank0["fingerprint"] == rank1["fingerprint"] == reference["fingerprint"]
    assert rank0["steps"] == rank1["steps"] == reference["steps"]
    assert rank0["displaced"] == rank1["displaced"] == reference["displaced"] > 0


@pytest.mark.parametrize("kernels", [{"decode_gemm": "fused"}, {"fused_decode": "full"}],
                         ids=["gemm-prologues", "full"])
def test_two_ranks_on_the_triton_decode_kernels_serve_one_ranks_tokens(kernels):
    """The decode kernels a GPU runs (interpreted here) at a rank's head counts: the fused
    GDN layer and attention prologue, and the skinny GEMM with its prologues, whose
    row-parallel outputs (split-K partials) are all-reduced; or fused_decode=full, whose
    attention combines and gates in one kernel a rank while the add + norm after a
    row-parallel projection waits for the all-reduce (the epilogues are off under ranks)."""
    knobs = {"dtype": "float64", "attention_backend": "triton", "decode_buckets": (1, 2),
             "max_num_seqs": 2, **kernels}
    prompts = _prompts(2, seed=9)
    reference = _engine_run(single_rank(CPU), knobs, prompts, 4)
    rank0, rank1 = in_ranks(2, _engine_run, knobs, prompts, 4)
    assert rank0["tokens"] == reference["tokens"]
    assert rank0["steps"] == rank1["steps"] == reference["steps"]


def _slot_history(release_after_commit: bool) -> list[tuple[set[str], list[str]]]:
    """A SlotCache (4 slots) through 12 steps of 2 rows taking turns over 6 requests, one
    finishing at step 5: each step's (slot holders, requests that took slots). The finished
    request's release lands before the commit of the step that last read it, or after it."""
    from resident.planner.slots import SlotCache

    cache, turns, history = SlotCache(5), [f"r{i}" for i in range(6)], []
    for step in range(12):
        rows = turns[2 * step % len(turns):][:2]
        plan = cache.plan(rows, 2)
        finishing = step == 5 and rows[0]
        if finishing and not release_after_commit:
            slot = cache.slot_of(rows[0])
            cache.release(rows[0])
            assert slot in cache.ledger()["cooling"]  # read by the uncommitted step
        cache.committed(plan)
        if finishing:
            if release_after_commit:
                cache.release(rows[0])
            turns.remove(rows[0])
        history.append((set(cache.holders()), list(plan.new_slots)))
    return history


def _diverge(group: RankGroup) -> str | None:
    """Both ranks step once, rank 1 to another digest; rank 1's error on the next beat."""
    lockstep = Lockstep(group)
    lockstep.stepped("0123456789abcdef" if group.is_leader else "fedcba9876543210")
    if group.is_leader:
        lockstep.send(Beat())
        return None
    try:
        lockstep.receive()
    except LockstepError as error:
        return str(error)
    return "no error"


def test_a_rank_whose_step_differs_from_rank_0s_stops_with_a_clear_error():
    _, error = in_ranks(2, _diverge)
    assert error.startswith("tensor-parallel rank 1 left lockstep at step 1: rank 0 has step "
                            "1 digest 0123456789abcdef, this rank fedcba9876543210")


def test_a_release_on_either_side_of_a_commit_displaces_the_same_requests():
    """Ranks may see a finished request's release before or after the commit of the step that
    last read its slot (their threads race); slot numbers may then differ, but which requests
    hold slots and which take them must not, since every rank displaces by plan sequence and
    take order. Both orders run every step."""
    before, after = _slot_history(False), _slot_history(True)
    assert before == after
    assert any(taken for _, taken in before[6:])  # slots were displaced after the release


def _complete(server: Server, prompt: str, **sampling) -> list[int]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "logprobs": 1, **sampling}
    status, data = run(post(server.url + "/v1/completions", body))
    assert status == 200, data
    choice = data["choices"][0]
    return [choice["text"], choice["logprobs"]["token_logprobs"]]


def test_a_served_tensor_parallel_2_answers_as_tensor_parallel_1():
    """End to end through the HTTP server: rank 0 forwards each request to rank 1, both step
    in lockstep, and the completions (greedy and seeded sampling, with logprobs) are one
    rank's. The row check runs on both ranks and reports each."""
    requests = [("hello world", {"temperature": 0}), ("the quick brown", {"temperature": 0}),
                ("sampled", {"temperature": 1.0, "seed": 7})]
    answers = []
    for ranks in (1, 2):
        server = Server("--set", "dtype=float64", "--set", f"tensor_parallel={ranks}",
                        "--set", "row_check=on").wait_ready()
        try:
            answers.append([_complete(server, prompt, **sampling)
                            for prompt, sampling in requests])
            status, rowcheck = run(get(server.url + "/debug/rowcheck"))
        finally:
            server.stop()
        assert status == 200
    one, two = answers
    for (text1, logprobs1), (text2, logprobs2) in zip(one, two, strict=True):
        assert text1 == text2
        assert logprobs1 == pytest.approx(logprobs2, abs=1e-9)
    assert [rank["steps"] for rank in rowcheck["ranks"]] == [rowcheck["steps"]] * 2
    assert rowcheck["steps"] > 0 and all(rank["mismatches"] == 0 for rank in rowcheck["ranks"])


@pytest.mark.parametrize(("value", "message"), [
    ("0", "knob tensor_parallel: must be >= 1, got 0"),
    ("3", "knob tensor_parallel: 3 does not divide num_attention_heads (4) of model 'tiny'"),
])
def test_a_bad_tensor_parallel_is_refused_naming_it(value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        EngineConfig(tensor_parallel=int(value)).resolve(TINY, "cpu")
    cli = subprocess.run([sys.executable, "-m", "resident", "serve", "tiny", "--device", "cpu",
                          "--set", f"tensor_parallel={value}"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert cli.returncode == 2
    assert message in cli.stderr


def _kill_rank_1(server: Server) -> None:
    rank1 = re.search(r"tensor-parallel rank 1 started \(pid (\d+)\)", server.log())
    os.kill(int(rank1.group(1)), signal.SIGKILL)


def test_a_rank_dead_mid_request_fails_the_server_cleanly():
    """SIGKILL rank 1 with a request in flight: the request ends with an error naming the
    rank, and the server exits 1 at once (no hang)."""
    server = Server("--set", "dtype=float64", "--set", "tensor_parallel=2").wait_ready()
    try:
        body = {"model": "tiny", "prompt": "long", "max_tokens": 3000, "temperature": 0,
                "ignore_eos": True}
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(run, post(server.url + "/v1/completions", body))
            time.sleep(1.0)
            _kill_rank_1(server)
            status, data = answer.result(timeout=30)
        assert status != 200
        assert server.process.wait(timeout=30) == 1
    finally:
        server.stop()
    assert "tensor-parallel rank 1" in json.dumps(data)


def test_a_rank_dead_while_idle_fails_the_server_cleanly():
    server = Server("--set", "dtype=float64", "--set", "tensor_parallel=2").wait_ready()
    try:
        _kill_rank_1(server)
        assert server.process.wait(timeout=30) == 1
    finally:
        server.stop()
    assert re.search(r"the engine core failed: RankDied: tensor-parallel rank 1 \(pid \d+\) "
                     r"exited with code -9", server.log())


def test_a_tensor_parallel_arm_sees_its_gpus(tmp_path):
    """The gate hands an arm of tensor_parallel=N the placement's GPU and the N-1 after it."""
    from gate.run.arms import Arm
    from gate.run.server import LaunchSpec, launch_environment

    launch = LaunchSpec("qwen3.5-9b", "cuda", (0, 1), tmp_path, tmp_path, 2, 60.0)
    visible = {name: launch_environment(Arm(name, ".", "resident", tmp_path, knobs=knobs),
                                        launch)[0]["CUDA_VISIBLE_DEVICES"]
               for name, knobs in (("tp1", {}), ("tp2", {"tensor_parallel": "2"}))}
    assert visible == {"tp1": "2", "tp2": "2,3"}


def test_each_rank_pins_its_own_share_of_the_step_cores():
    from resident.server.core import rank_cores, step_cores

    auto = EngineConfig(step_thread_cores="auto", api_core="0", tensor_parallel=2)
    assert step_cores(auto, list(range(8))) == [1, 2, 3, 4]  # two a rank
    assert [rank_cores([1, 2, 3, 4], rank, 2) for rank in (0, 1)] == [[1, 2], [3, 4]]
    assert rank_cores([1], 1, 2) == [1]  # fewer cores than ranks: they share them
