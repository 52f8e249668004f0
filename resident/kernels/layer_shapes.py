"""What the fused decode kernels know of a layer's shapes and weights, apart from the kernels
themselves: the model imports these, and a CPU install (no triton) must be able to."""

from __future__ import annotations

from typing import NamedTuple

import torch


class AttentionHeads(NamedTuple):
    num_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def split(self) -> list[int]:
        """The qkv projection's parts: query and gate interleaved by head, key, value."""
        kv = self.num_kv_heads * self.head_dim
        return [2 * self.num_heads * self.head_dim, kv, kv]


class GdnLayerWeights(NamedTuple):
    """What a GDN layer brings to its decode, besides the in_proj output and the pools."""

    conv_weight: torch.Tensor  # [C, W]
    a_log: torch.Tensor  # [Hv]
    dt_bias: torch.Tensor  # [Hv]
    norm_weight: torch.Tensor  # [Dv]
    norm_eps: float


class GdnShape(NamedTuple):
    num_k_heads: int
    num_v_heads: int
    k_dim: int
    v_dim: int

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def split(self) -> list[int]:
        """The in_proj output's parts: mixed qkv, z, b, a."""
        return [self.conv_dim, self.value_dim, self.num_v_heads, self.num_v_heads]

    @classmethod
    def of(cls, projected: torch.Tensor, conv_weight: torch.Tensor,
           state_pool: torch.Tensor) -> GdnShape:
        """From the operands: state_pool [N, Hv, Dk, Dv], conv_weight [C, W] with
        C = 2 Hk Dk + Hv Dv, projected [T, C + Hv Dv + 2 Hv]."""
        num_v_heads, k_dim, v_dim = state_pool.shape[1:]
        key_dim = (conv_weight.shape[0] - num_v_heads * v_dim) // 2
        shape = cls(key_dim // k_dim, num_v_heads, k_dim, v_dim)
        if projected.shape[1] != sum(shape.split) or shape.key_dim != key_dim:
            raise ValueError(f"in_proj output {tuple(projected.shape)}, conv weight "
                             f"{tuple(conv_weight.shape)} and state pool "
                             f"{tuple(state_pool.shape)} do not describe one GDN layer")
        return shape
