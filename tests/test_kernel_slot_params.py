"""kernels/slot_params.py (the interpreter on CPU, compiled on the GPU) against SamplingSlots'
torch references: a resident decode step's rows' sampling parameters gathered by slot, and their
slots' token indices advanced, padding rows on the sink included; rows written whole into their
slots from one staged block."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from resident.engine.sampling_state import (
    FLOATS_AT,
    INDEX_COL,
    ParamColumns,
    RowColumns,
    SamplingSlots,
)
from resident.kernels.slot_params import put_triton, take_triton

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _slots(slot_ids: list[int], num_slots: int = 9, seed: int = 0) -> SamplingSlots:
    """A table of random parameters (the reference's torch ops: built for the CPU)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.tensor(slot_ids, dtype=torch.int64)
    slots = SamplingSlots(num_slots, len(slot_ids), ids, torch.device("cpu"))
    slots.table.floats_gpu.copy_(torch.rand(num_slots, 3, generator=generator))
    slots.table.ints_gpu.copy_(torch.randint(0, 2**40, (num_slots, 3), generator=generator))
    return slots


@pytest.mark.parametrize("slot_ids", [[3], [4, 1, 7, 2], [5, 8, 0, 0, 0, 0, 0, 0]])
def test_take_gathers_by_slot_and_advances_each_rows_index(slot_ids):
    """Slot 0 is the sink: padding rows share it, and it advances once for each of them."""
    reference = _slots(slot_ids)
    table_floats = reference.table.floats_gpu.clone().to(DEVICE)
    table_ints = reference.table.ints_gpu.clone().to(DEVICE)
    want = ParamColumns(len(slot_ids) + 2, torch.device("cpu"))
    reference.take(want, len(slot_ids))
    got = ParamColumns(len(slot_ids) + 2, DEVICE)
    take_triton(table_floats, table_ints, torch.tensor(slot_ids, device=DEVICE),
                got.floats_gpu, got.ints_gpu, INDEX_COL)
    real = [row for row, slot in enumerate(slot_ids) if slot != 0]  # a padding row's is unread
    assert torch.equal(got.floats_gpu[real].cpu(), want.floats_gpu[real])
    assert torch.equal(got.ints_gpu[real].cpu(), want.ints_gpu[real])
    assert torch.equal(table_floats.cpu(), reference.table.floats_gpu)
    assert torch.equal(table_ints.cpu(), reference.table.ints_gpu)
    before = _slots(slot_ids).table.ints_gpu[:, INDEX_COL]
    advanced = reference.table.ints_gpu[:, INDEX_COL] - before
    assert advanced.tolist() == [slot_ids.count(slot) for slot in range(9)]


@pytest.mark.parametrize("slots", [[3], [4, 1, 7, 2], [0, 8, 5]])
def test_put_writes_each_staged_row_whole_into_its_slot(slots):
    """The reference's write lands each row's values in its slot and leaves the others; the
    kernel, given the block the reference staged, leaves the same table."""
    reference = _slots([0] * len(slots))
    before_floats = reference.table.floats_gpu.clone()
    before_ints = reference.table.ints_gpu.clone()
    rows = RowColumns([(0.5 + i, 0.25 * i, 1e-3 * i) for i in range(len(slots))],
                      [(i + 1, -(2**62) + 3 * i, 7 * i) for i in range(len(slots))])
    table_floats, table_ints = before_floats.clone().to(DEVICE), before_ints.clone().to(DEVICE)
    reference.write(slots, rows)
    others = [slot for slot in range(9) if slot not in slots]
    assert torch.equal(reference.table.floats_gpu[slots], torch.tensor(rows.floats))
    assert torch.equal(reference.table.ints_gpu[slots], torch.tensor(rows.ints))
    assert torch.equal(reference.table.floats_gpu[others], before_floats[others])
    assert torch.equal(reference.table.ints_gpu[others], before_ints[others])
    put_triton(reference._staged_gpu[:len(slots)].to(DEVICE), table_floats, table_ints,
               FLOATS_AT)
    assert torch.equal(table_floats.cpu(), reference.table.floats_gpu)
    assert torch.equal(table_ints.cpu(), reference.table.ints_gpu)
