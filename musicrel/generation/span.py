"""The torch-free half of infilling (musicrel.generation.infill): the span's checks, the file cut at it
(`infill_segments`), the new notes in file time (`gap_notes`) and merged into a copy of the file (`merge`,
the edge rules of docs/INFILL.md), and the parameters and result types. The server's HTTP process checks an
upload's span with it before the job goes to the engine, without loading torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pretty_midi

from musicrel.errors import InfillError, is_int, is_number
from musicrel.generation.controls import ControlError
from musicrel.generation.fim import split_at
from musicrel.generation.primer import motif_program
from musicrel.generation.sampling import Sampling
from musicrel.midi.files import copy_midi

MAX_SPAN_SECONDS = 30.0
INFILL_TRACK = "infill"
# The new track's program: the one playing most notes this far around the gap.
PROGRAM_WINDOW_SECONDS = 10.0


@dataclass(kw_only=True)
class InfillParams(Sampling):
    """How to fill one gap: the shared sampling fields and their checks (Sampling), and none of its own.
    `controls`: key, chords, density, range, polyphony (generation.controls), read against the music around
    the gap (infill.CONTROL_CONTEXT_SECONDS); not program: the new notes join the file's own track."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.controls is not None and self.controls.program is not None:
            raise ControlError(
                "program does not apply to infilling: the new notes join the file's own instrument",
                code="invalid_controls",
            )


@dataclass
class InfillResult:
    midis: list  # pretty_midi.PrettyMIDI per sample: the input with [start, end) regenerated
    notes: list  # per sample, the new pretty_midi.Notes as they stand in its file (edge rules applied)
    seed: int
    start: float
    end: float
    removed: int  # the input's notes that started in the gap
    prompt_tokens: int
    decode_seconds: float
    warnings: list = field(default_factory=list)
    tokens: list = field(default_factory=list)  # each sample's gap tokens (np.ndarray), as decoded
    controls: dict | None = None  # what the controls applied (the key `auto` found, ...); None: none set


@dataclass
class InfillSegments:
    """A file cut for infilling: its event stream split at the gap's steps, and what rendering needs."""

    pm: pretty_midi.PrettyMIDI
    notes: list  # the codec's notes (drums dropped, tracks merged), file time
    past: np.ndarray
    gap: np.ndarray  # the true gap's tokens (evaluation scores them; infilling replaces them)
    future: np.ndarray
    start_step: int
    end_step: int

    @property
    def gap_steps(self) -> int:
        return self.end_step - self.start_step


def check_span(start, end) -> tuple[float, float]:
    """(start, end) as floats, or InfillError: numbers, 0 <= start < end, at most MAX_SPAN_SECONDS."""
    for name, value in (("start", start), ("end", end)):
        if not is_number(value):
            raise InfillError(
                f"{name} must be a finite number of seconds, got {value!r}", code="invalid_span"
            )
    start, end = float(start), float(end)
    if start < 0 or start >= end:
        raise InfillError(
            f"the span must satisfy 0 <= start < end, got {start:g}-{end:g} s", code="invalid_span"
        )
    if end - start > MAX_SPAN_SECONDS:
        raise InfillError(
            f"the span is {end - start:g} s; at most {MAX_SPAN_SECONDS:g} s can be regenerated at once",
            code="span_too_long",
        )
    return start, end


def check_bars(first_bar, last_bar) -> tuple[int, int]:
    """(first_bar, last_bar), or InfillError `invalid_span`: whole numbers >= 1, the first not after the last.
    What a span in bars must be before any file says what seconds it is."""
    for name, value in (("first_bar", first_bar), ("last_bar", last_bar)):
        if not is_int(value) or value < 1:
            raise InfillError(f"{name} must be a whole number >= 1, got {value!r}", code="invalid_span")
    if first_bar > last_bar:
        raise InfillError(
            f"the bars must satisfy first_bar <= last_bar, got {first_bar}-{last_bar}", code="invalid_span"
        )
    return int(first_bar), int(last_bar)


def bar_span(pm: pretty_midi.PrettyMIDI, first_bar, last_bar) -> tuple[float, float]:
    """The seconds of bars `first_bar` to `last_bar` of a file (1-based, both included, as a sequencer counts
    them from the file's start): from the downbeat of the first to the downbeat after the last, by the file's
    tempo and time-signature changes (a file without them is 4/4 at 120 bpm, as MIDI says). InfillError
    `invalid_span` for bars that are not whole numbers >= 1 in order, `span_outside_music` when the file's
    music has no bar after the last (a span must leave music after it)."""
    first_bar, last_bar = check_bars(first_bar, last_bar)
    downbeats = pm.get_downbeats()  # every bar's start up to the file's end
    if last_bar >= len(downbeats):
        raise InfillError(
            f"bars {first_bar}-{last_bar}: the file has {len(downbeats)} bars by its tempo and time "
            "signatures, and a span must end before its last one begins",
            code="span_outside_music",
        )
    return float(downbeats[first_bar - 1]), float(downbeats[last_bar])


def infill_segments(codec, midi, start: float, end: float) -> InfillSegments:
    """Read `midi` (path, bytes or PrettyMIDI) and cut its stream at the span (checked against the music)."""
    start, end = check_span(start, end)
    pm = codec.read(midi)
    notes = codec.to_notes(pm)  # InvalidMidiError no_notes when nothing is left
    first, last = min(n.start for n in notes), max(n.end for n in notes)
    if end <= first or start >= last:
        raise InfillError(
            f"the span {start:g}-{end:g} s is outside the music ({first:.2f}-{last:.2f} s)",
            code="span_outside_music",
        )
    if not any(n.start < start for n in notes):
        raise InfillError(f"no note starts before {start:g} s: nothing to fill from", code="nothing_before")
    if not any(n.start >= end for n in notes):
        raise InfillError(
            f"no note starts at or after {end:g} s: that is a continuation (musicrel generate)",
            code="nothing_after",
        )
    step = codec.config.step_ms / 1000.0
    s_step, e_step = (int(math.floor(t / step + 0.5)) for t in (start, end))
    if e_step <= s_step:
        raise InfillError(f"the span is shorter than one time step ({step:g} s)", code="invalid_span")
    past, gap, future = split_at(codec, codec.encode_notes(notes), [s_step, e_step])
    return InfillSegments(pm, notes, past, gap, future, s_step, e_step)


def past_velocity(codec, past: np.ndarray) -> np.ndarray:
    """The velocity token in force at the gap's start (the past's last one; empty if it has none): the gap's
    notes are decoded after it."""
    past = np.asarray(past, dtype=np.int64)
    lo = codec.velocity_offset
    return past[(past >= lo) & (past < lo + codec.config.velocity_bins)][-1:]


def gap_notes(codec, past: np.ndarray, tokens: np.ndarray, start: float, end: float) -> list:
    """A gap's tokens -> notes in file time: the velocity in force at the gap's start carries over, notes
    start at `start` + their time and end by `end`."""
    out = []
    for n in codec.decode_notes(np.concatenate([past_velocity(codec, past), tokens])):
        s, e = start + n.start, min(start + n.end, end)
        if s < end and e > s:
            out.append(pretty_midi.Note(velocity=n.velocity, pitch=n.pitch, start=s, end=e))
    return out


def _read_instruments(codec, pm) -> list[int]:
    """Indices of the instruments the codec reads (and infilling therefore regenerates): non-drum ones of
    `tracks`."""
    tracks = codec.config.tracks
    chosen = (
        range(len(pm.instruments)) if tracks == "merge" else [i for i in tracks if i < len(pm.instruments)]
    )
    return [i for i in chosen if not pm.instruments[i].is_drum]


def sounding_into(codec, pm, start: float) -> dict[int, list[tuple[float, float]]]:
    """The notes of the instruments read that sound into the gap (struck before `start`, ending after it),
    as (start, end) by pitch: they are kept whole, so a new note of their pitch struck while one sounds is
    dropped (`struck_under`)."""
    out: dict[int, list[tuple[float, float]]] = {}
    for i in _read_instruments(codec, pm):
        for n in pm.instruments[i].notes:
            if n.start < start < n.end:
                out.setdefault(n.pitch, []).append((n.start, n.end))
    return out


def struck_under(sounding: dict, pitch: int, time: float) -> bool:
    """Whether a new note of `pitch` struck at `time` (file seconds) falls under a kept note of its pitch."""
    return any(s <= time < e for s, e in sounding.get(pitch, ()))


def merge(codec, pm, start: float, end: float, new_notes: list) -> tuple[pretty_midi.PrettyMIDI, int, list]:
    """A copy of `pm` with the notes that start in [start, end) of the instruments read removed and
    `new_notes` added (the edge rules of docs/INFILL.md); how many notes were removed; and the new notes
    as they stand in the copy (a new note struck while a kept note of its pitch sounds is dropped). New notes
    end by `end`, kept ones after the gap start at or after it: no other overlap can arise."""
    out = copy_midi(pm)
    read = _read_instruments(codec, out)
    removed = 0
    for i in read:
        inst = out.instruments[i]
        kept = [n for n in inst.notes if not start <= n.start < end]
        removed += len(inst.notes) - len(kept)
        inst.notes = kept
    sounding = sounding_into(codec, pm, start)
    fitted = [
        pretty_midi.Note(g.velocity, g.pitch, g.start, g.end)
        for g in new_notes
        if g.end > g.start and not struck_under(sounding, g.pitch, g.start)
    ]
    with_notes = [i for i in read if pm.instruments[i].notes]
    if len(with_notes) == 1:
        target = out.instruments[with_notes[0]]
    else:
        window = (max(0.0, start - PROGRAM_WINDOW_SECONDS), end + PROGRAM_WINDOW_SECONDS)
        program, _ = motif_program(pm, codec.config.tracks, *window)
        target = pretty_midi.Instrument(program=program, name=INFILL_TRACK)
        out.instruments.append(target)
    target.notes.extend(fitted)
    return out, removed, fitted
