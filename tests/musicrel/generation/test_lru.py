"""The one LRU cache (the decoder's primer K/V, the server's parsed motifs)."""

from __future__ import annotations

from musicrel.generation.lru import LRU


def test_keeps_the_most_recently_used_and_size_zero_keeps_nothing():
    cache = LRU(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recent...
    cache.put("c", 3)  # ...so b goes
    assert "b" not in cache and cache.get("b") is None and len(cache) == 2
    assert cache.get("a") == 1 and cache.get("c") == 3
    assert "a" in cache  # looking does not count as a use
    cache.put("d", 4)
    assert "a" not in cache and "c" in cache
    off = LRU(0)
    off.put("a", 1)
    assert off.get("a") is None and len(off) == 0
