"""PageCache: full KV pages kept by their block hash after the requests that wrote them leave.

A page's key chains its parent page's key and its own token ids (vLLM's block hash), so a key
names a whole prefix: two prompts share page j's key only if their first (j + 1) * page_size
tokens are equal. A cached page is read-only: only full prompt pages are cached, and a stream
writes only past its own length. Pages are reference-counted by the streams that hold them;
a cached page no stream holds is idle, and idle pages give way to KV pressure, least recently
used first (KVPool counts them as free).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

ROOT_KEY = 0  # the parent key of a prompt's first page


def page_keys(token_ids: Sequence[int], page_size: int) -> list[int]:
    """The chained key of each full page of `token_ids` (a partial last page has none).
    Python's hash of a tuple of ints is deterministic across processes (no hash seed)."""
    keys, parent = [], ROOT_KEY
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        parent = hash((parent, tuple(token_ids[start:start + page_size])))
        keys.append(parent)
    return keys


class PageCache:
    def __init__(self) -> None:
        self.page_of: dict[int, int] = {}  # key -> page
        self.key_of: dict[int, int] = {}  # page -> key
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

    def insert(self, key: int, page: int) -> None:
        """Caches a held page that is now full under its key; a key already cached keeps
        its page (this one stays private and is freed when its stream leaves)."""
        if key not in self.page_of and page not in self.key_of:
            self.page_of[key] = page
            self.key_of[page] = key

    def match(self, keys: Sequence[int]) -> list[int]:
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
