"""PageCache: full KV pages kept by their block hash after the requests that wrote them leave.

A page's key chains its parent page's key and its own token ids (vLLM's block hash), so a key
names a whole prefix: two prompts share page j's key only if their first (j + 1) * page_size
tokens are equal. A cached page is read-only: only full prompt pages are cached, and a stream
writes only past its own length. Pages are reference-counted by the streams that hold them;
a cached page no stream holds is idle, and idle pages give way to KV pressure, least recently
used first (KVPool counts them as free).
"""

from __future__ import annotations

import array
import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence

PageKey = bytes  # a full page's key: SHA-256 of its parent page's key and its token ids
ROOT_KEY: PageKey = b""  # the parent key of a prompt's first page
ID_BYTES = 8  # a token id in a key's input: int64, native byte order


def salted_root(cache_salt: str | None) -> PageKey:
    """A prompt's first parent key: ROOT_KEY, or for a request with a `cache_salt` a key of
    its own (32 bytes, so no unsalted first page's input equals a salted one's), so prompts
    share cached pages only with requests of the same salt."""
    if cache_salt is None:
        return ROOT_KEY
    return hashlib.sha256(b"cache_salt:" + cache_salt.encode()).digest()


def page_keys(token_ids: Sequence[int], page_size: int,
              root: PageKey = ROOT_KEY) -> list[PageKey]:
    """The chained key of each full page of `token_ids` (a partial last page has none):
    SHA-256 over the parent page's key (the first page's: `root`) and the page's ids, as vLLM
    keys its blocks by default.
    A hash that is not collision resistant (Python's tuple hash, these keys before) lets a
    prompt crafted to collide with another's prefix be served that prefix's KV pages and GDN
    state, or poison them for the next request (vLLM's GHSA-rm76-4mrf-v9r8). ~40 ns a token
    on the 2-vCPU VM (a 1,280-token prompt 49 µs, the tuple hash 18)."""
    data = array.array("q", token_ids).tobytes()
    width = page_size * ID_BYTES
    keys, parent = [], root
    for start in range(0, len(data) - width + 1, width):
        parent = hashlib.sha256(parent + data[start:start + width]).digest()
        keys.append(parent)
    return keys


class PageCache:
    def __init__(self) -> None:
        self.page_of: dict[PageKey, int] = {}  # key -> page
        self.key_of: dict[int, PageKey] = {}  # page -> key
        self.refs: dict[int, int] = {}  # page -> streams holding it (every handed-out page)
        self.idle: OrderedDict[int, None] = OrderedDict()  # cached, unheld; LRU first
        self.num_evicted = 0

    @property
    def num_cached(self) -> int:
        return len(self.key_of)

    def hold(self, pages: Iterable[int]) -> None:
        """Streams took these pages (fresh from the free list, or shared cached ones)."""
        for page in pages:
            self.refs[page] = self.refs.get(page, 0) + 1
            self.idle.pop(page, None)

    def drop(self, pages: Iterable[int]) -> list[int]:
        """A stream let these pages go; returns the ones that are now free (unheld and not
        cached), in the given order. Unheld cached pages become idle, most recently used."""
        freed = []
        for page in pages:
            self.refs[page] -= 1
            if self.refs[page]:
                continue
            del self.refs[page]
            if page in self.key_of:
                self.idle[page] = None
            else:
                freed.append(page)
        return freed

    def evict(self) -> int:
        """The least recently used idle page, forgotten and handed back as free."""
        page, _ = self.idle.popitem(last=False)
        self.num_evicted += 1
        del self.page_of[self.key_of.pop(page)]
        return page

    def insert(self, key: PageKey, page: int) -> None:
        """Caches a held page that is now full under its key; a key already cached keeps
        its page (this one stays private and is freed when its stream leaves)."""
        if key not in self.page_of and page not in self.key_of:
            self.page_of[key] = page
            self.key_of[page] = key

    def match(self, keys: Sequence[PageKey]) -> list[int]:
        """The cached pages of the longest run of `keys` from the first."""
        pages = []
        for key in keys:
            page = self.page_of.get(key)
            if page is None:
                break
            pages.append(page)
        return pages

    def num_idle_of(self, pages: Iterable[int]) -> int:
        """How many of these pages are idle (holding them takes them out of the free count)."""
        return sum(page in self.idle for page in pages)
