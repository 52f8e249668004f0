"""A minimal driver for the model in tests: pages and slots handed out in order, one call per step.

The engine's scheduler and pools do this for real; the tests of the model itself need only enough
bookkeeping to feed StepMeta correctly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from resident.model.cache import ModelCache
from resident.model.config import load_model_config
from resident.model.step import build_step_meta
from resident.model.weights import load_model, weights_fingerprint


@dataclass
class Sequence:
    slot: int
    pages: list[int] = field(default_factory=list)
    length: int = 0


class ModelDriver:
    def __init__(self, model, num_pages: int = 256, page_size: int = 16, num_slots: int = 16,
                 device: str = "cpu"):
        self.model = model
        self.device = device
        dtype = next(model.parameters()).dtype
        self.cache = ModelCache.allocate(model.config, num_pages, page_size, num_slots, dtype,
                                         device)
        self.page_size = page_size
        self.next_page, self.next_slot = 1, 1  # 0 is the sink of both
        self.seqs: dict[str, Sequence] = {}

    def _seq(self, name: str) -> Sequence:
        if name not in self.seqs:
            self.seqs[name] = Sequence(slot=self.next_slot)
            self.cache.reset_slot(self.next_slot)
            self.next_slot += 1
        return self.seqs[name]

    def step(self, chunks: dict) -> dict[str, torch.Tensor]:
        """Runs one step where each named sequence brings `tokens`; returns all-token logits."""
        rows, ids = [], []
        for name, tokens in chunks.items():
            seq = self._seq(name)
            need = -(-(seq.length + len(tokens)) // self.page_size)
            while len(seq.pages) < need:
                seq.pages.append(self.next_page)
                self.next_page += 1
            rows.append((seq.length, len(tokens), list(seq.pages), seq.slot))
            ids.extend(tokens)
        meta = build_step_meta(rows, self.page_size, self.device)
        with torch.no_grad():
            input_ids = torch.tensor(ids, dtype=torch.int64, device=self.device)
            hidden = self.model(input_ids, meta, self.cache)
            logits = self.model.compute_logits(hidden)
        out, start = {}, 0
        for name, tokens in chunks.items():
            out[name] = logits[start:start + len(tokens)]
            self.seqs[name].length += len(tokens)
            start += len(tokens)
        return out


def greedy_alone(model, prompt: list[int], max_tokens: int) -> list[int]:
    """The model's greedy tokens for one prompt run by itself: the reference the engine's
    batched, chunked, offloaded runs must reproduce."""
    driver = ModelDriver(model)
    logits = driver.step({"r": prompt})["r"]
    tokens: list[int] = []
    for _ in range(max_tokens):
        tokens.append(int(logits[-1].argmax()))
        logits = driver.step({"r": [tokens[-1]]})["r"]
    return tokens


def run_engine(engine, requests: dict[str, tuple[list[int], int]], max_steps: int = 100_000,
               concurrency: int | None = None) -> dict[str, list[int]]:
    """Greedy tokens of each request (prompt, max_tokens), stepping the engine in process; at
    most `concurrency` requests in it at once (all of them when None)."""
    from resident.engine.types import EngineRequest, SamplingParams

    pending = list(requests.items())
    outputs: dict[str, list[int]] = {rid: [] for rid in requests}
    active = 0
    for _ in range(max_steps):
        while pending and (concurrency is None or active < concurrency):
            rid, (prompt, max_tokens) = pending.pop(0)
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
            assert engine.add_request(EngineRequest(rid, prompt, params)) is None
            active += 1
        if not engine.has_work():
            return outputs
        for out in engine.step():
            outputs[out.request_id].extend(out.new_token_ids)
            active -= out.finished
    raise AssertionError("engine did not finish")


def run_with_stops(engine, requests: dict[str, tuple[list[int], int]],
                   stops: dict[str, int]) -> dict[str, list[int]]:
    """Each request's greedy tokens (requests: id -> (prompt, max_tokens)), all added at once,
    a request in `stops` stopping at its token; the engine stepped until it drains."""
    from resident.engine.types import EngineRequest, SamplingParams

    for rid, (prompt, max_tokens) in requests.items():
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                                stop_token_ids=(stops[rid],) if rid in stops else ())
        assert engine.add_request(EngineRequest(rid, prompt, params)) is None
    outputs: dict[str, list[int]] = {}
    while engine.has_work():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
    return outputs


def run_sampled(engine, requests: dict, concurrency: int) -> dict[str, list[int]]:
    """Each request's tokens (requests: id -> (prompt, SamplingParams)), `concurrency` in the
    engine at a time, in arrival order; a request that fails fails the test."""
    from resident.engine.types import EngineRequest

    pending, outputs = list(requests.items()), {rid: [] for rid in requests}
    running: set[str] = set()
    while pending or running:
        while pending and len(running) < concurrency:
            rid, (prompt, params) = pending.pop(0)
            engine.add_request(EngineRequest(rid, prompt, params))
            running.add(rid)
        for out in engine.step():
            outputs[out.request_id] += out.new_token_ids
            assert out.error is None, out.error
            if out.finished:
                running.discard(out.request_id)
    return outputs


def save_tiny_checkpoint(directory: Path) -> str:
    """Writes tiny's random weights into `directory` as a transformers-style checkpoint
    (model.safetensors, config.json); returns their fingerprint."""
    config = load_model_config("tiny")
    model = load_model(config, "cpu", torch.float32)
    tensors = {"model.language_model." + name[len("model."):]: p.detach().clone()
               for name, p in model.named_parameters()}
    save_file(tensors, str(directory / "model.safetensors"))
    hf = {
        "model_type": "qwen3_5",
        "tie_word_embeddings": True,
        "text_config": {
            "model_type": "qwen3_5_text",
            **{k: getattr(config, k) for k in (
                "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim",
                "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                "linear_value_head_dim", "linear_conv_kernel_dim", "max_position_embeddings",
                "rms_norm_eps")},
            "layer_types": list(config.layer_types),
            "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta,
                                "partial_rotary_factor": config.partial_rotary_factor},
            "eos_token_id": 511,
        },
    }
    (directory / "config.json").write_text(json.dumps(hf))
    return weights_fingerprint(model)
