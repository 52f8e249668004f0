"""The Triton paged KV write against write_kv_ref: the interpreter on CPU, bf16 on the GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from resident.kernels.attention import write_kv_ref
from resident.kernels.kv_write import write_kv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(num_heads: int, head_dim: int, dtype: torch.dtype, seed: int):
    generator = torch.Generator().manual_seed(seed)
    num_pages, page = 6, 4
    kv = torch.randn(num_pages, 2, page, num_heads, head_dim, generator=generator).to(dtype)
    width = num_heads * head_dim
    # key packed, value a slice of a wider fused row, as the attention layer hands them over
    key = torch.randn(5, num_heads, head_dim, generator=generator)
    fused = torch.randn(5, 3 * width, generator=generator)
    value = fused.to(dtype)[:, width:2 * width].view(5, num_heads, head_dim)
    loc = torch.tensor([9, 10, 23, 4, 0])  # the last row pads onto the sink page 0
    return kv.to(DEVICE), key.to(DEVICE, dtype), value.to(DEVICE, dtype), loc.to(DEVICE)


@pytest.mark.parametrize("num_heads, head_dim", [(2, 8), (3, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(num_heads, head_dim, dtype):
    kv, key, value, loc = _case(num_heads, head_dim, dtype, num_heads * head_dim)
    want = kv.clone()
    write_kv_ref(want, key, value, loc)
    write_kv(kv, key, value, loc)
    assert torch.equal(kv, want)


def test_refuses_unpacked_heads_and_casts():
    kv, key, value, loc = _case(2, 8, torch.float32, 0)
    with pytest.raises(ValueError, match="value heads packed"):
        write_kv(kv, key, value.transpose(1, 2).contiguous().transpose(1, 2), loc)
    with pytest.raises(ValueError, match="without a cast"):
        write_kv(kv, key.double(), value, loc)


@pytest.mark.gpu
def test_matches_reference_at_real_shapes_gpu():
    num_pages, page, num_heads, head_dim = 40, 16, 2, 256
    kv = torch.randn(num_pages, 2, page, num_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    fused = torch.randn(9, 6 * num_heads * head_dim, device="cuda", dtype=torch.bfloat16)
    key = torch.randn(9, num_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    value = fused[:, :num_heads * head_dim].view(9, num_heads, head_dim)
    loc = torch.randperm(num_pages * page, device="cuda")[:9]
    want = kv.clone()
    write_kv_ref(want, key, value, loc)
    write_kv(kv, key, value, loc)
    assert torch.equal(kv, want)
