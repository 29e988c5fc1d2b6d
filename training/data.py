"""Training data: random crops of a prepared split with token-level augmentation, resumable exactly.

A split is one token stream `[bos] piece [eos] [bos] piece [eos] ...` (see training/prepare.py). Short pieces
are therefore concatenated with their separators rather than padded: the music21 corpus is mostly folk tunes
of a few hundred events, and padding them to max_seq_len would waste most of every batch. Crops start anywhere
in the stream, so every token is equally likely to be seen (long pieces are sampled in proportion to their
length).

Example `i` of epoch `e` is a pure function of (seed, e, i): `CropDataset[e * len + i]`. The sampler yields
those global indices from a start position, and `ResumableLoader` reports how many batches it has handed out,
which Lightning stores in its checkpoints (`state_dict`/`load_state_dict` of a dataloader) -- so a resumed run
sees exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from musicrel.errors import ConfigError

STRETCH_FACTORS = (0.95, 0.975, 1.0, 1.025, 1.05)
# Augmentation changes the number of events (stretching may split or merge time shifts, transposing drops
# notes out of range), so a little more than needed is cropped before augmenting and the result is cut to
# length.
_CROP_MARGIN = 1.25


def augment(codec, tokens: np.ndarray, semitones: int, factor: float) -> np.ndarray:
    """Transpose and time-stretch a token sequence that may contain bos/eos/pad separators: the codec's
    event-level functions are applied between separators, which stay in place."""
    tokens = np.asarray(tokens)
    if semitones == 0 and factor == 1.0:
        return tokens
    special = tokens >= codec.pad_id
    if not special.any():
        return _augment_events(codec, tokens, semitones, factor)
    parts = []
    cuts = np.flatnonzero(special)
    prev = 0
    for c in cuts:
        if c > prev:
            parts.append(_augment_events(codec, tokens[prev:c], semitones, factor))
        parts.append(tokens[c : c + 1])
        prev = c + 1
    if prev < tokens.size:
        parts.append(_augment_events(codec, tokens[prev:], semitones, factor))
    return np.concatenate(parts)


def _augment_events(codec, events: np.ndarray, semitones: int, factor: float) -> np.ndarray:
    if semitones:
        events = codec.transpose(events, semitones)
    if factor != 1.0:
        events = codec.stretch(events, factor)
    return np.asarray(events)


class CropDataset(Dataset):
    """Random crops of `seq_len + 1` tokens of a token stream (inputs = [:-1], targets = [1:])."""

    def __init__(
        self,
        stream: np.ndarray,
        seq_len: int,
        codec,
        length: int,
        seed: int = 0,
        transpose: int = 3,
        stretch: tuple[float, ...] = STRETCH_FACTORS,
        augment: bool = True,
        sources: list[tuple[int, int, float]] | None = None,
    ):
        """`sources`: (start, end, weight) of each source's part of the stream; a crop's source is drawn with
        probability proportional to weight x tokens (None: the whole stream, every token alike)."""
        if stream.size < 2:
            raise ConfigError("the training split has fewer than 2 tokens; prepare more data", code="no_data")
        self.stream, self.seq_len, self.codec = stream, seq_len, codec
        self.length, self.seed = max(1, int(length)), int(seed)
        self.transpose, self.stretch, self.augment = int(transpose), tuple(stretch), augment
        parts = [(int(a), int(b), float(w)) for a, b, w in sources or [] if b > a and w > 0]
        mass = np.array([(b - a) * w for a, b, w in parts])
        # one part covering the stream draws exactly as before: same crops for the same seed
        whole = len(parts) == 1 and parts[0][:2] == (0, stream.size)
        if sources is not None and not parts:
            raise ConfigError("no source of the training split has tokens and a weight > 0", code="no_data")
        self.parts = None if sources is None or whole else parts
        self.cum = np.cumsum(mass) / mass.sum() if self.parts else None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        epoch, i = divmod(int(index), self.length)
        rng = np.random.default_rng([self.seed, epoch, i])
        want = self.seq_len + 1
        take = want if not self.augment else int(want * _CROP_MARGIN) + 16
        if self.parts is None:
            start = int(rng.integers(0, max(1, self.stream.size - want + 1)))
        else:
            k = min(int(np.searchsorted(self.cum, rng.random(), side="right")), len(self.parts) - 1)
            a, b, _ = self.parts[k]
            start = int(rng.integers(a, max(a + 1, b - want + 1)))
        crop = np.asarray(self.stream[start : start + take], dtype=np.int64)
        if self.augment:
            semitones = int(rng.integers(-self.transpose, self.transpose + 1))
            factor = float(self.stretch[int(rng.integers(len(self.stretch)))])
            crop = augment(self.codec, crop, semitones, factor).astype(np.int64)
        crop = crop[:want]
        return _as_example(crop, want, self.codec.pad_id)


class WindowDataset(Dataset):
    """Non-overlapping windows of a stream for evaluation: window k predicts tokens k*L+1 .. (k+1)*L."""

    def __init__(self, stream: np.ndarray, seq_len: int, pad_id: int, limit: int | None = None):
        self.stream, self.seq_len, self.pad_id = stream, seq_len, pad_id
        n = max(0, (stream.size - 2) // seq_len + 1) if stream.size >= 2 else 0
        self.n = n if limit is None else min(n, limit)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> dict[str, torch.Tensor]:
        a = k * self.seq_len
        crop = np.asarray(self.stream[a : a + self.seq_len + 1], dtype=np.int64)
        return _as_example(crop, self.seq_len + 1, self.pad_id)


def _as_example(crop: np.ndarray, want: int, pad_id: int) -> dict[str, torch.Tensor]:
    """inputs/targets of length want-1; a short tail is padded, and padded targets are -100 (ignored)."""
    n = crop.size
    if n < want:
        crop = np.concatenate([crop, np.full(want - n, pad_id, dtype=np.int64)])
    x = torch.from_numpy(crop[:-1].copy())
    y = torch.from_numpy(crop[1:].copy())
    if n < want:
        y[n - 1 :] = -100
    return {"inputs": x, "targets": y}


class ResumableSampler(DistributedSampler):
    """Yields global indices epoch * n + i, for this rank's share of i (rank, rank + W, ...), from `start`
    (the resume position, in examples of this rank) on.

    It subclasses DistributedSampler so that Lightning's DDP leaves it in place instead of wrapping it (a
    wrapper would hide the epoch and the resume position); the parent's __init__, which wants a process
    group, is not needed: the rank and world size come from the trainer.
    """

    def __init__(self, n: int, num_replicas: int = 1, rank: int = 0):
        self.n, self.num_replicas, self.rank = int(n), int(num_replicas), int(rank)
        self.epoch, self.start = 0, 0
        # read by Lightning; no shuffling needed: every index is a random crop anyway
        self.shuffle, self.drop_last, self.seed = False, False, 0

    def set_epoch(self, epoch: int) -> None:  # Lightning calls this before each epoch
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.num_replicas))

    def __iter__(self):
        start, self.start = self.start, 0  # the resume offset applies to one epoch only
        base = self.epoch * self.n
        yield from range(base + self.rank + start * self.num_replicas, base + self.n, self.num_replicas)


class ResumableLoader(DataLoader):
    """A DataLoader whose position (epoch, batches handed out) goes into Lightning checkpoints.

    Lightning saves `state_dict()` of a train dataloader with the loop state and calls `load_state_dict` when
    it resumes; the position is applied when the matching epoch starts iterating. Lightning does not prefetch
    from a loader with a length, so the count is exactly the batches trained on when a checkpoint is written.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._epoch, self._batches, self._pending = 0, 0, None

    def __iter__(self):
        sampler = self.sampler
        self._epoch, self._batches = getattr(sampler, "epoch", 0), 0
        pending, self._pending = self._pending, None
        if (
            pending is not None
            and isinstance(sampler, ResumableSampler)
            and pending["epoch"] == sampler.epoch
        ):
            self._batches = int(pending["batches"])
            sampler.start = min(self._batches * self.batch_size, len(sampler))
        for batch in super().__iter__():
            self._batches += 1
            yield batch

    def state_dict(self) -> dict:
        return {"epoch": self._epoch, "batches": self._batches}

    def load_state_dict(self, state: dict) -> None:
        self._pending = {"epoch": int(state["epoch"]), "batches": int(state["batches"])}
