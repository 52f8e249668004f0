"""Sampler: greedy at temperature 0; otherwise temperature, top-k and top-p, drawn from a
per-request generator seeded from the request's seed (or the engine's), so the same seed over the
same logits gives the same tokens.

A draw is an exponential race (argmax of probs / Exp(1), a softmax sample) rather than
torch.multinomial, which raises on probabilities that are NaN or sum to 0 (a temperature that
rounds to zero in float32) and, on CUDA, kills the device's context with them: a race over such
probabilities still picks a token, so one request's parameters cannot take the engine down. Any
other error in one row's draw fails that request alone (`failures`)."""

from __future__ import annotations

import random

import torch

from resident.engine.types import SamplingParams


class Sampler:
    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device
        self._seeds = random.Random(seed)
        self._generators: dict[str, torch.Generator] = {}
        self.failures: dict[str, str] = {}

    def add(self, request_id: str, params: SamplingParams) -> None:
        if params.temperature > 0:
            seed = params.seed if params.seed is not None else self._seeds.getrandbits(63)
            self._generators[request_id] = torch.Generator(self.device).manual_seed(seed)

    def drop(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor,
               rows: list[tuple[str, SamplingParams]]) -> torch.Tensor:
        """logits: [>= len(rows), V]; returns [len(rows)] tokens on the logits' device, not
        yet read back (the caller's one host sync per step). A row whose draw failed keeps its
        greedy token and is named in `failures` (request id -> why) until the next call."""
        self.failures: dict[str, str] = {}
        tokens = logits[:len(rows)].argmax(dim=-1)
        for index, (request_id, params) in enumerate(rows):
            if params.temperature > 0:
                try:
                    tokens[index] = self._draw(logits[index], params,
                                               self._generators[request_id])
                except Exception as error:  # noqa: BLE001 - this row's failure, not the step's
                    self.failures[request_id] = f"sampling failed: {type(error).__name__}"
        return tokens

    @staticmethod
    def _draw(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator):
        scaled = logits.float() / params.temperature
        if 0 < params.top_k < scaled.shape[-1]:
            kth = torch.topk(scaled, params.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if params.top_p < 1.0:
            sorted_logits, order = torch.sort(scaled, descending=True)
            cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
            # drop a token once the tokens before it already reach top_p; the top one stays
            drop = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= params.top_p
            scaled = scaled.scatter(0, order, sorted_logits.masked_fill(drop, float("-inf")))
        probs = torch.softmax(scaled, dim=-1)
        race = torch.empty_like(probs).exponential_(generator=generator)
        return (probs / race).argmax()


class TokenReadback:
    """A step's sampled tokens, copied to pinned host memory behind an event: `start` queues
    the copy, `mark` moves the event past what the stream took since (the next step's uploads,
    when that step launches before the read-back, so that waiting also frees their host
    sources), `wait` blocks until then and returns the tokens. On CPU the copy is done at once."""

    def __init__(self, device: torch.device, max_rows: int) -> None:
        cuda = device.type == "cuda"
        self._host = torch.zeros(max_rows, dtype=torch.int64, pin_memory=cuda)
        self._event = torch.cuda.Event() if cuda else None
        self._count = 0

    def start(self, tokens: torch.Tensor) -> None:
        self._count = tokens.shape[0]
        self._host[:self._count].copy_(tokens, non_blocking=True)
        self.mark()

    def mark(self) -> None:
        if self._event is not None:
            self._event.record()

    def wait(self) -> list[int]:
        if self._event is not None:
            self._event.synchronize()
        return self._host[:self._count].tolist()
