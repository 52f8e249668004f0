"""Sampler: greedy at temperature 0; otherwise temperature, top-k and top-p, drawn from a
per-request generator seeded from the request's seed (or the engine's), so the same seed over the
same logits gives the same tokens. Rows whose request asked for logprobs also get the sampled
token's log-probability and the top k, from the raw logits' log-softmax, read back with the
tokens; a step where no row asked computes and copies nothing more.

A draw is an exponential race (argmax of probs / Exp(1), a softmax sample) rather than
torch.multinomial, which raises on probabilities that are NaN or sum to 0 (a temperature that
rounds to zero in float32) and, on CUDA, kills the device's context with them: a race over such
probabilities still picks a token, so one request's parameters cannot take the engine down. Any
other error in one row's draw fails that request alone (`failures`)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import NamedTuple

import torch

from resident.engine.types import MAX_LOGPROBS, SamplingParams, TokenLogprobs


class StepLogits(NamedTuple):
    """What a step's forward gives the sampler: [rows, vocab] logits and, from a decode
    bucket's graph, each row's argmax computed inside it ([rows] int64; None for other steps):
    greedy rows then cost the host no launch."""

    logits: torch.Tensor
    greedy: torch.Tensor | None = None


@dataclass(frozen=True)
class StepLogprobs:
    """The logprobs a step's rows asked for, still on the device."""

    rows: tuple[int, ...]  # the asking rows' indices among the step's sampling rows
    counts: tuple[int, ...]  # how many top logprobs each asked
    values: torch.Tensor  # [len(rows), 1 + max(counts)] float64: the sampled token's, the top
    ids: torch.Tensor  # [len(rows), max(counts)] int64: the top tokens, most likely first


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

    def sample(self, logits: torch.Tensor, rows: list[tuple[str, SamplingParams]],
               greedy: torch.Tensor | None = None) -> torch.Tensor:
        """logits: [>= len(rows), V]; greedy: their argmax if the step computed it ([>= len(rows)],
        left as it is). Returns [len(rows)] tokens on the logits' device, not yet read back (the
        caller's one host sync per step). A row whose draw failed keeps its greedy token and is
        named in `failures` (request id -> why) until the next call."""
        self.failures: dict[str, str] = {}
        drawn = any(params.temperature > 0 for _, params in rows)
        if greedy is None:
            tokens = logits[:len(rows)].argmax(dim=-1)
        else:
            tokens = greedy[:len(rows)].clone() if drawn else greedy[:len(rows)]
        if not drawn:
            return tokens
        for index, (request_id, params) in enumerate(rows):
            if params.temperature > 0:
                try:
                    tokens[index] = self._draw(logits[index], params,
                                               self._generators[request_id])
                except Exception as error:  # noqa: BLE001 - this row's failure, not the step's
                    self.failures[request_id] = f"sampling failed: {type(error).__name__}"
        return tokens

    @staticmethod
    def logprobs(logits: torch.Tensor, tokens: torch.Tensor,
                 rows: list[tuple[str, SamplingParams]]) -> StepLogprobs | None:
        """The log-probabilities of the rows that asked for them (None when none did): each
        row's sampled token's and its top k, on the device, not yet read back."""
        asked = [index for index, (_, params) in enumerate(rows) if params.logprobs is not None]
        if not asked:
            return None
        counts = tuple(rows[index][1].logprobs for index in asked)
        # a list index is copied to the device; when every row asked, a slice needs no copy
        select = slice(0, len(rows)) if len(asked) == len(rows) else asked
        # fp32 at least: bf16 logits would round the log-softmax to 2-3 digits
        precision = torch.promote_types(logits.dtype, torch.float32)
        logprobs = torch.log_softmax(logits[select].to(precision), dim=-1)
        top_values, top_ids = logprobs.topk(max(counts), dim=-1)
        sampled = logprobs.gather(1, tokens[select][:, None])
        values = torch.cat([sampled, top_values], dim=1).to(torch.float64)
        return StepLogprobs(tuple(asked), counts, values, top_ids)

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
    sources), `wait` blocks until then and returns the tokens. On CPU the copy is done at once.
    The logprobs some rows asked for ride the same copy and event (`logprobs` after `wait`)."""

    def __init__(self, device: torch.device, max_rows: int) -> None:
        cuda = device.type == "cuda"
        self._host = torch.zeros(max_rows, dtype=torch.int64, pin_memory=cuda)
        # flat, so a step's [rows, width] block is a contiguous view: a non_blocking copy into
        # a strided view of pinned memory would go through an unpinned temporary
        self._values_host = torch.zeros(max_rows * (1 + MAX_LOGPROBS), dtype=torch.float64,
                                        pin_memory=cuda)
        self._ids_host = torch.zeros(max_rows * MAX_LOGPROBS, dtype=torch.int64,
                                     pin_memory=cuda)
        self._event = torch.cuda.Event() if cuda else None
        self._count = 0
        self._logprobs: StepLogprobs | None = None

    def start(self, tokens: torch.Tensor, logprobs: StepLogprobs | None = None) -> None:
        self._count = tokens.shape[0]
        self._host[:self._count].copy_(tokens, non_blocking=True)
        self._logprobs = logprobs
        if logprobs is not None:
            self._values_view(logprobs).copy_(logprobs.values, non_blocking=True)
            self._ids_view(logprobs).copy_(logprobs.ids, non_blocking=True)
        self.mark()

    def _values_view(self, logprobs: StepLogprobs) -> torch.Tensor:
        rows, width = logprobs.values.shape
        return self._values_host[:rows * width].view(rows, width)

    def _ids_view(self, logprobs: StepLogprobs) -> torch.Tensor:
        rows, width = logprobs.ids.shape
        return self._ids_host[:rows * width].view(rows, width)

    def mark(self) -> None:
        if self._event is not None:
            self._event.record()

    def wait(self) -> list[int]:
        if self._event is not None:
            self._event.synchronize()
        return self._host[:self._count].tolist()

    def logprobs(self) -> list[TokenLogprobs | None] | None:
        """After `wait`: the logprobs of each row of the step `start` was given (None for a row
        that asked for none), or None when no row asked."""
        step = self._logprobs
        if step is None:
            return None
        values, ids = self._values_view(step).tolist(), self._ids_view(step).tolist()
        rows: list[TokenLogprobs | None] = [None] * self._count
        for index, row in enumerate(step.rows):
            count = step.counts[index]
            top = tuple(zip(ids[index][:count], values[index][1:1 + count], strict=True))
            rows[row] = TokenLogprobs(values[index][0], top)
        return rows
