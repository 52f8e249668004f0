"""PrefixCache (`prefix_cache: on`): a new request skips the prefill of a prompt prefix that an
earlier request computed, for a hybrid model.

Attention layers need the prefix's KV pages; GDN layers need their state right after the prefix,
which a later token's state cannot give back. So the cache keeps both, at page-aligned points:

- full prompt pages, cached by chained block key (resources/page_cache.py) and shared
  read-only by the streams of later requests, idle ones evicted under KV pressure;
- GDN state snapshots (conv and recurrent state of every GDN layer) in a fixed pool on the
  device (`prefix_snapshots` of them, by default what `prefix_snapshot_gib` holds; least
  recently used replaced), taken where a prefill chunk ends on a snapshot point. The state
  there is the slot's state after a step, so a snapshot is one device copy; points inside a
  chunk get none.

Where chunks end (`chunk`): a cut costs the prompt one more prefill step (4,000-token fresh
prompts at c=1: TTFT +19%, -5% tok/s on the H200 when every prompt was cut, as vLLM's mamba
"align" mode does: results/2026-12-04-h200-prefix-long). So a chunk is cut only where a later
request will use the snapshot: at the furthest page boundary of the chunk up to which another
request already computed this prompt (its pages are cached): the branch point where the prompt
leaves the cached pages, or its last page boundary for a repeat. A prefix is therefore computed
by its first request, snapshotted by its second, and restored from its third on; a prompt that
shares nothing is never cut and costs no step. A chunk that ends on its own (the budget, or
the prompt's end) at an interval point (every `prefix_snapshot_interval` pages) snapshots too,
for free. `prefix_snapshot_tail: on` cuts every prompt at its last page boundary (the deepest
point a repeat can restore: a hit keeps at least one token to compute, so its logits exist),
so a repeat hits from its second request on, at a step for every prompt.

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
from resident.resources.page_cache import PageKey, page_keys, salted_root
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
        self._keys: dict[str, list[PageKey]] = {}  # a prefilling request's prompt page keys
        self._num_cached: dict[str, int] = {}  # and how many of its pages are cached so far
        self._cuts: dict[str, int] = {}  # where `chunk` last ended its chunk (0: not cut)
        self.counters: Counter[str] = Counter()

        self.snapshot_bytes = sum(t.numel() * t.element_size()  # the pool's device bytes
                                  for t in (self.conv, self.recurrent))

    def add(self, request: Request) -> None:
        """A new request's prompt page keys, for its lookup and for caching its pages."""
        self._keys[request.request_id] = page_keys(request.prompt_ids, self.page_size,
                                                   salted_root(request.cache_salt))
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
        """A prefill chunk of at most `num_new` prompt tokens from `start`, cut to end where a
        snapshot will serve a later request (the module's docstring): where the pages another
        request computed end, else (tail on) at the prompt's last page boundary."""
        rid, keys = request.request_id, self._keys.get(request.request_id)
        if keys is None:  # forgotten: its prompt was done
            return num_new
        last = self._last_boundary(len(request.prompt_ids))
        cut = 0
        if start < last:
            cut = self._branch_point(keys, start, min(start + num_new, last), last)
        if not cut and self.tail and start < last <= start + num_new:
            cut = last
        self._cuts[rid] = cut
        return cut - start if cut > start else num_new

    def _branch_point(self, keys: list[PageKey], start: int, end: int, last: int) -> int:
        """The page boundary in (start, end] where the run of cached pages from `start`'s page
        ends, if it ends there: another request computed the prompt up to it, and a later one
        sharing as much restores from it. 0 where the run reaches past the chunk (the cut
        comes in a later one) or has no page past `start`."""
        first, stop = start // self.page_size, end // self.page_size
        num_cached = len(self.kv.cache.match(keys[first:stop + 1]))
        boundary = (first + num_cached) * self.page_size
        if boundary <= start or (boundary > end and end < last):
            return 0
        return min(boundary, end)

    def _last_boundary(self, prompt_len: int) -> int:
        """The last page boundary before a prompt's last token: no snapshot lies past it, as a
        hit must leave a token to compute."""
        return (prompt_len - 1) // self.page_size * self.page_size

    def _is_point(self, computed: int, prompt_len: int, cut: int) -> bool:
        """Whether a prompt's prefill stopped at a snapshot point: where `chunk` cut it (`cut`),
        or a page-aligned interval point it reached on its own, not past its last boundary."""
        return computed == cut or (0 < computed <= self._last_boundary(prompt_len)
                                   and computed % self.interval == 0)

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
        if self._is_point(computed, prompt_len, self._cuts.pop(rid, 0)):
            self._snapshot(keys[computed // self.page_size - 1], self.states.slots[rid])
        if computed >= prompt_len:
            self.drop(rid)

    def _snapshot(self, key: PageKey, slot: int) -> None:
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
        self._cuts.pop(request_id, None)

    def stats(self) -> dict[str, int]:
        """Counters and gauges for /metrics (report.py)."""
        return {"hits": self.counters["hits"], "cached_tokens": self.counters["cached_tokens"],
                "snapshots_taken": self.counters["snapshots"],
                "snapshots_evicted": self.index.num_evicted,
                "snapshots_used": self.index.num_used,
                "pages_cached": self.kv.cache.num_cached,
                "pages_idle": len(self.kv.cache.idle),
                "pages_evicted": self.kv.cache.num_evicted}
