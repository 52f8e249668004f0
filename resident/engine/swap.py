"""StateSwapper: the scheduler's `Swapper` (scheduler.py). It moves a request's device state,
its KV pages and GDN state slot, to pinned host memory when the scheduler offloads it under KV
pressure, back into its new pages and slot when it reloads, and zeroes a fresh request's slot.
The scheduler owns the pools: it frees them after `offload` and hands out pages and a slot
before `reload`. An offload also gives the request's resident slot up (`on_offload`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from resident.engine.request import Request
from resident.model.cache import ModelCache
from resident.resources.kv import KVPool
from resident.resources.recurrent import StatePool


@dataclass(frozen=True)
class HostCopy:
    """An offloaded request's device state in host memory."""

    kv: torch.Tensor  # [num_attention_layers, num_pages, 2, page_size, Hkv, D]
    conv: torch.Tensor  # [num_linear_layers, conv_dim, conv_kernel]
    recurrent: torch.Tensor  # [num_linear_layers, Hv, Dk, Dv]


class StateSwapper:
    def __init__(self, cache: ModelCache, kv: KVPool, states: StatePool,
                 on_offload: Callable[[str], None]) -> None:
        self.cache, self.kv, self.states = cache, kv, states
        self.device = cache.kv.device
        self.on_offload = on_offload
        self._host_copies: dict[str, HostCopy] = {}

    def offload(self, request: Request) -> None:
        """Copies the request's computed pages and its state slot to host memory."""
        rid = request.request_id
        num_pages = self.kv.pages_for(request.num_computed)
        pages = torch.tensor(self.kv.streams[rid].pages[:num_pages], device=self.device)
        slot = self.states.slots[rid]
        pin = self.device.type == "cuda"
        self._host_copies[rid] = HostCopy(
            kv=_to_host(self.cache.kv[:, pages], pin),
            conv=_to_host(self.cache.conv[:, slot], pin),
            recurrent=_to_host(self.cache.recurrent[:, slot], pin),
        )
        self.on_offload(rid)

    def reload(self, request: Request) -> None:
        """Copies them back into the pages and slot the scheduler gave it."""
        rid = request.request_id
        copy = self._host_copies.pop(rid)
        pages = torch.tensor(self.kv.streams[rid].pages, device=self.device)
        slot = self.states.slots[rid]
        self.cache.kv[:, pages] = copy.kv.to(self.device, non_blocking=True)
        self.cache.conv[:, slot] = copy.conv.to(self.device, non_blocking=True)
        self.cache.recurrent[:, slot] = copy.recurrent.to(self.device, non_blocking=True)

    def reset_state(self, request: Request) -> None:
        """Zeroes a fresh request's GDN state slot."""
        self.cache.reset_slot(self.states.slots[request.request_id])

    def drop(self, request_id: str) -> None:
        """Forgets an offloaded request's host copy (it finished or was aborted)."""
        self._host_copies.pop(request_id, None)

    @property
    def num_host_copies(self) -> int:
        return len(self._host_copies)


def _to_host(tensor: torch.Tensor, pin: bool) -> torch.Tensor:
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
    host.copy_(tensor)  # synchronous: the pages are handed to someone else right after
    return host
