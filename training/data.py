"""Training data: random crops of a prepared split with token-level augmentation, resumable exactly.

A split is one token stream `[bos] piece [eos] [bos] piece [eos] ...` (see training/prepare.py). Short pieces
are therefore concatenated with their separators rather than padded: the music21 corpus is mostly folk tunes
of a few hundred events, and padding them to max_seq_len would waste most of every batch. Crops start anywhere
in the stream, so every token is equally likely to be seen (long pieces are sampled in proportion to their
length).

With `infill_rate` > 0 a crop becomes, with that probability, an infill example (`infill_example`: a gap cut
out of it by time, the music after it, then before it, then the gap; musicrel.generation.fim has the layout),
so that one model continues and fills gaps.

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
from musicrel.generation import fim
from musicrel.midi.codec import shift_steps

STRETCH_FACTORS = (0.95, 0.975, 1.0, 1.025, 1.05)
# Augmentation changes the number of events (stretching may split or merge time shifts, transposing drops
# notes out of range), so a little more than needed is cropped before augmenting and the result is cut to
# length.
_CROP_MARGIN = 1.25
# An infill example's gap: INFILL_GAP_SECONDS long (uniform) where the crop holds it with at least
# INFILL_CONTEXT_SECONDS of music on each side and it takes at most INFILL_GAP_SHARE of the crop's tokens;
# otherwise a random span of the crop's events (INFILL_SPAN_SHARE of them, uniform).
INFILL_GAP_SECONDS = (4.0, 8.0)
INFILL_CONTEXT_SECONDS = 1.0
INFILL_GAP_SHARE = 0.5
INFILL_SPAN_SHARE = (0.1, 0.4)
INFILL_MIN_EVENTS = 8  # a crop whose longest piece holds fewer events stays a continuation example
INFILL_LOSSES = ("all", "gap")


def augment(codec, tokens: np.ndarray, semitones: int, factor: float, instrument: int = 0) -> np.ndarray:
    """Transpose and time-stretch a token sequence that may contain bos/eos/pad separators: the codec's
    event-level functions are applied between separators, which stay in place. `instrument`: the one in
    effect before the first token (a codec with instruments: drums are not transposed); a piece after a
    separator starts with the piano's, as its encoding does."""
    tokens = np.asarray(tokens)
    if semitones == 0 and factor == 1.0:
        return tokens
    special = codec.is_special(tokens)  # INSTRUMENT tokens are events: they stay in their piece
    if not special.any():
        return _augment_events(codec, tokens, semitones, factor, instrument)
    parts = []
    cuts = np.flatnonzero(special)
    prev = 0
    for c in cuts:
        if c > prev:
            parts.append(
                _augment_events(codec, tokens[prev:c], semitones, factor, instrument if not prev else 0)
            )
        parts.append(tokens[c : c + 1])
        prev = c + 1
    if prev < tokens.size:
        parts.append(_augment_events(codec, tokens[prev:], semitones, factor, instrument if not prev else 0))
    return np.concatenate(parts)


def instrument_at(codec, stream: np.ndarray, start: int, instrument_index: np.ndarray | None) -> int:
    """The instrument in effect before `stream[start]` (a codec with instruments; 0 otherwise): the last
    INSTRUMENT token before it in its piece. `instrument_index`: where the stream's INSTRUMENT tokens are
    (sorted), so a crop deep inside a drum solo need not scan back to it."""
    if instrument_index is None or not len(instrument_index):
        return 0
    k = int(np.searchsorted(instrument_index, start)) - 1
    if k < 0:
        return 0
    at = int(instrument_index[k])
    between = np.asarray(stream[at + 1 : start])
    if codec.is_special(between).any():  # a separator since: another piece, which starts with the piano
        return 0
    return int(stream[at]) - codec.instrument_offset


def _augment_events(
    codec, events: np.ndarray, semitones: int, factor: float, instrument: int = 0
) -> np.ndarray:
    if semitones:
        events = codec.transpose(events, semitones, instrument=instrument)
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
        infill_rate: float = 0.0,
        infill_loss: str = "all",
    ):
        """`sources`: (start, end, weight) of each source's part of the stream; a crop's source is drawn with
        probability proportional to weight x tokens (None: the whole stream, every token alike).
        `infill_rate`: the share of crops made infill examples (the codec needs infill tokens);
        `infill_loss`: which of their tokens are trained, "all" (future, past and gap; never the markers and
        the gap-length shifts, which are placed) or "gap"."""
        if not (isinstance(infill_rate, (int, float)) and 0.0 <= infill_rate <= 1.0):
            raise ConfigError(f"infill_rate must be in [0, 1], got {infill_rate!r}")
        if infill_loss not in INFILL_LOSSES:
            raise ConfigError(f"infill_loss must be one of {INFILL_LOSSES}, got {infill_loss!r}")
        if infill_rate > 0:
            fim.require_infill(codec)
        self.infill_rate, self.infill_loss = float(infill_rate), infill_loss
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
        # a codec with instruments: where its INSTRUMENT tokens are, so a crop knows which one it starts in
        self.instruments = (
            np.flatnonzero(codec.is_instrument(np.asarray(stream)))
            if augment and codec.instrument_offset is not None
            else None
        )

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
            playing = instrument_at(self.codec, self.stream, start, self.instruments)
            crop = augment(self.codec, crop, semitones, factor, playing).astype(np.int64)
        crop = crop[:want]
        if self.infill_rate > 0:
            # a generator of its own, so that infill_rate 0 draws exactly the crops it drew before
            irng = np.random.default_rng([self.seed, epoch, i, 1])
            if irng.random() < self.infill_rate:
                example = infill_example(self.codec, crop, irng, want)
                if example is not None:
                    tokens, roles = example
                    trained = roles != fim.PLACED if self.infill_loss == "all" else roles == fim.GAP
                    return _as_example(tokens, want, self.codec.pad_id, trained)
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


def _as_example(
    crop: np.ndarray, want: int, pad_id: int, trained: np.ndarray | None = None
) -> dict[str, torch.Tensor]:
    """inputs/targets of length want-1; a short tail is padded, and padded targets are -100 (ignored), as are
    the targets of tokens whose `trained` (bool per token of `crop`) is False."""
    n = crop.size
    if n < want:
        crop = np.concatenate([crop, np.full(want - n, pad_id, dtype=np.int64)])
    x = torch.from_numpy(crop[:-1].copy())
    y = torch.from_numpy(crop[1:].copy())
    if n < want:
        y[n - 1 :] = -100
    if trained is not None:
        skip = np.flatnonzero(~np.asarray(trained, dtype=bool)[1:])
        y[torch.from_numpy(skip)] = -100
    return {"inputs": x, "targets": y}


def infill_example(codec, crop: np.ndarray, rng: np.random.Generator, want: int):
    """A crop as an infill example of at most `want` tokens, (tokens, roles), or None when its longest piece
    has too few events (the caller keeps it a continuation example).

    The gap is cut from the crop's longest run between separators (a gap never spans two pieces): by time
    (INFILL_GAP_SECONDS) where that fits, else a random span of events; its edges lie on the time grid, and a
    shift that crosses one is split in two (`fim.split_at`). The future is bounded (fim.FUTURE_SHARE of
    `want`), the past cut at its start to fit; bos/eos mark a past/future that reaches its piece's
    start/end."""
    crop = np.asarray(crop, dtype=np.int64)
    special = codec.is_special(crop)
    bounds = np.concatenate([[-1], np.flatnonzero(special), [len(crop)]])
    lengths = np.diff(bounds) - 1
    k = int(np.argmax(lengths))
    a, b = int(bounds[k]) + 1, int(bounds[k + 1])
    run = crop[a:b]
    steps = shift_steps(codec)[run]
    clock = np.cumsum(steps) - steps  # the time of each token
    events = np.flatnonzero(steps == 0)
    if len(events) < INFILL_MIN_EVENTS:
        return None
    step_s = codec.config.step_ms / 1000.0
    first, last = int(clock[events[0]]), int(clock[events[-1]])
    gap = int(round(rng.uniform(*INFILL_GAP_SECONDS) / step_s))
    margin = int(round(INFILL_CONTEXT_SECONDS / step_s))
    lo, hi = first + margin, last - margin - gap + 1  # the gap starts in [lo, hi): music on both sides
    span = None
    if hi > lo:
        start = int(rng.integers(lo, hi))
        inside = int(((clock[events] >= start) & (clock[events] < start + gap)).sum())
        if inside <= INFILL_GAP_SHARE * len(events):
            span = (start, start + gap)
    if span is None:  # a random span of events, with an event before and after it
        times = np.unique(clock[events])
        if len(times) < 3:
            return None
        n = max(1, int(round(rng.uniform(*INFILL_SPAN_SHARE) * len(times))))
        n = min(n, len(times) - 2)
        i = int(rng.integers(1, len(times) - n))
        span = (int(times[i]), int(times[i + n]))
    past, middle, future = fim.split_at(codec, run, span)
    try:
        seq = fim.fim_sequence(
            codec,
            past,
            future,
            span[1] - span[0],
            middle,
            max_tokens=want,
            past_whole=a > 0 and crop[a - 1] == codec.bos_id,
            future_whole=b < len(crop) and crop[b] == codec.eos_id,
        )
    except ConfigError:  # the gap alone fills the example: keep the crop a continuation
        return None
    return seq.tokens, seq.roles


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
