"""Versions of one composition, found from the notes: so that train/val/test are split by composition
(`musicrel prepare`) and the real-vs-generated classifier folds by composition on a plain folder of MIDI
(`musicrel evaluate-continuations`).

A piece often exists several times in a corpus (ASAP holds up to 16 performances of one piece and its score; a
piece can be in two collections under different names), and a file split would then test on what was trained.
File names do not tell, so the notes do: two files are versions of one composition when a large share of their
melodic n-grams is shared.

- A file's *shingles*: its onsets (note-ons within `ONSET_WINDOW_S` of the first of a group count as one
  chord) reduced to the top voice, as the interval sequence between successive top notes (so a transposed copy
  matches), cut into n-grams of `NGRAM` intervals. Performance timing, pedalling and inner voices change; the
  melody's intervals mostly do not.
- Candidates come from datasketch's MinHash LSH (no quadratic comparison of 17 k files), and each candidate
  pair is confirmed on the exact sets: `containment` = shared / smaller set >= `CONTAINMENT`, which also
  matches an excerpt with its whole.
- An n-gram found in more than `MAX_FILES_PER_SHINGLE` files is a common figure (a scale, a repeated note),
  not a composition's: it is dropped before comparing, or a folk tune would be "contained" in every long
  performance and chain them all into one group (measured: a group of 586 files without this rule).
- Groups are the connected components of confirmed pairs. Files with fewer than `MIN_SHINGLES` shingles (a
  short folk tune, a drum loop) are left alone: their few n-grams are too common to tell a version by.

Calibrated on ASAP, whose folders name the piece: containment between two versions of a piece is >= 0.16 for
99 % of pairs, between two different pieces <= 0.08 for 99.9 %.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from musicrel.errors import MusicrelError
from musicrel.midi.instruments import DRUMS, current_instrument

ONSET_WINDOW_S = 0.05
NGRAM = 6
MIN_SHINGLES = 24
CONTAINMENT = 0.15
LSH_THRESHOLD = 0.05
NUM_PERM = 128
MAX_FILES_PER_SHINGLE = 40


class CompositionsUnavailable(MusicrelError):
    """datasketch is not installed: the versions of one composition cannot be found."""

    code = "compositions_unavailable"


def shingles(codec, tokens: np.ndarray, n: int = NGRAM) -> set[bytes]:
    """The top-voice interval n-grams of one file's event tokens (drums left out)."""
    toks = np.asarray(tokens).astype(np.int64)
    if codec.instrument_offset is not None:  # a drum kit has no top voice: its notes are left out
        playing = current_instrument(toks, codec.is_instrument(toks), codec.instrument_offset)
        toks = toks[~(codec.is_note_on(toks) & (playing == DRUMS))]
    toks = toks[toks < codec.pad_id]
    if toks.size == 0:
        return set()
    times = np.cumsum(codec.time_advance[toks])
    on = codec.is_note_on(toks)
    pitch, t = toks[on] - codec.note_on_offset, times[on]
    if pitch.size < n + 1:
        return set()
    # a new chord starts where an onset is more than the window after the chord's first onset
    starts = [0]
    for i in range(1, t.size):
        if t[i] - t[starts[-1]] > ONSET_WINDOW_S:
            starts.append(i)
    top = np.maximum.reduceat(pitch, np.asarray(starts))
    steps = np.diff(top).clip(-127, 127).astype(np.int8)
    if steps.size < n:
        return set()
    windows = np.lib.stride_tricks.sliding_window_view(steps, n)
    return {w.tobytes() for w in windows}


@dataclass
class Grouping:
    """`group[i]` = index of the group of file i (the smallest member index); pairs = confirmed (i, j, c)."""

    group: list[int]
    pairs: list[tuple[int, int, float]]

    def members(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for i, g in enumerate(self.group):
            out.setdefault(g, []).append(i)
        return out


def containment(a: set, b: set) -> float:
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    return len(small & large) / max(1, len(small))


def group_versions(
    sets: list[set[bytes]],
    threshold: float = CONTAINMENT,
    min_shingles: int = MIN_SHINGLES,
    max_files: int = MAX_FILES_PER_SHINGLE,
    seed: int = 1,
) -> Grouping:
    """Connected components of files whose shingle sets, less the n-grams of more than `max_files` files,
    overlap by `threshold` (containment). Raises CompositionsUnavailable without datasketch."""
    try:
        from datasketch import MinHash, MinHashLSH
    except ImportError as exc:
        raise CompositionsUnavailable(
            "datasketch is not installed, and finding the versions of one composition needs it: "
            "pip install 'musicrel[eval]' (or '[train]'; make test does)"
        ) from exc

    parent = list(range(len(sets)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    counts: dict[bytes, int] = {}
    for s in sets:
        for x in s:
            counts[x] = counts.get(x, 0) + 1
    common = {x for x, n in counts.items() if n > max_files}
    sets = [s - common for s in sets]
    lsh = MinHashLSH(threshold=LSH_THRESHOLD, num_perm=NUM_PERM)
    hashes: dict[int, MinHash] = {}
    for i, s in enumerate(sets):
        if len(s) < min_shingles:
            continue
        m = MinHash(num_perm=NUM_PERM, seed=seed)
        m.update_batch(list(s))
        hashes[i] = m
        lsh.insert(i, m)
    pairs = []
    for i, m in hashes.items():
        for j in lsh.query(m):
            if j <= i:
                continue
            c = containment(sets[i], sets[j])
            if c >= threshold:
                pairs.append((i, j, round(c, 3)))
                a, b = find(i), find(j)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    return Grouping([find(i) for i in range(len(sets))], sorted(pairs))
