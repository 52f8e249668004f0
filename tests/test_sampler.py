"""The sampler with a decode graph's argmax: greedy rows take it as computed, sampled rows draw
over the logits, and the graph's own output is never written."""

from __future__ import annotations

import torch

from resident.engine.sampler import Sampler
from resident.engine.types import SamplingParams

GREEDY = SamplingParams(max_tokens=4)
HOT = SamplingParams(max_tokens=4, temperature=5.0, seed=1)


def test_greedy_rows_take_the_graphs_argmax():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    greedy = logits.argmax(dim=-1)
    tokens = Sampler(torch.device("cpu"), 0).sample(logits, [("a", GREEDY), ("b", GREEDY)],
                                                     greedy)
    assert tokens.tolist() == greedy[:2].tolist()


def test_a_sampled_row_draws_and_leaves_the_graphs_output_alone():
    logits = torch.zeros(2, 1000)  # flat: a draw at temperature 5 almost never gives token 0
    greedy = logits.argmax(dim=-1)
    before = greedy.clone()
    sampler = Sampler(torch.device("cpu"), 0)
    sampler.add("hot", HOT)
    tokens = sampler.sample(logits, [("cold", GREEDY), ("hot", HOT)], greedy)
    assert tokens[0] == 0 and tokens[1] != 0
    assert torch.equal(greedy, before), "the sampler wrote into the graph's argmax"
