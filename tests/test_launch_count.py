"""A decode step's launches counted on CPU, so a change that quietly undoes a fusion fails here
before an H200 profile would show it.

One step of a 1-row bucket of the tiny model (6 GDN layers, 2 attention layers) on the Triton
decode kernels (interpreted), counted by kind: each Triton launch, each DenseOps call (one
Inductor kernel on CUDA) and each torch GEMM, embedding and argmax (cuBLAS and torch kernels).
Issue 33 asks for at most 5 kernels a layer: a GDN layer is 7 with `fused_decode=auto` and 5
with `full`, an attention layer 9 and 6. The H200's profile of the 0.8B step counted 223
where this count gave 214 for `auto` before the MLP's silu-mul moved into its gate_up and
the output gate into the attention's combine (184 now; cuBLAS and the graph add a few of
their own).
"""

from __future__ import annotations

import collections
import dataclasses
import functools

import pytest
import torch
from torch.overrides import TorchFunctionMode

pytest.importorskip("triton")

from triton.runtime import interpreter  # noqa: E402

from resident.backends.triton_decode import DecodeFusion, TritonDecode  # noqa: E402
from resident.model.cache import ModelCache  # noqa: E402
from resident.model.config import load_model_config  # noqa: E402
from resident.model.dense import DenseOps  # noqa: E402
from resident.model.step import build_step_meta  # noqa: E402
from resident.model.weights import load_model  # noqa: E402

TINY = load_model_config("tiny")
TORCH_LAUNCHES = ("linear", "embedding", "argmax")


class _TorchLaunches(TorchFunctionMode):
    def __init__(self, counts: collections.Counter) -> None:
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in TORCH_LAUNCHES:
            self.counts[f"torch {name}"] += 1
        return func(*args, **(kwargs or {}))


def _counted_dense(counts: collections.Counter) -> DenseOps:
    def counted(name, function):
        @functools.wraps(function)
        def call(*args, **kwargs):
            counts[f"dense {name}"] += 1
            return function(*args, **kwargs)
        return call
    plain = DenseOps()
    return DenseOps(**{field.name: counted(field.name, getattr(plain, field.name))
                       for field in dataclasses.fields(DenseOps)})


def _decode_step_launches(fusion: DecodeFusion, monkeypatch) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    run = interpreter.InterpretedFunction.run

    def counted_run(self, *args, **kwargs):
        counts[f"triton {self.fn.__name__}"] += 1
        return run(self, *args, **kwargs)

    model = load_model(TINY, "cpu", torch.float32, dense=_counted_dense(counts))
    ops = TritonDecode((1,), fusion=fusion).ops(1)
    cache = ModelCache.allocate(TINY, 4, 16, 2, torch.float32, "cpu")
    with torch.inference_mode():
        model(torch.zeros(5, dtype=torch.long), build_step_meta([(0, 5, [1], 1)], 16, "cpu"),
              cache)
        monkeypatch.setattr(interpreter.InterpretedFunction, "run", counted_run)
        counts.clear()
        with _TorchLaunches(counts):
            meta = build_step_meta([(5, 1, [1], 1)], 16, "cpu")
            model.compute_logits(model(torch.zeros(1, dtype=torch.long), meta, cache, ops)
                                 ).argmax(-1)
    return counts


# each layer's opening and closing projections, lm_head, the embedding (under fused_decode
# one Triton gather, torch's embedding before), the argmax
STEP = {"torch linear": 2 * 8 + 1, "triton _embed_kernel": 1, "torch argmax": 1}


def test_auto_decode_step_launches(monkeypatch):
    """fused_decode=auto: the fused GDN layer and attention prologue, the MLP's gate_up with
    its silu-mul (a Triton GEMV, cuBLAS's before), the output gate in the attention's combine;
    norms and the combine apart (64 launches)."""
    assert _decode_step_launches(DecodeFusion(True, False), monkeypatch) == {
        **STEP, "torch linear": 1 + 8, "dense rms_norm": 1, "dense add_rms_norm": 16,
        "triton _gemv_kernel": 24, "triton _gdn_layer_decode_kernel": 6,
        "triton _attention_prologue_kernel": 2, "triton _split_kernel": 2,
        "triton _combine_kernel": 2}


def test_full_fused_decode_step_launches(monkeypatch):
    """fused_decode=full: no norm after the first, no silu-mul, gate or combine of their own
    (46 launches: a GDN layer 5, an attention layer 6)."""
    assert _decode_step_launches(DecodeFusion(True, False, True), monkeypatch) == {
        **STEP, "dense rms_norm": 1, "triton _gemv_kernel": 16,
        "triton _gdn_layer_decode_kernel": 6, "triton _attention_prologue_kernel": 2,
        "triton _split_kernel": 2}
