"""evaluate-infills' gaps: its options (`InfillEvaluationOptions`), where a piece's gaps are cut
(`cut_gaps`: a function of its notes and its seed alone), what each gap holds (`Gap`: the music before, the
truth, the music after, the copy baseline) and the pieces they are cut from (`load_infill_pieces`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pretty_midi

from musicrel.errors import is_int, is_number
from musicrel.evaluation.ensemble import Parts, pitched
from musicrel.evaluation.pieces import EvaluationError, read_notes, read_parts, window
from musicrel.evaluation.twosample import TREES
from musicrel.generation.infill import MAX_SPAN_SECONDS, InfillParams
from musicrel.generation.keys import find_key
from musicrel.generation.sampling import SamplingParams, derived_seed
from musicrel.model.checkpoint import check_decode_weights
from musicrel.model.weights import DEFAULT_DECODE_WEIGHTS

AFTER_SECONDS = 4.0  # the music after the gap that the end's join features read
AFTER_MIN_SECONDS = 1.0  # a gap ends at least this long before the piece's last onset


class InfillEvaluationError(EvaluationError):
    """evaluate-infills settings or inputs that cannot be used (bad gap lengths, cuts, seeds; no pieces)."""

    code = "invalid_evaluation"


def parse_gap_seconds(value) -> tuple[float, float]:
    """(shortest, longest) gap in seconds from "4,8", "6", 6 or (4, 8); InfillEvaluationError
    invalid_gap_seconds unless 0 < shortest <= longest <= MAX_SPAN_SECONDS."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        try:
            numbers = [float(p) for p in parts]
        except ValueError:
            numbers = []
    elif is_number(value):
        numbers = [float(value)]
    else:
        try:
            numbers = [float(v) if is_number(v) else math.nan for v in value]
        except TypeError:
            numbers = []
    if len(numbers) == 1:
        numbers *= 2
    if len(numbers) != 2 or not all(math.isfinite(x) for x in numbers):
        raise InfillEvaluationError(
            f"gap seconds must be one number or two (shortest,longest), got {value!r}",
            code="invalid_gap_seconds",
        )
    lo, hi = numbers
    if not 0 < lo <= hi <= MAX_SPAN_SECONDS:
        raise InfillEvaluationError(
            f"gap seconds must satisfy 0 < shortest <= longest <= {MAX_SPAN_SECONDS:g}, got {lo:g},{hi:g}",
            code="invalid_gap_seconds",
        )
    return lo, hi


@dataclass(frozen=True)
class InfillEvaluationOptions:
    """What `evaluate_infills` runs (the defaults of `musicrel evaluate-infills`).

    gap_seconds: each gap's length is drawn uniformly in [shortest, longest] ("4,8"); cuts: gaps per piece
    (one in each of `cuts` equal stretches of where a gap fits); seeds: samples per gap and system; seed: the
    base seed every gap's place and every sample derive theirs from; split/source: as evaluate-continuations
    reads a prepared folder; temperature/top_k/top_p: the model's sampling (None: SamplingParams'); weights:
    how the model holds its weights while it decodes and reads the gaps' NLL (DECODE_WEIGHTS); trees: the size
    of each of the classifier's forests (a test on a few pieces fits fewer)."""

    gap_seconds: tuple | str = (4.0, 8.0)
    cuts: int = 3
    seeds: int = 3
    seed: int = 0
    limit: int | None = None
    split: str = "test"
    source: str | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    weights: str = DEFAULT_DECODE_WEIGHTS
    trees: int = TREES

    def __post_init__(self) -> None:
        check_decode_weights(self.weights)
        object.__setattr__(self, "gap_seconds", parse_gap_seconds(self.gap_seconds))
        for name in ("cuts", "seeds", "limit", "trees"):
            value = getattr(self, name)
            if name == "limit" and value is None:
                continue
            if not is_int(value) or value < 1:
                raise InfillEvaluationError(
                    f"{name} must be an integer >= 1, got {value!r}", code="invalid_params"
                )
        if not is_int(self.seed):
            raise InfillEvaluationError(f"seed must be an integer, got {self.seed!r}", code="invalid_params")
        self.sampling(1.0, 0)  # its checks (GenerationError invalid_params) before any model loads

    def sampling(self, seconds: float, seed: int) -> SamplingParams:
        """The continuation's settings for a gap of `seconds` (the infill's are the same numbers)."""
        given = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}
        given = {k: v for k, v in given.items() if v is not None}
        return SamplingParams(seconds=seconds, seed=seed, num_samples=1, **given)

    def infill_params(self, seed: int) -> InfillParams:
        s = self.sampling(1.0, seed)
        return InfillParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=seed, num_samples=1)


@dataclass(frozen=True)
class GapParts:
    """A gap's music by instrument (`ensemble.Parts`), at the times of `Gap`'s lists."""

    before: Parts
    truth: Parts
    copy: Parts


@dataclass
class Gap:
    """One gap cut from one piece, its music around it, and its seed."""

    piece: int  # index into the evaluation's pieces
    start: float
    end: float
    seed: int
    before: list  # the notes that start before `start`, clipped there, times relative to it (negative)
    truth: list  # the notes that start in [start, end), from 0, clipped to the gap
    after: list  # the notes that start in [end, end + AFTER_SECONDS), from 0 (the gap's end)
    copy: list  # the copy-before baseline: the notes that start in [start - L, start), moved L later
    key: tuple | None  # the music before's key
    # with instruments, each instrument's notes (drums too) as `before`, `truth` and `copy` hold the pitched
    # ones: what the figures per instrument and the classifier's `instruments` family read
    parts: GapParts | None = None

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class InfillPiece:
    path: str
    pm: object  # the PrettyMIDI the gaps are cut from
    notes: list  # the codec's notes (file time); with instruments every instrument's but the drums', merged
    parts: Parts | None = None  # with instruments, each instrument's notes (drums too) as the codec has them


def _moved(notes, offset: float, clip_to: float | None = None) -> list:
    """Notes moved `offset` seconds later (clipped to end by `clip_to`)."""
    out = []
    for n in notes:
        s, e = n.start + offset, n.end + offset
        if clip_to is not None:
            e = min(e, clip_to)
        if e > s:
            out.append(pretty_midi.Note(n.velocity, n.pitch, s, e))
    return out


def copy_before(notes, start: float, seconds: float) -> list:
    """The baseline that copies the `seconds` before the gap into it: the notes that start in
    [start - seconds, start) moved `seconds` later, clipped to end by the gap's end; times from the gap's
    start."""
    stretch = [n for n in notes if start - seconds <= n.start < start]
    return _moved(stretch, seconds - start, clip_to=seconds)


def _before(notes, start: float) -> list:
    """The notes that start before `start`, clipped there, times relative to it (negative)."""
    return [
        pretty_midi.Note(n.velocity, n.pitch, n.start - start, min(n.end, start) - start)
        for n in notes
        if n.start < start
    ]


def gap_parts(parts: Parts, start: float, end: float) -> GapParts:
    """Each instrument's music before the gap, in it and copied into it (`copy_before`), as `cut_gaps` cuts
    the pitched notes; an instrument with no note in one of them is not in it."""

    def each(cut) -> Parts:
        out = {i: cut(ns) for i, ns in parts.items()}
        return {i: ns for i, ns in out.items() if ns}

    seconds = end - start
    return GapParts(
        before=each(lambda ns: _before(ns, start)),
        truth=each(lambda ns: window(ns, start, seconds)),
        copy=each(lambda ns: copy_before(ns, start, seconds)),
    )


def cut_gaps(
    notes, piece_seed: int, options: InfillEvaluationOptions, piece: int = 0, parts: Parts | None = None
) -> list[Gap]:
    """The gaps of one piece, a function of its notes and `piece_seed` only. Gap k's length is drawn in
    gap_seconds, its start in the k-th of `cuts` equal stretches of where it fits: after at least its own
    length of music (so the copy baseline copies a whole stretch) and before the last second of onsets
    (something to lead into). Cuts whose gap holds no note are dropped. `parts` (with instruments): each
    gap's music by instrument too (`gap_parts`); where `notes` (the pitched ones) is empty, a drum part alone,
    the gaps are placed by the drums (`placing`)."""
    lo, hi = options.gap_seconds
    placed = placing(notes, parts)
    onsets = [n.start for n in placed]
    first, last = min(onsets), max(onsets)
    rng = np.random.default_rng(piece_seed)
    gaps = []
    for k in range(options.cuts):
        length = float(rng.uniform(lo, hi))
        u = float(rng.uniform())
        a, b = first + length, last - AFTER_MIN_SECONDS - length
        if b < a:
            continue
        start = round(a + (b - a) * (k + u) / options.cuts, 2)
        end = round(start + length, 2)
        truth = window(notes, start, end - start)
        if not window(placed, start, end - start):
            continue
        before = _before(notes, start)
        after = [
            pretty_midi.Note(n.velocity, n.pitch, n.start - end, n.end - end)
            for n in notes
            if end <= n.start < end + AFTER_SECONDS
        ]
        gaps.append(
            Gap(
                piece=piece,
                start=start,
                end=end,
                seed=derived_seed(piece_seed, k),
                before=before,
                truth=truth,
                after=after,
                copy=copy_before(notes, start, end - start),
                key=find_key(before),
                parts=None if parts is None else gap_parts(parts, start, end),
            )
        )
    return gaps


def load_infill_pieces(codec, files, options: InfillEvaluationOptions):
    """(pieces, gaps, skipped counts by code): the first `limit` files with at least one gap. A file's gaps
    depend on its place in `files` and the base seed only (not on --limit)."""
    pieces, gaps, skipped = [], [], {}
    for index, path in enumerate(files):
        if options.limit is not None and len(pieces) >= options.limit:
            break
        # the truth, the bars copied and the music around the gap as the codec renders the fillings
        read = _read(codec, path, skipped)
        if read is None:
            continue
        pm, notes, parts = read
        cut = cut_gaps(notes, derived_seed(options.seed, index), options, piece=len(pieces), parts=parts)
        if not cut:
            skipped["too_short"] = skipped.get("too_short", 0) + 1
            continue
        pieces.append(InfillPiece(str(path), pm, notes, parts))
        gaps += cut
    return pieces, gaps, skipped


def _read(codec, path, skipped: dict[str, int]):
    """(PrettyMIDI, the notes gaps are cut from and scored on, parts) of a file, or None with the reason
    counted in `skipped`. With instruments a gap is scored as evaluate-continuations scores a continuation:
    the pitched notes of every instrument merged (a drum hit is no pitch), each instrument read as the codec
    renders it; a file of drums alone has none (its gaps are placed by the drums and scored by instrument)."""
    if codec.instrument_offset is None:
        read = read_notes(codec, path, skipped)
        return None if read is None else (*read, None)
    parts = read_parts(codec, path, skipped)
    if parts is None:
        return None
    return codec.read(path), pitched(parts), parts


def placing(notes, parts: Parts | None) -> list:
    """The notes a piece's gaps are placed by: its pitched `notes`, or where it has none (drums alone) every
    note of its `parts`."""
    if notes or parts is None:
        return notes
    return [n for ns in parts.values() for n in ns]
