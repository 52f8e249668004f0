"""PrefixCache (`prefix_cache: on`): a new request skips the prefill of a prompt prefix that an
earlier request computed, for a hybrid model.

Attention layers need the prefix's KV pages; GDN layers need their state right after the prefix,
which a later token's state cannot give back. So the cache keeps both, at page-aligned points:

- full prompt pages, cached by chained block key (resources/page_cache.py) and shared
  read-only by the streams of later requests, idle ones evicted under KV pressure;
- GDN state snapshots (conv and recurrent state of every GDN layer) in a fixed pool on the
  device (`prefix_snapshots` of them, least recently used replaced), taken when a prompt's
  computed length lands on a snapshot point: every `prefix_snapshot_interval` pages, and with
  `prefix_snapshot_tail: on` the last page boundary before the prompt's last token (the
  deepest point a repeat of the prompt can restore: a hit keeps at least one token to compute,
  so its logits exist). The scheduler ends a prefill chunk at the furthest such point it
  reaches (`chunk`), as vLLM's mamba "align" mode does, so the state there is the slot's state
  after a step and a snapshot is one device copy; points inside a chunk get none. Each cut
  costs the prompt one more step: the tail point, which every prompt reaches and only a
  repeat of the same prompt (or a chat's next turn) can use, is therefore off by default.

A hit (`match`) is the longest prefix whose pages are all cached and which ends at a snapshot:
the scheduler gives the new stream those pages, `restore` copies the snapshot into its state
slot, and prefill starts at the next token. Every copy is queued on the device in step order
(a snapshot after the step that computed it, a restore before the step that reads it), so
nothing here waits for the GPU. For the resident planner a hit is an ordinary new request: its
first step is a host-planned prefill, and its row is written whole when it first decodes.

`NoPrefixCache` (`prefix_cache: off`) does nothing: chunks are not cut, nothing is cached.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from resident.config import EngineConfig
from resident.engine.request import Request
from resident.model.cache import ModelCache
from resident.resources.kv import KVPool
from resident.resources.page_cache import page_keys
from resident.resources.recurrent import StatePool
from resident.resources.snapshots import SnapshotIndex


@dataclass(frozen=True)
class PrefixHit:
    """A cached prefix a new request starts from."""

    num_tokens: int  # prompt tokens restored: len(pages) * page_size, < the prompt's length
    pages: list[int]  # their KV pages, in order
    snapshot: int  # the GDN state after them, in the snapshot pool


class NoPrefixCache:
    """`prefix_cache: off`."""

    enabled = False
    snapshot_bytes = 0

    def add(self, request: Request) -> None: ...

    def match(self, request: Request) -> PrefixHit | None:
        return None

    def chunk(self, request: Request, start: int, num_new: int) -> int:
        return num_new

    def restore(self, request: Request, hit: PrefixHit) -> None:
        raise RuntimeError("no prefix cache to restore from")

    def commit(self, request: Request) -> None: ...

    def drop(self, request_id: str) -> None: ...


class PrefixCache(NoPrefixCache):
    enabled = True

    def __init__(self, config: EngineConfig, cache: ModelCache, kv: KVPool,
                 states: StatePool) -> None:
        self.page_size = config.page_size
        self.interval = config.prefix_snapshot_interval * config.page_size  # tokens
        self.tail = config.prefix_snapshot_tail == "on"
        self.cache, self.kv, self.states = cache, kv, states
        self.index = SnapshotIndex(config.prefix_snapshots)
        num = config.prefix_snapshots
        # [num_linear_layers, num_snapshots, conv_dim, conv_kernel]
        self.conv = torch.zeros((cache.conv.shape[0], num, *cache.conv.shape[2:]),
                                dtype=cache.conv.dtype, device=cache.conv.device)
        # [num_linear_layers, num_snapshots, Hv, Dk, Dv]
        self.recurrent = torch.zeros((cache.recurrent.shape[0], num,
                                      *cache.recurrent.shape[2:]),
                                     dtype=cache.recurrent.dtype, device=cache.recurrent.device)
        self._keys: dict[str, list[int]] = {}  # a prefilling request's prompt page keys
        self._num_cached: dict[str, int] = {}  # and how many of its pages are cached so far
        self.counters: Counter[str] = Counter()

        self.snapshot_bytes = sum(t.numel() * t.element_size()  # the pool's device bytes
                                  for t in (self.conv, self.recurrent))

    def add(self, request: Request) -> None:
        """A new request's prompt page keys, for its lookup and for caching its pages."""
        self._keys[request.request_id] = page_keys(request.prompt_ids, self.page_size)
        self._num_cached[request.request_id] = 0

    def match(self, request: Request) -> PrefixHit | None:
        """The longest cached prefix of a waiting request's prompt that ends at a snapshot
        and leaves at least one prompt token to compute; None on a miss."""
        keys = self._keys[request.request_id]
        pages = self.kv.cache.match(keys[:(len(request.prompt_ids) - 1) // self.page_size])
        for num_pages in range(len(pages), 0, -1):
            if keys[num_pages - 1] in self.index:
                snapshot = self.index.find(keys[num_pages - 1])
                return PrefixHit(num_pages * self.page_size, pages[:num_pages], snapshot)
        return None

    def chunk(self, request: Request, start: int, num_new: int) -> int:
        """A prefill chunk of at most `num_new` prompt tokens from `start`, cut to end at a
        snapshot point if it reaches one: the furthest interval point, else (tail on) the
        last page boundary. One cut a chunk, as vLLM's mamba "align" mode: a long fresh
        prompt takes one step more than with the cache off, not one a point it passes."""
        last = self._last_boundary(len(request.prompt_ids))
        furthest = min(start + num_new, last) // self.interval * self.interval
        if furthest > start:
            return furthest - start
        if self.tail and start < last <= start + num_new:
            return last - start
        return num_new

    def _last_boundary(self, prompt_len: int) -> int:
        """The last page boundary before a prompt's last token: no snapshot lies past it, as a
        hit must leave a token to compute."""
        return (prompt_len - 1) // self.page_size * self.page_size

    def _is_point(self, computed: int, prompt_len: int) -> bool:
        """Whether a prompt computed this far is at a snapshot point: a multiple of the
        interval or (tail on) its last page boundary, not past that boundary."""
        last = self._last_boundary(prompt_len)
        return 0 < computed <= last and (computed % self.interval == 0
                                         or (self.tail and computed == last))

    def restore(self, request: Request, hit: PrefixHit) -> None:
        """A hit's state: the snapshot into the request's (just admitted) state slot."""
        slot = self.states.slots[request.request_id]
        self.cache.conv[:, slot].copy_(self.conv[:, hit.snapshot])
        self.cache.recurrent[:, slot].copy_(self.recurrent[:, hit.snapshot])
        request.num_cached_tokens = hit.num_tokens
        self._num_cached[request.request_id] = len(hit.pages)
        self.counters["hits"] += 1
        self.counters["cached_tokens"] += hit.num_tokens

    def commit(self, request: Request) -> None:
        """After a step that ran a prefill chunk of the request (its KV and state written in
        stream order): caches its newly full prompt pages and, at a snapshot point, copies its
        state into a snapshot. A request whose prompt is done is forgotten."""
        rid = request.request_id
        keys = self._keys.get(rid)
        if keys is None:
            return
        computed, prompt_len = request.num_computed, len(request.prompt_ids)
        num_full = min(computed, prompt_len) // self.page_size
        if num_full > self._num_cached[rid]:
            self.kv.cache_pages(rid, keys[:num_full], self._num_cached[rid])
            self._num_cached[rid] = num_full
        if self._is_point(computed, prompt_len):
            self._snapshot(keys[computed // self.page_size - 1], self.states.slots[rid])
        if computed >= prompt_len:
            self.drop(rid)

    def _snapshot(self, key: int, slot: int) -> None:
        if key in self.index:
            self.index.find(key)
            return
        index = self.index.take(key)
        self.conv[:, index].copy_(self.cache.conv[:, slot])
        self.recurrent[:, index].copy_(self.cache.recurrent[:, slot])
        self.counters["snapshots"] += 1

    def drop(self, request_id: str) -> None:
        self._keys.pop(request_id, None)
        self._num_cached.pop(request_id, None)

    def stats(self) -> dict[str, int]:
        """Counters and gauges for /metrics (report.py)."""
        return {"hits": self.counters["hits"], "cached_tokens": self.counters["cached_tokens"],
                "snapshots_taken": self.counters["snapshots"],
                "snapshots_evicted": self.index.num_evicted,
                "snapshots_used": self.index.num_used,
                "pages_cached": self.kv.cache.num_cached,
                "pages_idle": len(self.kv.cache.idle),
                "pages_evicted": self.kv.cache.num_evicted}
