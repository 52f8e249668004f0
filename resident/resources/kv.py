"""KVPool: the paged KV allocator and each request's stream of pages.

Page 0 is the sink: padding rows point at it and it is never handed out. A stream's pages hold its
tokens in order, `page_size` to a page; a request's token at position p lives at
`pages[p // page_size] * page_size + p % page_size`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from resident.resources.base import Resource

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

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - 1 - len(self._free)

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
        if need > len(self._free):
            return f"no free KV pages (needs {need}, {len(self._free)} free)"
        stream = self.streams.setdefault(request_id, KVStream())
        stream.pages.extend(self._free.pop() for _ in range(need))
        return None

    def commit(self, request_id: str, num_new: int) -> None:
        self.streams[request_id].length += num_new

    def free(self, request_id: str) -> list[int]:
        """Returns the freed pages (in stream order) so an offload can copy them first."""
        stream = self.streams.pop(request_id, None)
        if stream is None:
            return []
        self._free.extend(reversed(stream.pages))
        return stream.pages

    def restore(self, request_id: str, length: int) -> list[int] | str:
        """Gives a reloaded request fresh pages for `length` stored tokens, or a refusal."""
        need = self.pages_for(length)
        if need > len(self._free):
            return f"no free KV pages to reload (needs {need}, {len(self._free)} free)"
        pages = [self._free.pop() for _ in range(need)]
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
