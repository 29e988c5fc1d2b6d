"""`LRU`: the few most recently used entries of a cache. The two primer caches share it: the decoder's K/V
of recent primers (DecodeBatch) and the server's recently parsed motifs."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class LRU(Generic[V]):
    def __init__(self, size: int) -> None:
        self.size = size  # 0: keeps nothing
        self._entries: OrderedDict[Hashable, V] = OrderedDict()

    def get(self, key: Hashable) -> V | None:
        """The entry (now the most recently used), or None."""
        if key not in self._entries:
            return None
        self._entries.move_to_end(key)
        return self._entries[key]

    def put(self, key: Hashable, value: V) -> None:
        """Keep `value`, dropping the least recently used entries beyond `size`."""
        if self.size <= 0:
            return
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def __contains__(self, key: Hashable) -> bool:  # a look that does not count as a use
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
