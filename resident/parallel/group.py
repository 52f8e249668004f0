"""The process group of a tensor-parallel engine: torch.distributed over TCP on this host.

gloo on CPU; on CUDA NCCL for the all-reduces of the forward plus a gloo group for the control
messages (intake and lockstep: small pickles NCCL would have to stage through the device). Rank
0 picks a free port and hands it to the ranks it spawns. Collectives wait up to `timeout_s`: an
idle server's followers wait that long for the next step, so it is long; a dead rank is found by
its closed sockets and by rank 0's watch over its processes (server/ranks.py), not by timeout.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

IDLE_TIMEOUT_S = 7 * 24 * 3600.0


def free_port() -> int:
    """A TCP port free on localhost now (rank 0 binds it for the rendezvous at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class RankGroup:
    """This process's rank in a group of `size`; `device` the one its engine runs on."""

    rank: int
    size: int
    device: torch.device
    forward_group: Any = None  # the all-reduces of the forward (NCCL on CUDA, gloo on CPU)
    control_group: Any = None  # gloo: object broadcasts and gathers

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Sums `tensor` over the ranks, in place."""
        dist.all_reduce(tensor, group=self.forward_group)

    def broadcast(self, message: Any) -> Any:
        """Rank 0's `message`, on every rank."""
        box = [message]
        dist.broadcast_object_list(box, src=0, group=self.control_group)
        return box[0]

    def gather(self, item: Any) -> list[Any] | None:
        """Every rank's `item` in rank order on rank 0; None elsewhere."""
        out = [None] * self.size if self.is_leader else None
        dist.gather_object(item, out, dst=0, group=self.control_group)
        return out

    def abort(self) -> None:
        """Fails every collective in flight or to come (a peer is dead): NCCL's would wait."""
        from torch.distributed.distributed_c10d import _abort_process_group

        _abort_process_group()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def single_rank(device: torch.device) -> RankGroup:
    """No tensor parallelism: no group, no collective."""
    return RankGroup(0, 1, device)


def init_group(rank: int, size: int, port: int, device_type: str,
               timeout_s: float = IDLE_TIMEOUT_S) -> RankGroup:
    """Joins the group at 127.0.0.1:`port` (blocks until every rank has); on CUDA rank r takes
    device r of the visible ones."""
    timeout = timedelta(seconds=timeout_s)
    backend = "nccl" if device_type == "cuda" else "gloo"
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    if device_type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size, timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=timeout) if device_type == "cuda" \
        else dist.group.WORLD
    return RankGroup(rank, size, device, dist.group.WORLD, control)
