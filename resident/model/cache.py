"""ModelCache: the device memory a model's steps read and write.

    kv:         [num_attention_layers, num_pages, 2, page_size, num_kv_heads, head_dim] (dtype)
    conv:       [num_linear_layers, num_slots, conv_dim, conv_kernel]                  (dtype)
    recurrent:  [num_linear_layers, num_slots, Hv, Dk, Dv]     (the knob gdn_state_dtype's)

Page 0 and slot 0 are the sinks that padding rows point at; the pools never hand them out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from resident.kernels import compute_dtype
from resident.model.config import ModelConfig


@dataclass(frozen=True)
class ModelCache:
    kv: torch.Tensor
    conv: torch.Tensor
    recurrent: torch.Tensor

    @property
    def page_size(self) -> int:
        return self.kv.shape[3]

    @classmethod
    def allocate(
        cls,
        config: ModelConfig,
        num_pages: int,
        page_size: int,
        num_slots: int,
        dtype: torch.dtype,
        device: torch.device | str,
        state_dtype: torch.dtype | None = None,
    ) -> ModelCache:
        """state_dtype: the recurrent state's; None: float32 (float64 in a float64 model), as
        gdn_state_dtype's auto."""
        if state_dtype is None:
            state_dtype = compute_dtype(dtype)
        kv = torch.zeros(
            len(config.attention_layers), num_pages, 2, page_size,
            config.num_key_value_heads, config.head_dim, dtype=dtype, device=device,
        )
        num_linear = len(config.linear_layers)
        conv = torch.zeros(num_linear, num_slots, config.conv_dim, config.linear_conv_kernel_dim,
                           dtype=dtype, device=device)
        recurrent = torch.zeros(
            num_linear, num_slots, config.linear_num_value_heads, config.linear_key_head_dim,
            config.linear_value_head_dim, dtype=state_dtype, device=device,
        )
        return cls(kv=kv, conv=conv, recurrent=recurrent)

    def reset_slot(self, slot: int) -> None:
        """Zeroes a GDN state slot before a new sequence uses it."""
        self.conv[:, slot].zero_()
        self.recurrent[:, slot].zero_()
