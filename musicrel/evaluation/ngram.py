"""An n-gram model over event tokens: the statistical baseline `evaluate-continuations` scores beside the
Music Transformer, fitted on the same training split.

Every order is smoothed towards the order below it (interpolated add-k):

    P_n(w | h) = (c(h w) + k·V·P_{n-1}(w | h')) / (c(h) + k·V),      P_0(w) = 1 / V

where h holds the n-1 tokens before w, h' is h without its oldest token and V the vocabulary size. Order 1 is
plain add-k; a context never seen (c(h) = 0) falls back to the shorter one. N-grams never span two pieces of
the `[bos] piece [eos] ...` stream, so a context that starts with bos means "the start of a piece", as it does
for the transformer.

Counts are sparse: per order, the sorted integer keys of the n-grams seen (tokens as digits base V) and their
counts; the continuations of a context h are the keys in [key(h)·V, key(h)·V + V), found by binary search.

Sampling runs the same `Grammar` as the transformer (no orphan note-off, no special token, notes closed after
the same hold, the requested length met to one step), so the baseline differs from the model in what it
learned, not in the rules it obeys.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from musicrel.data.prepared import has_split, load_manifest, load_split
from musicrel.errors import MusicrelError
from musicrel.generation.grammar import Grammar, max_hold_seconds
from musicrel.generation.sampling import TOKENS_PER_SECOND_CAP
from musicrel.midi.codec import CodecConfig

# Chosen on the val split of data/default, fitted on its train split (3.05 M tokens), in nats per event token:
# order 3 / 4 / 5 / 6 at their best k (0.1): 1.92 / 1.55 / 1.45 / 1.42; at order 5, k = 0.01 / 0.05 / 0.1 /
# 0.2 / 1: 1.53 / 1.45 / 1.45 / 1.46 / 1.58. Order 6 gains 0.02 for keys near the int64 limit.
DEFAULT_ORDER = 5
DEFAULT_K = 0.1


class NGramDataError(MusicrelError, ValueError):
    """A data folder the n-gram cannot be fitted on (not prepared, other codec, empty split)."""

    code = "invalid_ngram_data"


class NGramModel:
    def __init__(self, vocab_size: int, order: int = DEFAULT_ORDER, k: float = DEFAULT_K):
        if not (isinstance(order, int) and order >= 1 and float(vocab_size) ** order < 2**62):
            raise NGramDataError(f"order must be an integer >= 1 whose keys fit int64, got {order!r}")
        if not k > 0:
            raise NGramDataError(f"k must be > 0, got {k!r}")
        self.V, self.order, self.k = int(vocab_size), order, float(k)
        self.alpha = self.k * self.V  # pseudo-counts that pull an order towards the one below
        # per order n (index n - 1): sorted keys of the n-grams seen, their counts, and cumulative counts
        self.keys: list[np.ndarray] = []
        self.counts: list[np.ndarray] = []
        self._cum: list[np.ndarray] = []

    # ------------------------------------------------------------------------------------------ fitting
    def fit(self, stream, offsets) -> NGramModel:
        """Count the n-grams of `stream` (1-D token ids) whose tokens lie in one piece; `offsets` (n + 1,)
        are where each piece starts, the last one the stream's length (training/prepare.py's layout)."""
        stream = np.asarray(stream, dtype=np.int64)
        if len(stream) and (stream.min() < 0 or stream.max() >= self.V):
            raise NGramDataError(f"tokens must be in 0..{self.V - 1}")
        into_piece = _positions_in_piece(len(stream), offsets)
        self.keys, self.counts, self._cum = [], [], []
        for n, key in enumerate(self._rolling_keys(stream), start=1):
            keys, counts = np.unique(key[into_piece >= n - 1], return_counts=True)
            self.keys.append(keys)
            self.counts.append(counts.astype(np.int64))
            self._cum.append(np.concatenate([[0], np.cumsum(counts)]))
        return self

    @classmethod
    def from_prepared(
        cls, folder, codec, split: str = "train", order: int = DEFAULT_ORDER, k: float = DEFAULT_K
    ) -> NGramModel:
        """Fit on `split` of a folder written by `musicrel prepare`; its codec must be `codec`'s."""
        if not has_split(folder, split):
            raise NGramDataError(
                f"{folder} is not a prepared data folder with a {split} split (musicrel prepare)"
            )
        if CodecConfig.from_dict(load_manifest(folder).get("codec", {})) != codec.config:
            raise NGramDataError(f"{folder} was prepared with another codec than the checkpoint's")
        stream, offsets = load_split(folder, split)
        if len(stream) == 0:
            raise NGramDataError(f"the {split} split of {folder} is empty")
        return cls(codec.vocab_size, order, k).fit(stream, offsets)

    def _rolling_keys(self, stream: np.ndarray):
        """For n = 1..order: (len,) keys of the n-grams ending at each position (garbage before n - 1)."""
        key = stream.copy()
        yield key
        for n in range(2, self.order + 1):
            older = np.zeros_like(stream)
            older[n - 1 :] = stream[: len(stream) - n + 1]
            key = key + older * self.V ** (n - 1)
            yield key

    # ------------------------------------------------------------------------------------------ scoring
    def distribution(self, context: Sequence[int]) -> np.ndarray:
        """(V,) probabilities of the next token after `context` (only its last order - 1 tokens count)."""
        context = [int(t) for t in context[max(0, len(context) - (self.order - 1)) :]]
        p = np.full(self.V, 1.0 / self.V)
        for n in range(1, self.order + 1):
            if n - 1 > len(context):
                break
            h = 0
            for t in context[len(context) - (n - 1) :]:
                h = h * self.V + t
            keys = self.keys[n - 1]
            lo, hi = np.searchsorted(keys, [h * self.V, (h + 1) * self.V])
            total = self._cum[n - 1][hi] - self._cum[n - 1][lo]
            if total == 0:  # never seen, and neither is any longer context ending in it
                break
            q = self.alpha * p
            q[keys[lo:hi] - h * self.V] += self.counts[n - 1][lo:hi]
            p = q / (total + self.alpha)
        return p

    def nll(self, stream, offsets) -> tuple[float, int]:
        """(nats per token, tokens scored) of every token of each piece after its first (the bos)."""
        stream = np.asarray(stream, dtype=np.int64)
        into_piece = _positions_in_piece(len(stream), offsets)
        p = np.full(len(stream), 1.0 / self.V)
        seen = np.ones(len(stream), dtype=bool)  # the context of order n - 1 was seen: order n may help
        for n, key in enumerate(self._rolling_keys(stream), start=1):
            keys, counts, cum = self.keys[n - 1], self.counts[n - 1], self._cum[n - 1]
            h = key // self.V  # the context's key (0 for n = 1: the empty context)
            lo, hi = np.searchsorted(keys, h * self.V), np.searchsorted(keys, h * self.V + self.V)
            total = cum[hi] - cum[lo]
            at = np.minimum(np.searchsorted(keys, key), len(keys) - 1)  # fitted on >= 1 token: never empty
            c = np.where(keys[at] == key, counts[at], 0)
            seen &= (into_piece >= n - 1) & (total > 0)
            p = np.where(seen, (c + self.alpha * p) / np.maximum(total + self.alpha, 1e-300), p)
        scored = into_piece >= 1
        return float(-np.log(p[scored]).mean()), int(scored.sum())

    # ------------------------------------------------------------------------------------------ sampling
    def sample(self, codec, jobs: Sequence[tuple], seconds: float) -> list[np.ndarray]:
        """Continue each (primer, seed) of `jobs` for `seconds` of music; one token array per job.

        Each job draws from its own numpy generator seeded by `seed` alone, so its tokens do not depend on the
        other jobs. The rows run together through one `Grammar` (the transformer's rules)."""

        step_ms = codec.config.step_ms
        # As DecodeBatch.admit sets them: the time limit and the hold, in steps.
        limit = max(1, math.ceil(seconds * 1000.0 / step_ms - 1e-9))
        holds = [round(max_hold_seconds(primer) * 1000.0 / step_ms) for primer, _ in jobs]
        contexts = [list(np.asarray(primer.tokens, dtype=np.int64)) for primer, _ in jobs]
        tails = [primer.tail_steps for primer, _ in jobs]  # it starts at the cut as the transformer does
        grammar = Grammar(codec, [np.asarray(c) for c in contexts], [limit] * len(jobs), holds, tails=tails)
        rngs = [np.random.default_rng(seed) for _, seed in jobs]
        out: list[list[int]] = [[] for _ in jobs]
        live = list(range(len(jobs)))
        max_new = int(seconds * TOKENS_PER_SECOND_CAP) + 64
        with np.errstate(divide="ignore"):  # log(0) = -inf: tokens the n-gram rules out
            while live:
                logp = np.log(np.stack([self.distribution(contexts[r]) for r in live]))  # (B, V)
                probs = torch.softmax(grammar.constrain(torch.from_numpy(logp)), dim=-1).double().numpy()
                drawn = [_draw(p, rngs[r]) for p, r in zip(probs, live, strict=True)]
                tokens = grammar.advance(torch.as_tensor(drawn)).tolist()
                for r, t in zip(live, tokens, strict=True):
                    out[r].append(t)
                    contexts[r].append(t)
                done = (grammar.elapsed >= grammar.limit).tolist()
                keep = [not d and len(out[r]) < max_new for r, d in zip(live, done, strict=True)]
                if not all(keep):
                    grammar.select(torch.as_tensor(np.flatnonzero(keep)))
                    live = [r for r, kept in zip(live, keep, strict=True) if kept]
        return [np.asarray(o, dtype=np.int64) for o in out]


def _draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token by inverse CDF with one uniform from `rng`; never a token of probability 0."""
    cdf = np.cumsum(probs)
    index = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(index, int(np.flatnonzero(probs)[-1]))  # rounding may reach the top: the last possible token


def _positions_in_piece(length: int, offsets) -> np.ndarray:
    """(length,) index of each position within its piece (0 at the piece's first token)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    starts = offsets[:-1] if len(offsets) > 1 else np.zeros(1, dtype=np.int64)
    if len(offsets) < 2 or offsets[0] != 0 or offsets[-1] != length or np.any(np.diff(offsets) < 0):
        raise NGramDataError(f"offsets must rise from 0 to the stream length {length}")
    pos = np.arange(length)
    return pos - starts[np.searchsorted(starts, pos, side="right") - 1]
