"""The rows' argmax on Triton (kernels/argmax.py) against torch.argmax: the interpreter on CPU,
the 248k vocabulary on the GPU. The same ids, ties and NaNs included."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from resident.kernels.argmax import RowsArgmax

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _logits(rows: int, vocab: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=generator).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, vocab", [(1, 300), (5, 1000), (3, 64)])
def test_matches_torch_argmax(rows, vocab, dtype):
    logits = _logits(rows, vocab, dtype, rows * vocab)
    assert torch.equal(RowsArgmax(block=64)(logits), logits.argmax(dim=-1))


def test_ties_break_to_the_first_id_within_and_across_blocks():
    logits = torch.zeros(4, 300, device=DEVICE)
    logits[0, [70, 5, 290]] = 3.0  # blocks 1, 0, 4: the first block's
    logits[1, [130, 129]] = 2.0  # one block: the lower id
    logits[2, [64, 250]] = 1.0  # the first id of block 1, and block 3
    logits[3] = float("-inf")  # nothing above -inf: id 0
    got = RowsArgmax(block=64)(logits)
    assert got.tolist() == [5, 129, 64, 0] == logits.argmax(dim=-1).tolist()


def test_a_nan_ranks_first_as_in_torch_and_never_answers_past_the_vocabulary():
    logits = _logits(3, 200, torch.float32, 1)
    logits[0, 150] = float("nan")  # the row's id, as torch's
    logits[1, 40] = float("nan")
    logits[1, 170] = float("nan")  # the first NaN
    logits[2] = float("nan")  # every id NaN: id 0
    got = RowsArgmax(block=64)(logits)
    assert got.tolist() == [150, 40, 0] == logits.argmax(dim=-1).tolist()


def test_rows_of_a_wider_buffer_and_repeated_calls_at_other_row_counts():
    """A decode step's logits are the first rows of a fixed buffer; the meeting counters are
    left at zero by each launch, so the next (another row count, the same kernel) is right."""
    buffer = _logits(8, 260, torch.float32, 2)
    argmax = RowsArgmax(block=32)
    for rows in (8, 3, 8, 1):
        view = buffer[:rows, :250]  # rows 260 apart
        assert torch.equal(argmax(view), view.argmax(dim=-1))


def test_refuses_logits_strided_along_the_vocabulary_and_a_bad_block():
    with pytest.raises(ValueError, match="contiguous along the vocabulary"):
        RowsArgmax()(torch.zeros(64, 4, device=DEVICE).T)
    with pytest.raises(ValueError, match="power of two"):
        RowsArgmax(block=48)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 16, 64, 256])
@pytest.mark.parametrize("pdl", [False, True])
def test_matches_torch_argmax_at_the_real_vocabulary_gpu(rows, pdl):
    from resident.kernels.pdl import pdl_available

    if pdl and not pdl_available(torch.device("cuda")):
        pytest.skip("no PDL on this GPU")
    logits = torch.randn(rows, 248320, device="cuda").mul(3).to(torch.bfloat16)
    # bf16 of randn * 3 holds many equal values: rounded to 0.5 each row has ties at its top
    tied = logits.float().mul(2).round().div(2).to(torch.bfloat16)
    # the compiled max skips a NaN where the interpreter's (numpy) takes it: only here can the
    # kernel's NaN rule fail
    poisoned = logits.clone()
    poisoned[:, 1234] = float("nan")
    poisoned[-1] = float("nan")
    argmax = RowsArgmax(pdl=pdl)
    for case in (logits, tied, poisoned):
        assert torch.equal(argmax(case), case.argmax(dim=-1))
