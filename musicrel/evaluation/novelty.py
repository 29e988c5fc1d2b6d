"""Novelty: the longest stretch of a note sequence that also occurs in the training data, and where.

A note sequence becomes a string of symbols, one per pair of successive notes: (pitch interval, onset-gap
bin). Intervals make the comparison transposition-invariant; gaps (differences of onsets) make it
shift-invariant. Every training piece's string goes into one stream, pieces separated by a symbol no query
contains, and a suffix array over the stream answers "what is the longest substring of this query that occurs
in the stream" with a binary search per query position: the suffix sharing the longest prefix with a string
is next to that string's insertion point in sorted order. All query positions are searched at once (numpy,
vectorised over the query), so a query costs O(m log N) symbol comparisons: a few ms for a 20 s continuation
against millions of notes (see `tests/musicrel/evaluation/test_novelty.py`, and docs/EVALUATION.md's Novelty
section for measured figures).

Conventions a caller can rely on:
- Notes are ordered by onset (rounded to `ONSET_STEP`, the codec's 10 ms grid), then pitch; simultaneous
  notes are therefore read bottom-up with gap 0, as `continuations.repetition` reads them. Chords thus
  compare as their voicing (the intervals stacked from the bass), and a chord with one added note breaks a
  match: a copy is a copy of notes, not of harmony.
- Gaps fall into quarter-octave bins centred on powers of two (0.125, 0.25, 0.5, 1 s ... are bin centres,
  so score-like rhythms at 60/120 bpm sit 9 % away from an edge and a one-step jitter does not break a
  match); gaps under 34 ms count as simultaneous; gaps over 3.7 s share one bin.
- A match of L symbols covers L + 1 notes; `seconds` is the onset span of those notes (from the first copied
  onset to the last; the last note's length is not compared). No shared interval at all gives 0 notes and
  no source. When several pieces contain the longest stretch, one is reported (deterministic) and
  `occurrences` counts the positions in the training data where it occurs.
- The index file is a compressed `.npz` of numpy arrays only (loaded with allow_pickle=False)
  with a JSON header holding its format name, version, the bins it was built with (queries use the file's
  bins, not this module's) and the piece names. Missing, corrupt or other-version files raise
  `NoveltyIndexError` with codes `novelty_index_missing`, `novelty_index_corrupt`, `novelty_index_version`
  (and `novelty_index_too_large` when building from more than 2^31 notes).
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from musicrel.errors import MusicrelError

FORMAT = "musicrel-novelty-index"
FORMAT_VERSION = 1
INDEX_FILE = "novelty.npz"
ONSET_STEP = 0.01  # seconds; the codec's default grid, so training and generated onsets compare exactly
# Quarter-octave bin edges at 2^((2j+1)/8) s: centres at 2^(j/4), i.e. on 0.125, 0.25, 0.5, 1, 2 s.
GAP_EDGES = tuple(float(2.0 ** ((2 * j + 1) / 8)) for j in range(-20, 8))  # 0.034 .. 3.67 s, 29 bins
MAX_INTERVAL = 127
_SEPARATOR = -1  # between pieces: below every note symbol, never in a query, so no match crosses pieces
_CORPUS_END = -2  # past the stream's end: a suffix that ends sorts before its extensions
_QUERY_END = -3  # past the query's end: never equal to anything, so every comparison stops there
_QUERY_HIGH = np.iinfo(np.int16).max  # above every symbol (255 intervals x 29 gap bins < 7,400)
_WINDOW = 16  # symbols compared per gather; rows still tied after it (long matches) take another window


class NoveltyIndexError(MusicrelError):
    """A novelty index file is missing, unreadable, or of another format version."""

    code = "novelty_index_corrupt"


@dataclass(frozen=True)
class Match:
    """The longest stretch of a query that occurs in the training data."""

    notes: int  # notes in the stretch (symbols + 1); 0 when not even one interval is shared
    seconds: float  # onset span of the stretch in the query
    source: str | None  # name of a training piece that contains it
    source_sha256: str | None
    start_time_in_source: float | None  # onset of its first note in that piece (seconds)
    start_time: float | None  # onset of its first note in the query (seconds)
    occurrences: int  # positions in the training data where the stretch occurs (>= 1 when notes > 0)


def symbols_of(pitch, onset, gap_edges=GAP_EDGES, onset_step: float = ONSET_STEP):
    """(symbols int16 [n-1], onsets float64 [n]) of notes given as pitch and onset arrays, ordered by
    (rounded onset, pitch) as the module docstring says."""
    pitch = np.asarray(pitch, dtype=np.int64)
    steps = np.floor(np.asarray(onset, dtype=np.float64) / onset_step + 0.5).astype(np.int64)
    order = np.lexsort((pitch, steps))
    pitch, steps = pitch[order], steps[order]
    interval = np.clip(np.diff(pitch), -MAX_INTERVAL, MAX_INTERVAL) + MAX_INTERVAL
    gap = np.digitize(np.diff(steps) * onset_step, np.asarray(gap_edges))
    symbols = (interval * (len(gap_edges) + 1) + gap).astype(np.int16)
    return symbols, steps * onset_step


def _pitch_onset(notes) -> tuple[np.ndarray, np.ndarray]:
    """Arrays of pitch and onset from pretty_midi.Note-like objects (anything with .pitch and .start)."""
    pitch = np.fromiter((n.pitch for n in notes), dtype=np.int64)
    onset = np.fromiter((n.start for n in notes), dtype=np.float64, count=len(pitch))
    return pitch, onset


def suffix_array(stream: np.ndarray) -> np.ndarray:
    """int32 suffix array of an integer array (prefix doubling: one sort per doubling of the longest
    repeat's length; the end of the array sorts before every symbol)."""
    n = len(stream)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    rank = np.unique(stream, return_inverse=True)[1].astype(np.int64).reshape(-1)
    k = 1
    while True:
        second = np.zeros(n, dtype=np.int64)
        second[: n - k] = rank[k:] + 1
        key = rank * (n + 1) + second
        sa = np.argsort(key)
        sorted_key = key[sa]
        rank = np.empty(n, dtype=np.int64)
        rank[sa] = np.concatenate(([0], np.cumsum(sorted_key[1:] != sorted_key[:-1])))
        if rank[sa[-1]] == n - 1 or k >= n:
            return sa.astype(np.int32)
        k *= 2


class NoveltyIndex:
    """Suffix array over the training pieces' symbol streams (see the module docstring)."""

    def __init__(self, stream, onsets, sa, piece_starts, names, shas, gap_edges, onset_step, meta=None):
        self.stream = np.asarray(stream, dtype=np.int16)
        self.onsets = np.asarray(onsets, dtype=np.float32)  # onset of each symbol's first note in its piece
        self.sa = np.asarray(sa, dtype=np.int32)
        self.piece_starts = np.asarray(piece_starts, dtype=np.int64)  # [pieces + 1] stream offsets
        self.names = list(names)
        self.shas = list(shas)
        self.gap_edges = tuple(float(e) for e in gap_edges)
        self.onset_step = float(onset_step)
        self.meta = dict(meta or {})
        # Padded with the end marker so a window gathered near the end needs no bounds check.
        self._padded = np.concatenate([self.stream, np.full(_WINDOW, _CORPUS_END, dtype=np.int16)])

    # ---------------------------------------------------------------- building
    @classmethod
    def build(cls, pieces: Iterable, meta: dict | None = None) -> NoveltyIndex:
        """From (name, notes) or (name, notes, sha256) items; notes are pretty_midi.Note-like objects."""
        streams, onsets, names, shas = [], [], [], []
        for item in pieces:
            name, notes = item[0], item[1]
            pitch, onset = _pitch_onset(notes)
            sym, on = symbols_of(pitch, onset)
            streams.append(np.append(sym, np.int16(_SEPARATOR)))
            # One onset per stream entry: symbol k starts at note k; the separator gets the last note's.
            onsets.append(on if len(on) else np.zeros(1))
            names.append(str(name))
            shas.append(str(item[2]) if len(item) > 2 else "")
        lengths = [len(s) for s in streams]
        piece_starts = np.zeros(len(streams) + 1, dtype=np.int64)
        piece_starts[1:] = np.cumsum(lengths)
        stream = np.concatenate(streams) if streams else np.zeros(0, dtype=np.int16)
        if len(stream) >= np.iinfo(np.int32).max:
            raise NoveltyIndexError(
                f"{len(stream)} notes do not fit an int32 suffix array", code="novelty_index_too_large"
            )
        sa = suffix_array(stream)
        return cls(
            stream,
            np.concatenate(onsets) if onsets else np.zeros(0),
            sa,
            piece_starts,
            names,
            shas,
            GAP_EDGES,
            ONSET_STEP,
            meta,
        )

    # ---------------------------------------------------------------- queries
    def _compare(self, query: np.ndarray, qpos: np.ndarray, cpos: np.ndarray):
        """(lcp, corpus_less): common prefix length of query[qpos:] and stream[cpos:], and whether the
        stream's suffix sorts before the query's. `query` ends with at least `_WINDOW` _QUERY_END marks."""
        lcp = np.zeros(len(qpos), dtype=np.int64)
        less = np.zeros(len(qpos), dtype=bool)
        rows = np.arange(len(qpos))
        offs = np.arange(_WINDOW)
        while len(rows):
            q = query[np.minimum(qpos[rows, None] + lcp[rows, None] + offs, len(query) - 1)]
            cidx = cpos[rows, None] + lcp[rows, None] + offs
            c = self._padded[np.minimum(cidx, len(self._padded) - 1)]
            diff = q != c
            found = diff.any(axis=1)
            first = np.argmax(diff, axis=1)
            done = rows[found]
            lcp[done] += first[found]
            f = first[found]
            less[done] = c[found, f] < q[found, f]
            lcp[rows[~found]] += _WINDOW
            # Ties cannot outlast the query: its end marks equal nothing in the stream.
            rows = rows[~found]
        return lcp, less

    def _insertion_points(self, query: np.ndarray, starts: np.ndarray) -> np.ndarray:
        lo = np.zeros(len(starts), dtype=np.int64)
        hi = np.full(len(starts), len(self.sa), dtype=np.int64)
        active = np.arange(len(starts))
        while len(active):
            mid = (lo[active] + hi[active]) // 2
            _, less = self._compare(query, starts[active], self.sa[mid].astype(np.int64))
            lo[active[less]] = mid[less] + 1
            hi[active[~less]] = mid[~less]
            active = active[lo[active] < hi[active]]
        return lo

    def _count(self, query: np.ndarray, start: int, length: int) -> int:
        """Positions in the stream whose next `length` symbols equal query[start:start + length]: the
        suffixes sorting between the stretch followed by the lowest mark and by the highest."""
        bounds = []
        for mark in (_QUERY_END, _QUERY_HIGH):
            probe = np.concatenate([query[start : start + length], np.full(_WINDOW, mark, np.int16)])
            bounds.append(int(self._insertion_points(probe, np.zeros(1, dtype=np.int64))[0]))
        return bounds[1] - bounds[0]

    def longest_match(self, notes) -> Match:
        """The longest stretch of `notes` (pretty_midi.Note-like) that occurs in the index's pieces."""
        pitch, onset = _pitch_onset(notes)
        symbols, onsets = symbols_of(pitch, onset, self.gap_edges, self.onset_step)
        none = Match(0, 0.0, None, None, None, None, 0)
        if len(symbols) == 0 or len(self.sa) == 0:
            return none
        query = np.concatenate([symbols, np.full(_WINDOW, _QUERY_END, dtype=np.int16)])
        starts = np.arange(len(symbols), dtype=np.int64)
        at = self._insertion_points(query, starts)
        best_len = np.zeros(len(starts), dtype=np.int64)
        best_pos = np.zeros(len(starts), dtype=np.int64)
        for neighbour in (at - 1, at):  # the longest common prefix is with one of the two neighbours
            ok = (neighbour >= 0) & (neighbour < len(self.sa))
            pos = self.sa[np.clip(neighbour, 0, len(self.sa) - 1)].astype(np.int64)
            lcp, _ = self._compare(query, starts, pos)
            lcp = np.where(ok, lcp, 0)
            better = lcp > best_len
            best_len[better], best_pos[better] = lcp[better], pos[better]
        i = int(np.argmax(best_len))  # the earliest query position among the longest
        length = int(best_len[i])
        if length == 0:
            return none
        pos = int(best_pos[i])
        piece = int(np.searchsorted(self.piece_starts, pos, side="right") - 1)
        return Match(
            notes=length + 1,
            seconds=round(float(onsets[i + length] - onsets[i]), 3),
            source=self.names[piece],
            source_sha256=self.shas[piece] or None,
            start_time_in_source=round(float(self.onsets[pos]), 3),
            start_time=round(float(onsets[i]), 3),
            occurrences=self._count(query, i, length),
        )

    # ---------------------------------------------------------------- files
    @property
    def pieces(self) -> int:
        return len(self.names)

    @property
    def notes(self) -> int:
        return len(self.stream)  # one stream entry per note (symbols between notes + one separator)

    def header(self) -> dict:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "gap_edges": list(self.gap_edges),
            "onset_step": self.onset_step,
            "max_interval": MAX_INTERVAL,
            "notes": self.notes,
            "names": self.names,
            "sha256": self.shas,
            "meta": self.meta,
        }

    def save(self, path) -> Path:
        """Write atomically (a temporary file renamed into place), so a reader never sees half a file."""
        path = Path(path)
        header = np.frombuffer(json.dumps(self.header()).encode(), dtype=np.uint8)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            # Compressed: the symbol and onset streams shrink well; the suffix array hardly does.
            np.savez_compressed(
                f,
                header=header,
                stream=self.stream,
                onsets=self.onsets,
                sa=self.sa,
                piece_starts=self.piece_starts,
            )
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path) -> NoveltyIndex:
        path = Path(path)
        if not path.is_file():
            raise NoveltyIndexError(f"no novelty index at {path}", code="novelty_index_missing")
        try:
            with np.load(path, allow_pickle=False) as z:
                header = json.loads(bytes(z["header"]).decode())
                if not isinstance(header, dict) or header.get("format") != FORMAT:
                    raise NoveltyIndexError(f"{path} is not a novelty index", code="novelty_index_corrupt")
                if header.get("format_version") != FORMAT_VERSION:
                    raise NoveltyIndexError(
                        f"{path} is novelty index version {header.get('format_version')!r}; this musicrel "
                        f"reads version {FORMAT_VERSION} (re-run `musicrel prepare`)",
                        code="novelty_index_version",
                    )
                arrays = {k: z[k] for k in ("stream", "onsets", "sa", "piece_starts")}
            index = cls(
                arrays["stream"],
                arrays["onsets"],
                arrays["sa"],
                arrays["piece_starts"],
                header["names"],
                header["sha256"],
                header["gap_edges"],
                header["onset_step"],
                header.get("meta"),
            )
        except NoveltyIndexError:
            raise
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as exc:
            raise NoveltyIndexError(
                f"{path} is not a readable novelty index ({type(exc).__name__}: {exc})",
                code="novelty_index_corrupt",
            ) from None
        index._check(path)
        return index

    def _check(self, path) -> None:
        """Cheap consistency checks, so a damaged file fails here and not with an IndexError mid-query."""
        n = len(self.stream)
        problems = []
        if len(self.onsets) != n or len(self.sa) != n:
            problems.append("array lengths differ")
        if len(self.piece_starts) != len(self.names) + 1 or len(self.shas) != len(self.names):
            problems.append("piece table does not match the names")
        elif len(self.piece_starts) and (self.piece_starts[0] != 0 or self.piece_starts[-1] != n):
            problems.append("piece offsets do not span the stream")
        if n and (self.sa.min() < 0 or self.sa.max() >= n):
            problems.append("suffix array out of range")
        if problems:
            raise NoveltyIndexError(f"{path} is corrupt: {'; '.join(problems)}", code="novelty_index_corrupt")


def read_header(path) -> dict | None:
    """The JSON header of an index file without its arrays; None when there is no readable index there."""
    try:
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(bytes(z["header"]).decode())
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    return header if isinstance(header, dict) and header.get("format") == FORMAT else None


def load_index(data_dir) -> NoveltyIndex:
    """The novelty index `musicrel prepare` wrote beside a prepared data folder's splits."""
    return NoveltyIndex.load(Path(data_dir) / INDEX_FILE)


def longest_copy(index: NoveltyIndex, codec, tokens) -> dict:
    """The record of what one generated sample copied: its longest stretch shared with the indexed training
    pieces (`Match`'s fields), JSON-ready; the command's summary and the server's answer both carry it."""
    return asdict(index.longest_match(codec.decode_notes(tokens)))
