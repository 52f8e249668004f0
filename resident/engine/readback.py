"""TokenReadback: a step's tokens (and a draw's failures, and the logprobs rows asked for) from
the device to the host, behind one CUDA event a step: by one copy into pinned memory, or, for a
decode step whose graph published them (engine/token_ring.py), by no copy at all."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from resident.engine.draw import PACKED_ROW_BYTES, packed_bytes, split_packed
from resident.engine.sampler import StepLogprobs
from resident.engine.types import MAX_LOGPROBS, TokenLogprobs

if TYPE_CHECKING:
    from resident.engine.token_ring import TokenRing


class _Prefixes:
    """A 1-D buffer's [:n] views, each made once: a step takes its row count's view rather
    than slicing again (a tensor op on the host, each step)."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer
        self._views: dict[int, torch.Tensor] = {}

    def first(self, count: int) -> torch.Tensor:
        view = self._views.get(count)
        if view is None:
            view = self._views[count] = self._buffer[:count]
        return view


class TokenReadback:
    """A step's sampled tokens, copied to pinned host memory behind an event: `start` queues
    the copy, `mark` moves the event past what the stream took since (the next step's uploads,
    when that step launches before the read-back, so that waiting also frees their host
    sources), `wait` blocks until then and returns the tokens. `start` records no event of its
    own: a step launched ahead marks right after it (an event record is a CUDA call, several µs
    of host time), and `wait` marks first where nothing did since `start`. On CPU the copy is
    done at once.
    The logprobs some rows asked for, and a drawing step's failure flags, ride the same event
    (`logprobs` and `failed` after `wait`); a draw whose tokens and failures share one
    allocation (draw.packed_drawn) is read back in one copy. A decode step whose graph
    published its tokens into the TokenRing (`start_published`) queues no copy at all: `wait`
    reads its slot, checks its stamp and takes the kept rows on the host.

    The event is recorded on the stream current when the readback is made, the engine's: the
    `torch.cuda.Event.record()` default looks the current stream up in Python each time
    (~15 µs a step of the H100 host's two records; results/2026-12-05-h100-core-spy)."""

    def __init__(self, device: torch.device, max_rows: int) -> None:
        cuda = device.type == "cuda"
        self._host = _Prefixes(torch.zeros(max_rows, dtype=torch.int64, pin_memory=cuda))
        # flat, so a step's [rows, width] block is a contiguous view: a non_blocking copy into
        # a strided view of pinned memory would go through an unpinned temporary
        self._values_host = torch.zeros(max_rows * (1 + MAX_LOGPROBS), dtype=torch.float64,
                                        pin_memory=cuda)
        self._ids_host = torch.zeros(max_rows * MAX_LOGPROBS, dtype=torch.int64,
                                     pin_memory=cuda)
        self._failed_host = _Prefixes(torch.zeros(max_rows, dtype=torch.bool, pin_memory=cuda))
        self._packed_host = _Prefixes(torch.zeros(packed_bytes(max_rows), dtype=torch.uint8,
                                                  pin_memory=cuda))
        # (a packed draw's bytes or 0, rows read) -> the host's tokens view and failures (numpy)
        self._views: dict[tuple[int, int], tuple[torch.Tensor, np.ndarray]] = {}
        self._event = torch.cuda.Event() if cuda else None
        self._stream = torch.cuda.current_stream(device) if cuda else None
        self._count = 0
        self._read: tuple[torch.Tensor, np.ndarray] | None = None
        self._logprobs: StepLogprobs | None = None
        self._drew = False
        self._unmarked = False  # a copy queued by `start` that no mark has covered yet
        # a published step: (its ring, its publish's number, the rows read: None for the first
        # _count)
        self._published: tuple[TokenRing, int, list[int] | None] | None = None

    def start(self, tokens: torch.Tensor, logprobs: StepLogprobs | None = None,
              failed: torch.Tensor | None = None, packed: torch.Tensor | None = None) -> None:
        """tokens: [rows]; failed: [rows] bool, the draw's failures (None: nothing drawn);
        packed: the draw's allocation holding both (Drawn.packed), read in their stead."""
        self._count = count = tokens.shape[0]
        self._drew = failed is not None
        self._published = None
        if packed is not None:
            self._packed_host.first(packed.shape[0]).copy_(packed, non_blocking=True)
            self._read = self._packed_views(packed.shape[0], count)
        else:
            self._host.first(count).copy_(tokens, non_blocking=True)
            if failed is not None:
                self._failed_host.first(count).copy_(failed, non_blocking=True)
            self._read = self._plain_views(count)
        self._logprobs = logprobs
        if logprobs is not None:
            self._values_view(logprobs).copy_(logprobs.values, non_blocking=True)
            self._ids_view(logprobs).copy_(logprobs.ids, non_blocking=True)
        self._unmarked = True

    def start_published(self, ring: TokenRing, number: int, bucket: int, drew: bool,
                        count: int, kept: list[int] | None = None) -> None:
        """A decode step of `bucket` rows whose graph published its tokens (and, `drew`, its
        draw's failures) as `ring`'s publish `number`: its first `count` rows, or its `kept`
        rows, are read from the slot after the wait. No logprobs (they are copied: `start`)."""
        self._published = (ring, number, kept)
        self._count = count if kept is None else len(kept)
        self._drew = drew
        self._read = ring.views(number, bucket, drew)
        self._logprobs = None
        self._unmarked = True

    def _packed_views(self, packed_size: int, count: int) -> tuple[torch.Tensor, np.ndarray]:
        key = (packed_size, count)
        views = self._views.get(key)
        if views is None:
            tokens, failed = split_packed(self._packed_host.first(packed_size),
                                          packed_size // PACKED_ROW_BYTES)
            views = self._views[key] = (tokens[:count], failed[:count].numpy())
        return views

    def _plain_views(self, count: int) -> tuple[torch.Tensor, np.ndarray]:
        views = self._views.get((0, count))
        if views is None:
            views = self._views[(0, count)] = (self._host.first(count),
                                               self._failed_host.first(count).numpy())
        return views

    def _values_view(self, logprobs: StepLogprobs) -> torch.Tensor:
        rows, width = logprobs.values.shape
        return self._values_host[:rows * width].view(rows, width)

    def _ids_view(self, logprobs: StepLogprobs) -> torch.Tensor:
        rows, width = logprobs.ids.shape
        return self._ids_host[:rows * width].view(rows, width)

    def mark(self) -> None:
        self._unmarked = False
        if self._event is not None:
            self._event.record(self._stream)

    def wait(self) -> list[int]:
        self.sync()
        if self._published is None:
            return self._read[0].tolist()
        ring, number, _ = self._published
        if not ring.stamped(number):
            raise RuntimeError(f"token ring: publish {number} is not in its slot: a decode "
                               f"launch ran that the host did not count, or the reverse")
        return self._published_rows(self._read[0]).tolist()

    def _published_rows(self, values: np.ndarray) -> np.ndarray:
        """A published step's read rows of one of its slot's [bucket] views: the first _count,
        or the kept ones."""
        kept = self._published[2]
        return values[:self._count] if kept is None else values[kept]

    def sync(self) -> None:
        """Waits until the GPU passes the last mark (made now if a `start` came after it),
        reading nothing back: a step that samples no row must still not let the host ring
        (buffers.py) turn over staging whose copies are queued."""
        if self._unmarked:
            self.mark()
        if self._event is not None:
            self._event.synchronize()

    def failed(self) -> list[int]:
        """After `wait`: the rows whose draw failed."""
        if not self._drew:
            return []
        failed = self._read[1]
        if self._published is not None:
            failed = self._published_rows(failed)
        # nearly every step has none: a byte search is ~0.1 µs, flatnonzero + tolist ~1.3
        if b"\x01" not in failed.tobytes():
            return []
        return np.flatnonzero(failed).tolist()

    def logprobs(self) -> list[TokenLogprobs | None] | None:
        """After `wait`: the logprobs of each row of the step `start` was given (None for a row
        that asked for none), or None when no row asked."""
        step = self._logprobs
        if step is None:
            return None
        values, ids = self._values_view(step).tolist(), self._ids_view(step).tolist()
        rows: list[TokenLogprobs | None] = [None] * self._count
        for index, row in enumerate(step.rows):
            count = step.counts[index]
            top = tuple(zip(ids[index][:count], values[index][1:1 + count], strict=True))
            rows[row] = TokenLogprobs(values[index][0], top)
        return rows
