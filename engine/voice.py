"""Voices as a client names them, and the cache of prefilled voice prefixes.

A voice is a list of references (transcript + audio, or transcript + codec codes). Its
key is a content hash, so two connections naming the same audio and text share one
prefix: the second copies the cached KV into its slot instead of prefilling.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from torch import Tensor


@dataclass(frozen=True, slots=True)
class ReferenceInput:
    text: str
    audio: bytes | None = None  # encoded audio in any common format
    codes: Tensor | None = None  # [C, frames], when already encoded (stored voices)

    def key(self) -> str:
        h = hashlib.sha256(self.text.encode())
        if self.codes is not None:
            h.update(b"codes")
            h.update(np.ascontiguousarray(self.codes.cpu().numpy()).tobytes())
        else:
            h.update(b"audio")
            h.update(self.audio or b"")
        return h.hexdigest()


@dataclass(frozen=True, slots=True)
class VoiceInput:
    references: tuple[ReferenceInput, ...] = ()

    @property
    def key(self) -> str:
        return hashlib.sha256("|".join(r.key() for r in self.references).encode()).hexdigest()[:32]


class LRUBytes:
    """An LRU map bounded by the bytes of its values (`nbytes(value)`)."""

    def __init__(self, budget_bytes: int, nbytes) -> None:
        self.budget = budget_bytes
        self._nbytes = nbytes
        self._items: OrderedDict[str, object] = OrderedDict()
        self.used = 0
        self.hits = self.misses = self.evictions = 0

    def get(self, key: str):
        value = self._items.get(key)
        if value is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: str, value) -> None:
        size = self._nbytes(value)
        if size > self.budget:
            return  # larger than the whole budget: not cached
        if key in self._items:
            self.used -= self._nbytes(self._items.pop(key))
        while self.used + size > self.budget and self._items:
            _, old = self._items.popitem(last=False)
            self.used -= self._nbytes(old)
            self.evictions += 1
        self._items[key] = value
        self.used += size

    def __contains__(self, key: str) -> bool:
        """Whether `key` is cached (a look only: no hit counted, its place unchanged)."""
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)
