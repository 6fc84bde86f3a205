"""KV pages: the slow transformer's KV cache as a fixed pool of fixed-size pages, handed to
streams as their contexts grow and returned on rollback, eviction and close. A voice
prompt's pages are shared, read-only, by every stream of that voice (refcounted), and
kept warm by an LRU of cached voices while the pool has room.

Plain Python, under the engine's lock; the device side (engine/kv_cache.py) holds the
pool's tensors and each stream's page-table row. Page 0 is the scratch page: padded rows
of a batch read and write it; it is never handed out.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field

SCRATCH_PAGE = 0
_VOICE_IDS = itertools.count(1)


class PagePool:
    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 2:
            raise ValueError(f"a page pool needs the scratch page and at least one more, got {num_pages}")
        if page_size < 1 or page_size & (page_size - 1):
            raise ValueError(f"page size must be a power of two, got {page_size}")
        self.page_size = page_size
        self.num_pages = num_pages
        self.refs = [0] * num_pages
        self.refs[SCRATCH_PAGE] = 1  # never released
        self._free = list(range(num_pages - 1, SCRATCH_PAGE, -1))  # pop() gives the lowest

    @property
    def capacity(self) -> int:
        """Pages that can be handed out (all but the scratch page)."""
        return self.num_pages - 1

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.capacity - self.free

    def pages_for(self, positions: int) -> int:
        return -(-positions // self.page_size)

    def alloc(self, n: int) -> list[int] | None:
        """n fresh pages (refcount 1), or None when fewer are free (all or nothing)."""
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self.refs[p] = 1
        return pages

    def retain(self, pages) -> None:
        for p in pages:
            if self.refs[p] < 1 or p == SCRATCH_PAGE:
                raise RuntimeError(f"page {p} is not held: cannot share it")
            self.refs[p] += 1

    def release(self, pages) -> None:
        for p in pages:
            if self.refs[p] < 1 or p == SCRATCH_PAGE:
                raise RuntimeError(f"page {p} released while not held (double free)")
            self.refs[p] -= 1
            if self.refs[p] == 0:
                self._free.append(p)

    def shared(self, page: int) -> bool:
        """Held by more than one owner: read-only (a write needs a private copy)."""
        return self.refs[page] > 1


@dataclass(slots=True, eq=False)
class VoicePages:
    """A voice prompt's KV: `length` positions in `pages` (the last one partly filled)."""

    pages: tuple[int, ...]
    length: int
    ident: int = field(default_factory=lambda: next(_VOICE_IDS))


class VoiceCache:
    """Cached voice prompts by voice key, each holding one reference on its pages, least
    recently used first out: past `max_pages`, or when the pool runs short (`reclaim`)."""

    def __init__(self, pool: PagePool, max_pages: int) -> None:
        self.pool = pool
        self.max_pages = max_pages
        self._items: OrderedDict[str, VoicePages] = OrderedDict()
        self.pages = 0
        self.hits = self.misses = self.evictions = 0

    def get(self, key: str) -> VoicePages | None:
        voice = self._items.get(key)
        if voice is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return voice

    def put(self, key: str, voice: VoicePages) -> None:
        """Cache `voice` (takes its own reference on the pages)."""
        if len(voice.pages) > self.max_pages:
            return
        self._drop(key)
        self.pool.retain(voice.pages)
        self._items[key] = voice
        self.pages += len(voice.pages)
        while self.pages > self.max_pages:
            self._drop(next(iter(self._items)))
            self.evictions += 1

    def _unused(self, voice: VoicePages) -> bool:
        """Held by the cache alone: dropping it frees its pages."""
        return all(self.pool.refs[p] == 1 for p in voice.pages)

    def unused_pages(self) -> int:
        """Pages `reclaim` could free."""
        return sum(len(v.pages) for v in self._items.values() if self._unused(v))

    def reclaim(self, wanted_free: int) -> None:
        """Drop least recently used voices no stream holds until `wanted_free` pages are
        free (or none is left to drop); voices in use would free nothing."""
        for key in list(self._items):
            if self.pool.free >= wanted_free:
                return
            if self._unused(self._items[key]):
                self._drop(key)
                self.evictions += 1

    def _drop(self, key: str) -> None:
        voice = self._items.pop(key, None)
        if voice is not None:
            self.pool.release(voice.pages)
            self.pages -= len(voice.pages)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)
