"""KVPool: the paged KV allocator and each request's stream of pages.

Page 0 is the sink: padding rows point at it and it is never handed out. A stream's pages hold its
tokens in order, `page_size` to a page; a request's token at position p lives at
`pages[p // page_size] * page_size + p % page_size`.

Pages are reference-counted (page_cache.PageCache): with the prefix cache on, full prompt
pages are cached by their block hash and shared read-only by the streams of later requests
(`share`); a cached page no stream holds stays cached until KV pressure takes it, so it counts
as free. With the cache off no page is ever cached and every freed page is free at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from resident.resources.base import Resource
from resident.resources.page_cache import PageCache, PageKey

SINK_PAGE = 0


@dataclass
class KVStream:
    pages: list[int] = field(default_factory=list)
    length: int = 0  # tokens whose KV is stored


class KVPool(Resource):
    name = "kv"

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self._free = list(range(num_pages - 1, SINK_PAGE, -1))  # pop() hands out low pages first
        self.streams: dict[str, KVStream] = {}
        self.cache = PageCache()

    @property
    def num_free(self) -> int:
        """Pages a stream can take: free ones and idle cached ones (evicted on taking)."""
        return len(self._free) + len(self.cache.idle)

    @property
    def num_used(self) -> int:
        return self.num_pages - 1 - self.num_free

    def _take(self, count: int) -> list[int]:
        """`count` pages for a stream: free ones first, then the least recently used idle
        cached ones, which are forgotten."""
        pages = [self._free.pop() if self._free else self.cache.evict() for _ in range(count)]
        self.cache.hold(pages)
        return pages

    @property
    def capacity_tokens(self) -> int:
        return (self.num_pages - 1) * self.page_size

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def pages_needed(self, request_id: str, num_new: int) -> int:
        stream = self.streams.get(request_id) or KVStream()
        return max(0, self.pages_for(stream.length + num_new) - len(stream.pages))

    def admit(self, request_id: str, num_new: int) -> str | None:
        stream = self.streams.get(request_id)
        if stream is not None and stream.length + num_new <= len(stream.pages) * self.page_size:
            return None  # the decode step's usual case: its last page has room
        need = self.pages_needed(request_id, num_new)
        if need > self.num_free:
            return f"no free KV pages (needs {need}, {self.num_free} free)"
        stream = self.streams.setdefault(request_id, KVStream())
        stream.pages.extend(self._take(need))
        return None

    def share(self, request_id: str, pages: list[int]) -> None:
        """A new request's stream starts on cached pages (a prefix cache hit): full pages
        whose KV it reads and never writes."""
        self.cache.hold(pages)
        self.streams[request_id] = KVStream(pages=list(pages),
                                            length=len(pages) * self.page_size)

    def cache_pages(self, request_id: str, keys: list[PageKey], first: int) -> None:
        """Caches the stream's full pages `first`.. under their block keys (`keys[j]` is page
        j's): their KV is written (the step that wrote them is launched, stream order)."""
        pages = self.streams[request_id].pages
        for index in range(first, len(keys)):
            self.cache.insert(keys[index], pages[index])

    def commit(self, request_id: str, num_new: int) -> None:
        self.streams[request_id].length += num_new

    def free(self, request_id: str) -> list[int]:
        """Returns the freed pages (in stream order) so an offload can copy them first."""
        stream = self.streams.pop(request_id, None)
        if stream is None:
            return []
        self._free.extend(reversed(self.cache.drop(stream.pages)))
        return stream.pages

    def restore(self, request_id: str, length: int) -> list[int] | str:
        """Gives a reloaded request fresh pages for `length` stored tokens, or a refusal."""
        need = self.pages_for(length)
        if need > self.num_free:
            return f"no free KV pages to reload (needs {need}, {self.num_free} free)"
        pages = self._take(need)
        self.streams[request_id] = KVStream(pages=pages, length=length)
        return pages

    def resident_refusal(self) -> str | None:
        return None  # block-table span and stored length per row

    def resident_span(self, max_model_len: int) -> int:
        """Block-table cells a row holds: a stream's pages are distinct pool pages."""
        return min(self.pages_for(max_model_len), self.num_pages - 1)

    def write_location(self, request_id: str, position: int) -> int:
        pages = self.streams[request_id].pages
        return pages[position // self.page_size] * self.page_size + position % self.page_size
