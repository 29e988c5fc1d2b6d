"""One random stream per decoding row, drawn for every row at once: `RowRandom`.

A row's t-th draw is a function of its seed and t alone (counter-based), so a row draws the same numbers
whatever batch it shares, whenever it joins, and on any device: rows join (`extend`) and leave (`select`) a
running batch and keep their streams. A batch of B rows costs a dozen integer tensor operations per draw,
where one torch.Generator per row cost a Python loop over the rows (and one tiny operation each).

The stream: a 32-bit Weyl sequence (key + t x step, mod 2**32; the step odd, so its period is 2**32) fed to
a 32-bit integer hash (Wellons' hash-prospector `lowbias32`, with TheIronBorn's lower-bias constants). Both of
its multipliers are below 2**31, so every product of a 32-bit state fits an int64 exactly: no operation
relies on integer overflow, which torch leaves undefined. The key and step of a row come from its seed
through SplitMix64 (in Python, once per row).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF
_MASK64 = 0xFFFFFFFFFFFFFFFF
_MIX1, _MIX2 = 0x21F0AAAD, 0x735A2D97  # lowbias32 (bias 0.107): both < 2**31
_UNIT = 2.0**-24  # a draw keeps the hash's top 24 bits: exactly a float32 in [0, 1 - 2**-24]


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def row_keys(seed: int) -> tuple[int, int]:
    """(key, step) of the stream of `seed` (any int): 32 bits each, the step odd."""
    bits = _splitmix64(int(seed) & _MASK64)
    return bits & _MASK32, (bits >> 32) | 1


# Draws a row makes at once when decoding eagerly (`RowRandom.ahead`): the hash's dozen tensor operations
# once per AHEAD steps instead of once a step, the same numbers.
AHEAD = 64


class RowRandom:
    """Per-row uniform streams, (B,) at a time: `uniform()` is each row's next draw, `ahead()` the same draw
    taken from a block made AHEAD at a time. Rows follow the batch with `select` and `extend`, as the
    grammar's state does."""

    def __init__(self, seeds: Sequence[int], device=None):
        keys = [row_keys(s) for s in seeds]
        self.state = torch.tensor([k for k, _ in keys], dtype=torch.long, device=device).reshape(-1)  # (B,)
        self.step = torch.tensor([s for _, s in keys], dtype=torch.long, device=device).reshape(-1)  # (B,)
        self._block: Tensor | None = None  # (B, AHEAD) draws after `state`, `_used` of them taken
        self._used = 0

    def __len__(self) -> int:
        return self.state.size(0)

    def uniform(self) -> Tensor:
        """(B,) float32 in [0, 1): every row's next draw (each stream moves on by one). A captured decoding
        step replays this (its state a tensor it moves on, no Python count)."""
        self.flush()
        self.state = x = (self.state + self.step) & _MASK32
        return _unit(x)

    def ahead(self) -> Tensor:
        """The draw `uniform()` would give, from a block of the next AHEAD draws of every row made at once;
        `state` stays at the block's start until `flush`."""
        if self._block is None or self._used == AHEAD:
            self.flush()
            t = torch.arange(1, AHEAD + 1, device=self.state.device)  # the Weyl sequence's next AHEAD terms
            self._block = _unit((self.state.unsqueeze(1) + self.step.unsqueeze(1) * t) & _MASK32)
        u = self._block.select(1, self._used)
        self._used += 1
        return u

    def flush(self) -> None:
        """Move `state` past the draws `ahead` has given and forget the rest of its block."""
        if self._block is not None:
            self.state = (self.state + self.step * self._used) & _MASK32
            self._block, self._used = None, 0

    def select(self, rows) -> None:
        """Keep only `rows` (an index tensor or list), in that order."""
        self.flush()
        self.state, self.step = self.state[rows], self.step[rows]

    def extend(self, other: RowRandom) -> None:
        """Append the rows of `other`."""
        self.flush()
        other.flush()
        self.state = torch.cat([self.state, other.state])
        self.step = torch.cat([self.step, other.step])


def _unit(x: Tensor) -> Tensor:
    """lowbias32 of 32-bit states (any shape) -> float32 in [0, 1 - 2**-24]."""
    x = x ^ (x >> 16)
    x = (x * _MIX1) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _MIX2) & _MASK32
    x = x ^ (x >> 15)
    return (x >> 8).float() * _UNIT
