"""The decode step's token embedding as one Triton gather (kernels/embedding.py) against
torch's embedding, ModelOps.embed's reference (interpreter on CPU, at tiny sizes)."""

from __future__ import annotations

import pytest
import torch

from resident.kernels.embedding import embedding
from resident.model.ops import embedding_ref_op

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("block", [1024, 16])  # one program a row; several, the last partial
def test_the_gather_equals_torchs_embedding(dtype, block):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(50, 40, generator=generator).to(DEVICE, dtype)
    ids = torch.tensor([3, 49, 0, 3, 17], device=DEVICE)  # a repeated id and both ends
    assert torch.equal(embedding(weight, ids, block), embedding_ref_op(weight, ids))


def test_no_rows_and_bad_ids_are_named():
    weight = torch.randn(8, 4, device=DEVICE)
    assert embedding(weight, torch.empty(0, dtype=torch.long, device=DEVICE)).shape == (0, 4)
    with pytest.raises(ValueError, match="ids \\[T\\]"):
        embedding(weight, torch.zeros(2, 2, dtype=torch.long, device=DEVICE))
