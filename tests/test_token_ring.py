"""The token ring (engine/token_ring.py, kernels/publish.py): a decode launch publishes its
tokens into pinned host slots, and the read-back takes them from there with no copy of its own.
The kernel against its torch reference (the interpreter on CPU, pinned memory and a replayed
graph on the GPU), the read-back of greedy and drawn steps (failures, kept rows), a publish the
host did not count caught, and the engine's tokens with the ring on equal to the copy's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from resident.config import EngineConfig
from resident.engine.draw import packed_drawn
from resident.engine.engine import build_engine
from resident.engine.readback import TokenReadback
from resident.engine.token_ring import HEADER_BYTES, NUM_SLOTS, TokenRing, publish_torch
from resident.model.config import load_model_config

from model_driver import run_engine, run_with_stops

TINY = load_model_config("tiny")
CPU = torch.device("cpu")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("sizes", [(9, 72, 8, 1, 144), (2048, 9, 2304)])
def test_the_kernel_publishes_as_its_reference(sizes):
    """Each publish: its bytes in slot count % 2 behind the header, the slot stamped with the
    count, the count one more (the kernel stores into pinned memory on the GPU)."""
    pytest.importorskip("triton")
    from resident.kernels.publish import publish_triton

    generator = torch.Generator().manual_seed(len(sizes))
    want = torch.zeros_like(TokenRing(CPU, 256).host)
    got = torch.zeros_like(want, pin_memory=DEVICE.type == "cuda")
    want_count = torch.zeros(1, dtype=torch.int64)
    got_count = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    for size in sizes:
        src = torch.randint(0, 256, (size,), generator=generator, dtype=torch.uint8)
        publish_torch(src, want, want_count)
        publish_triton(src.to(DEVICE), got, got_count, HEADER_BYTES, NUM_SLOTS)
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
        assert torch.equal(got, want) and int(got_count) == int(want_count)
    assert int(want_count) == len(sizes)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_replayed_graph_publishes_into_alternating_slots():
    """The graph's kernel arguments are fixed: the slot comes from the device's count, so
    replays alternate slots and stamp 0, 1, 2, ..."""
    ring = TokenRing.build("on", DEVICE, 8)
    tokens = torch.zeros(8, dtype=torch.int64, device=DEVICE)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: compiles the kernel, publishes uncounted
        ring.publish(tokens)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens += 1
        ring.publish(tokens)
    ring.reset()
    for step in range(5):
        graph.replay()
        number = ring.launched()
        torch.cuda.synchronize()
        assert ring.stamped(number)
        assert ring.views(number, 8, False)[0].tolist() == [step + 1] * 8


def test_a_published_greedy_step_is_read_from_its_slot():
    ring = TokenRing.build("on", CPU, 8)
    readback = TokenReadback(CPU, 16)
    for step in range(3):
        greedy = torch.arange(8) * 10 + step
        ring.publish(greedy)
        readback.start_published(ring, ring.launched(), 8, False, 5)
        assert readback.wait() == greedy[:5].tolist()
        assert readback.failed() == [] and readback.logprobs() is None


def test_a_published_draw_gives_its_kept_rows_tokens_and_failures():
    """A drawing step's packed bytes (tokens, then failures); the rows still live after a
    finish (kept) are taken on the host, their failures numbered among them."""
    ring = TokenRing.build("on", CPU, 8)
    readback = TokenReadback(CPU, 16)
    drawn = packed_drawn(8, CPU)
    drawn.tokens.copy_(torch.arange(100, 108))
    drawn.failed.zero_()
    drawn.failed[[2, 6]] = True
    ring.publish(drawn.packed)
    readback.start_published(ring, ring.launched(), 8, True, 8, kept=[0, 2, 3, 6])
    assert readback.wait() == [100, 102, 103, 106]
    assert readback.failed() == [1, 3]  # rows 2 and 6 of the bucket: the kept list's 1 and 3


def test_a_publish_the_host_did_not_count_fails_the_read():
    """A launch that published without being counted (or counted without publishing) would
    read another step's tokens: the stamp catches it."""
    ring = TokenRing.build("on", CPU, 4)
    readback = TokenReadback(CPU, 4)
    ring.publish(torch.arange(4))
    first = ring.launched()
    ring.publish(torch.arange(4) + 1)  # uncounted: publish 1 lands in the next slot
    ring.publish(torch.arange(4) + 2)  # publish 2 overwrites publish 0's slot
    readback.start_published(ring, first, 4, False, 4)
    with pytest.raises(RuntimeError, match="publish 0 is not in its slot"):
        readback.wait()


def test_the_knob_off_builds_no_ring_and_the_probe_leaves_both_counts_at_zero():
    assert TokenRing.build("off", CPU, 8) is None
    ring = TokenRing.build("on", CPU, 8)
    assert int(ring.count_gpu) == 0 and ring.num_launched == 0
    with pytest.raises(ValueError, match="token_ring"):
        EngineConfig(token_ring="maybe")


def _workload(count: int, seed: int) -> dict[str, tuple[list[int], int]]:
    generator = torch.Generator().manual_seed(seed)
    return {f"r{i}": (torch.randint(0, TINY.vocab_size, (int(n),), generator=generator).tolist(),
                      3 + (5 * i) % 17)
            for i, n in enumerate(torch.randint(3, 40, (count,), generator=generator))}


@pytest.mark.parametrize("planning", ["off", "auto"])
@pytest.mark.parametrize("plan_ahead", ["off", "launch"])
def test_the_engine_reads_the_same_tokens_from_the_ring_as_by_copy(planning, plan_ahead):
    """Greedy decode steps published and read from the ring give the copy's tokens, launched
    ahead or not; the ring was read (its count is the decode launches')."""
    runs, engines = {}, {}
    for ring in ("off", "on"):
        config = EngineConfig(dtype="float64", token_ring=ring, plan_ahead=plan_ahead,
                              resident_planning=planning, decode_buckets=(1, 2, 4, 8))
        engines[ring] = engine = build_engine(TINY, config, "cpu")
        runs[ring] = run_engine(engine, _workload(10, seed=2), concurrency=6)
    assert runs["on"] == runs["off"]
    assert engines["off"].ring is None
    assert engines["on"].ring.num_launched == engines["on"].stats()["steps"]["decode"] > 0


def test_rows_that_finished_on_a_stop_token_are_left_out_of_a_published_read():
    """A stop token finishes a request after its next step was launched: that step runs its
    row unsampled, and the ring's read takes only the kept rows (the copy path gathers them
    on the device)."""
    requests = _workload(6, seed=5)
    base = EngineConfig(dtype="float64", plan_ahead="launch", resident_planning="auto")
    free_run = run_engine(build_engine(TINY, base, "cpu"), requests)
    stops = {rid: tokens[len(tokens) // 2] for rid, tokens in free_run.items()
             if len(tokens) > 4}
    outputs = {}
    for ring in ("off", "on"):
        engine = build_engine(TINY, dataclasses.replace(base, token_ring=ring), "cpu")
        outputs[ring] = run_with_stops(engine, requests, stops)
        assert engine.counters["rows_after_finish"] > 0
    assert outputs["on"] == outputs["off"]
    assert any(len(outputs["on"][rid]) < len(free_run[rid]) for rid in stops)


def test_views_are_the_slots_bytes():
    ring = TokenRing.build("on", CPU, 4)
    tokens, failed = ring.views(1, 4, True)
    start = ring.slot_bytes + HEADER_BYTES
    assert tokens.ctypes.data == ring.host.data_ptr() + start
    assert failed.ctypes.data == ring.host.data_ptr() + start + 32
    assert tokens.dtype == np.int64 and failed.dtype == bool
