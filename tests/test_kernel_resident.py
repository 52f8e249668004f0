"""The resident ops' Triton kernels against their torch references (interpreter on CPU)."""

from __future__ import annotations

import functools

import torch

from resident.kernels.resident import (
    advance_lengths_ref,
    gather_rows_ref,
    scatter_cells_ref,
)
from resident.kernels.resident_triton import (
    advance_lengths_triton,
    gather_rows_triton,
    scatter_cells_triton,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PAGE, SPAN, NUM_ROWS = 4, 40, 9
LENGTH, OFFSET, STATE, START = 0, 1, 2, 3
COLS = START + SPAN + 1  # narrow cells, one span, the trash cell


def random_store(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    store = torch.randint(1, 500, (NUM_ROWS, COLS), generator=generator)
    store[:, LENGTH] = torch.randint(0, PAGE * SPAN, (NUM_ROWS,), generator=generator)
    store[0] = 0  # the sink
    return store.to(DEVICE)


def test_scatter_matches_the_reference():
    store = random_store(0)
    cells = torch.tensor([[3, 5, 77], [1, LENGTH, 9], [8, START + 39, 4], [0, COLS - 1, 0],
                          [0, COLS - 1, 0]], device=DEVICE)
    expected = store.clone()
    scatter_cells_ref(expected, cells)
    scatter_cells_triton(store, cells)
    assert torch.equal(store, expected)


def test_gather_matches_the_reference_including_padding_and_a_narrow_width():
    store = random_store(1)
    slot_ids = torch.tensor([4, 2, 7, 0, 0], device=DEVICE)  # two padding rows on the sink
    for width in (SPAN, 13):
        store[:, LENGTH] = store[:, LENGTH] % (width * PAGE)
        store[0] = 0
        outputs = []
        # the engine's block, and blocks of 16 columns: several programs a row, the last
        # one's columns partly past the width
        gathers = (gather_rows_ref, gather_rows_triton,
                   functools.partial(gather_rows_triton, block=16))
        for gather in gathers:
            wide = torch.full((5, SPAN + 7), -1, dtype=torch.int32, device=DEVICE)
            buffers = [wide[:, :width]] + [torch.full((5,), -1, device=DEVICE) for _ in range(3)]
            gather(store, slot_ids, LENGTH, OFFSET, STATE, START, width, PAGE, *buffers)
            outputs.append([wide] + buffers[1:])
        for triton_outputs in outputs[1:]:
            for got, expected in zip(triton_outputs, outputs[0], strict=True):
                assert torch.equal(got, expected)


def test_advance_skips_the_sink():
    store = random_store(2)
    slot_ids = torch.tensor([5, 1, 0, 0], device=DEVICE)
    expected = store.clone()
    advance_lengths_ref(expected, slot_ids, [LENGTH])
    advance_lengths_triton(store, slot_ids, torch.tensor([LENGTH], device=DEVICE))
    assert torch.equal(store, expected)
    assert store[0].eq(0).all()
