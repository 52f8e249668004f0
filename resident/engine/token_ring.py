"""TokenRing: pinned host slots a decode step's graph writes its tokens into (knob `token_ring`),
so the host reads them back after its wait with no copy of its own to queue.

Every launch of a decode bucket, replayed or eager, publishes once as its last device op
(kernels/publish.py): a greedy step its [bucket] int64 argmax tokens, a drawing step its draw's
packed bytes (draw.packed_drawn's layout: the tokens, then one failure byte a row). The host counts
the launches it queued (`launched`), the device the publishes it ran; both start from zero once
start-up's warm-ups and captures are done (`reset`). Publish n writes slot n % NUM_SLOTS and stamps
n in its header: a read checks the stamp, so a launch the host did not count (or one it counted that
never ran) fails loudly instead of reading another step's tokens. Two slots suffice because a decode
step is launched at most one step ahead of the read-back (engine.py, plan_ahead=launch): step n + 1
writes the other slot while the host reads step n."""

from __future__ import annotations

import logging

import numpy as np
import torch

from resident.engine.draw import packed_bytes, split_packed

log = logging.getLogger("resident.engine")

HEADER_BYTES = 16  # a slot's stamp, padded: its published bytes start 16-byte aligned
NUM_SLOTS = 2


def publish_torch(src: torch.Tensor, ring: torch.Tensor, count: torch.Tensor,
                  header: int = HEADER_BYTES, slots: int = NUM_SLOTS) -> None:
    """kernels/publish.py's publish_triton in torch, for a CPU engine (reading the count on the
    host is no sync there): src's bytes into slot count % slots, stamped with count, then
    count + 1."""
    slot_bytes = ring.shape[0] // slots
    number = int(count.item())
    start = (number % slots) * slot_bytes
    ring[start + header:start + header + src.shape[0]].copy_(src)
    ring.view(torch.int64)[start // 8] = number
    count += 1


class TokenRing:
    def __init__(self, device: torch.device, max_rows: int) -> None:
        """max_rows: the widest decode bucket."""
        cuda = device.type == "cuda"
        self.slot_bytes = -(-(HEADER_BYTES + packed_bytes(max_rows)) // 16) * 16
        self.host = torch.zeros(NUM_SLOTS * self.slot_bytes, dtype=torch.uint8, pin_memory=cuda)
        self._words = self.host.numpy().view(np.int64)
        self.count_gpu = torch.zeros(1, dtype=torch.int64, device=device)
        self._publish = publish_torch
        if cuda:  # imported here: triton must not load before TRITON_INTERPRET is set
            from resident.kernels.publish import publish_triton

            self._publish = publish_triton
        self._num_launched = 0
        # (slot, bucket, drew) -> numpy views of the slot's tokens and failures (None: greedy)
        self._views: dict[tuple[int, int, bool], tuple[np.ndarray, np.ndarray | None]] = {}

    @classmethod
    def build(cls, knob: str, device: torch.device, max_rows: int) -> TokenRing | None:
        """The ring when `knob` is on and a publish reaches the host here (checked once: a
        kernel's store into pinned memory needs unified addressing), else None: the tokens
        are copied back as before."""
        if knob != "on":
            return None
        ring = cls(device, max_rows)
        probe = torch.arange(packed_bytes(1), dtype=torch.uint8, device=device)
        try:
            ring.publish(probe)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            tokens, _ = ring.views(0, 1, False)
            arrived = ring.stamped(0) and bytes(tokens.view(np.uint8)) == bytes(range(8))
        except Exception:  # noqa: BLE001 - any failure to publish means: copy back instead
            log.exception("token_ring: a publish did not reach the host; tokens are copied "
                          "back")
            return None
        if not arrived:
            log.warning("token_ring: a publish wrote other bytes; tokens are copied back")
            return None
        ring.reset()
        return ring

    def publish(self, src: torch.Tensor) -> None:
        """A device op (captured with the step): src's bytes into the next slot."""
        self._publish(src.view(torch.uint8), self.host, self.count_gpu, HEADER_BYTES, NUM_SLOTS)

    @property
    def num_launched(self) -> int:
        """Publishing launches counted since the last reset."""
        return self._num_launched

    def launched(self) -> int:
        """A launch that publishes once was queued: its publish's number."""
        number = self._num_launched
        self._num_launched += 1
        return number

    def reset(self) -> None:
        """Both counts to zero, behind whatever the stream holds (start-up's warm-ups)."""
        self.count_gpu.zero_()
        self._num_launched = 0

    def stamped(self, number: int) -> bool:
        """Whether publish `number`'s slot holds its stamp (after the wait that covers it)."""
        slot = number % NUM_SLOTS
        return int(self._words[slot * self.slot_bytes // 8]) == number

    def views(self, number: int, bucket: int, drew: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """Publish `number`'s [bucket] int64 tokens and, for a drawing step, [bucket] bool
        failures: views of its slot, read after the wait."""
        key = (number % NUM_SLOTS, bucket, drew)
        views = self._views.get(key)
        if views is None:
            start = key[0] * self.slot_bytes + HEADER_BYTES
            tokens, failed = split_packed(self.host.numpy()[start:start + packed_bytes(bucket)],
                                          bucket)
            views = self._views[key] = (tokens, failed if drew else None)
        return views
