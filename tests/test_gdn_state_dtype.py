"""gdn_state_dtype: the GDN recurrent state stored in bf16 (the kernels' tests hold each kernel
to its reference on a bf16 pool). Here the knob resolves and sizes the pools it names, and an
engine of the tiny model on CPU keeps its state, snapshots and swaps in bf16 end to end: its
states stay within bf16 rounding of a float64 engine's, and the prefix cache restores them bit
for bit."""

from __future__ import annotations

import pytest
import torch
from test_prefix_cache import PAGE, _restored_states, passes, shared_prompts

from resident.config import EngineConfig, snapshot_bytes
from resident.engine.engine import build_engine
from resident.info import gdn_conv_bytes, gdn_recurrent_bytes
from resident.model.config import load_model_config

from model_driver import run_engine

TINY = load_model_config("tiny")
MODEL = load_model_config("qwen3.5-0.8b")


def test_auto_is_float32_or_the_float64_models_own():
    assert EngineConfig().resolve(MODEL, "cuda").gdn_state_dtype == "float32"
    assert EngineConfig(dtype="float64").resolve(TINY, "cpu").gdn_state_dtype == "float64"
    bf16 = EngineConfig(gdn_state_dtype="bfloat16").resolve(MODEL, "cuda")
    assert bf16.gdn_state_dtype == "bfloat16" and bf16.is_resolved
    assert bf16.resolve(MODEL, "cuda") == bf16


@pytest.mark.parametrize(("knobs", "device"), [({"gdn_state_dtype": "float16"}, "cpu"),
                                               ({"gdn_state_dtype": "float64"}, "cuda")])
def test_a_bad_state_dtype_fails_naming_the_knob(knobs, device):
    with pytest.raises(ValueError, match="gdn_state_dtype"):
        EngineConfig(**knobs).resolve(MODEL, device)


def test_a_bf16_snapshot_holds_half_the_recurrent_state():
    """A snapshot is the conv window (the model's dtype) and the recurrent state (the knob's):
    at 0.8B 18 MiB of state becomes 9, so the same prefix_snapshot_gib holds more of them."""
    conv = gdn_conv_bytes(MODEL, 2)
    assert snapshot_bytes(MODEL, "bfloat16") == conv + gdn_recurrent_bytes(MODEL, 4)
    assert snapshot_bytes(MODEL, "bfloat16", 1, "bfloat16") == conv + gdn_recurrent_bytes(
        MODEL, 2)
    counts = {state: EngineConfig(gdn_state_dtype=state, prefix_snapshot_gib=0.5).resolve(
        MODEL, "cuda").prefix_snapshots for state in ("auto", "bfloat16")}
    assert counts == {"auto": 2**29 // snapshot_bytes(MODEL, "bfloat16"),
                      "bfloat16": 2**29 // snapshot_bytes(MODEL, "bfloat16", 1, "bfloat16")}
    assert counts["bfloat16"] > 1.9 * counts["auto"]


@pytest.fixture(scope="module")
def engines():
    """The same prompts through a float64 engine and one whose state is bf16, cache off."""
    requests = shared_prompts()
    reference = build_engine(TINY, EngineConfig(dtype="float64", prefix_cache="off"), "cpu")
    bf16 = build_engine(TINY, EngineConfig(dtype="float64", prefix_cache="off",
                                           gdn_state_dtype="bfloat16"), "cpu")
    return requests, reference, bf16


def _prefill_states(engine, prompt: list[int]) -> torch.Tensor:
    """A prompt's recurrent state after its prefill, as the engine leaves it in its slot."""
    run_engine(engine, {"probe": (prompt, 1)})  # one token: no decode step after the prefill
    slot = engine.states._free[-1]  # the slot it freed last, its state still there
    return engine.cache.recurrent[:, slot].clone()


def test_the_engines_state_is_bf16_within_its_rounding_of_float64(engines):
    requests, reference, bf16 = engines
    assert bf16.cache.recurrent.dtype == torch.bfloat16
    assert reference.cache.recurrent.dtype == torch.float64
    prompt = requests["r4"][0]  # 5 pages and more: several chunks of state carried
    want, got = _prefill_states(reference, prompt), _prefill_states(bf16, prompt)
    error = ((got.double() - want).norm() / want.norm()).item()
    assert 0 < error < 1e-2, error
    tokens = run_engine(bf16, requests)
    assert {rid: len(out) for rid, out in tokens.items()} == {
        rid: max_tokens for rid, (_, max_tokens) in requests.items()}


def test_a_hit_restores_the_bf16_snapshot_bit_for_bit(engines):
    """With the prefix cache on a bf16 engine: the snapshots are bf16, a hit's slot holds its
    snapshot exactly, and every page and slot comes back."""
    requests, _, _ = engines
    engine = build_engine(TINY, EngineConfig(
        dtype="float64", prefix_cache="on", prefix_snapshot_interval=2, row_check="on",
        gdn_state_dtype="bfloat16"), "cpu")
    assert engine.prefixes.recurrent.dtype == torch.bfloat16
    passes(engine, requests, times=2)
    restored = _restored_states(engine)
    snapshots = []
    restore = engine.prefixes.restore

    def keep_snapshot(request, hit):
        snapshots.append(engine.prefixes.recurrent[:, hit.snapshot].clone())
        restore(request, hit)

    engine.prefixes.restore = keep_snapshot
    run_engine(engine, {f"{rid}+": value for rid, value in requests.items()})
    assert len(restored) >= 7 and len(snapshots) == len(restored)
    assert all(torch.equal(recurrent, snapshot)
               for (_, _, recurrent), snapshot in zip(restored, snapshots, strict=True))
    stats = engine.stats()
    assert stats["prefix_cached_tokens"] >= 7 * PAGE
    assert engine.rowcheck_counts()["mismatches"] == 0
    assert engine.kv.num_free == engine.kv.num_pages - 1
    assert engine.states.num_free == engine.states.num_slots - 1
