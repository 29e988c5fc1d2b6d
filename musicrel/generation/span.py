"""The torch-free half of infilling (musicrel.generation.infill): the span's checks, the tracks chosen
(`chosen_tracks`), the file cut at it (`infill_segments`), the new notes in file time (`gap_notes`), sent to
the chosen tracks (`route`) and merged into a copy of the file (`merge`, the edge rules of docs/INFILL.md),
and the parameters and result types. The server's HTTP process checks an upload's span and tracks with it
before the job goes to the engine, without loading torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pretty_midi

from musicrel.errors import InfillError, InvalidMidiError, is_int, is_number
from musicrel.generation.controls import ControlError
from musicrel.generation.fim import split_at
from musicrel.generation.sampling import Sampling
from musicrel.midi.codec import shift_steps
from musicrel.midi.edit import written
from musicrel.midi.files import copy_midi
from musicrel.midi.notes import collect, midi_bytes, raw_instruments
from musicrel.midi.tracks import Placer, nearest, read_tracks, voices

MAX_SPAN_SECONDS = 30.0


@dataclass(kw_only=True)
class InfillParams(Sampling):
    """How to fill one gap: the shared sampling fields and their checks (Sampling), and `tracks`: the
    instrument indices (as pretty_midi counts a file's instruments) whose notes in the span are regenerated,
    sorted and without repeats once checked; None: every track the codec reads. `controls`: key, chords,
    density, range, polyphony (generation.controls), read against the music around the gap
    (infill.CONTROL_CONTEXT_SECONDS); not program: the new notes join the file's own tracks."""

    tracks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.controls is not None and self.controls.program is not None:
            raise ControlError(
                "program does not apply to infilling: the new notes join the file's own instrument",
                code="invalid_controls",
            )
        if self.tracks is not None:
            tracks = self.tracks
            if isinstance(tracks, str | bytes) or not isinstance(tracks, list | tuple) or not tracks:
                raise InfillError(
                    f"tracks must be a non-empty list of instrument indices, got {tracks!r}",
                    code="invalid_tracks",
                )
            if not all(is_int(t) and t >= 0 for t in tracks):
                raise InfillError(
                    f"tracks must be instrument indices (whole numbers >= 0), got {list(tracks)!r}",
                    code="invalid_tracks",
                )
            self.tracks = tuple(sorted({int(t) for t in tracks}))


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
    note_tracks: list = field(default_factory=list)  # per sample, the track (instrument index) of each note
    tracks: list = field(default_factory=list)  # the tracks regenerated (InfillSegments.tracks)
    # the upload's bytes and the file they read as (InfillSegments.source, .pm), for `files`; None when the
    # infill was given a PrettyMIDI (the server's engine is: the HTTP side writes with its own copy)
    source: bytes | None = None
    original: pretty_midi.PrettyMIDI | None = None

    def files(self) -> list[bytes]:
        """Each sample's MIDI file: the upload's own bytes with the span's notes edited
        (`musicrel.midi.edit.written`: markers, SysEx, controllers, ports and the track layout as sent),
        else pretty_midi's rewrite."""
        return written(self.source, self.original, self.midis)


@dataclass
class InfillSegments:
    """A file cut for infilling: its event stream split at the gap's steps, and what rendering needs."""

    pm: pretty_midi.PrettyMIDI
    notes: list  # the codec's notes (tracks merged; drums dropped without instruments), file time
    past: np.ndarray
    gap: np.ndarray  # the true gap's tokens (evaluation scores them; infilling replaces them)
    future: np.ndarray
    start_step: int
    end_step: int
    tracks: list[int] = field(default_factory=list)  # the instruments whose notes in the span are regenerated
    # the kept tracks' note events in the gap (`kept_schedule`), placed while the gap is written: (steps from
    # the gap's start, tokens); empty when every track read is regenerated
    kept: tuple = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    instruments: list | None = None  # a codec with instruments: the instrument of each of `notes`
    source: bytes | None = None  # the file's bytes (None when given a PrettyMIDI): the answer edits them

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


def chosen_tracks(codec, pm: pretty_midi.PrettyMIDI, tracks) -> list[int]:
    """The instrument indices of `pm` an infill regenerates: `tracks` (InfillParams.tracks) checked against
    the file, or every instrument the codec reads for None. InfillError `no_such_track` for an index past the
    file's instruments, `track_not_read` for one the codec does not read (a drum track for a model without
    instruments, or a track outside CodecConfig.tracks): the model writes nothing for it."""
    read = _read_instruments(codec, pm)
    if tracks is None:
        return read
    for t in tracks:
        if t >= len(pm.instruments):
            raise InfillError(
                f"track {t} out of range: the file has {len(pm.instruments)} instruments (0-"
                f"{len(pm.instruments) - 1})",
                code="no_such_track",
            )
        if t not in read:
            why = "a drum track, and this model writes no drums" if pm.instruments[t].is_drum else "not read"
            raise InfillError(f"track {t} is {why}: it cannot be regenerated", code="track_not_read")
    return sorted(set(tracks))


def infill_segments(codec, midi, start: float, end: float, tracks=None) -> InfillSegments:
    """Read `midi` (path, bytes or PrettyMIDI) and cut its stream at the span (checked against the music);
    `tracks`: the ones regenerated (`chosen_tracks`), None for every track read."""
    start, end = check_span(start, end)
    source = None if isinstance(midi, pretty_midi.PrettyMIDI) else midi_bytes(codec.config, midi)
    pm = codec.read(midi if source is None else source)
    chosen = chosen_tracks(codec, pm, tracks)
    instruments = None
    if codec.instrument_offset is None:
        notes = codec.to_notes(pm)  # InvalidMidiError no_notes when nothing is left
    else:  # the prompt names each note's instrument, as training's streams do
        read = codec.instrument_notes(pm)
        notes, instruments = read.notes, read.instruments
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
    past, gap, future = split_at(codec, codec.encode_notes(notes, instruments), [s_step, e_step])
    kept = [t for t in _read_instruments(codec, pm) if t not in chosen]
    schedule = kept_schedule(codec, pm, kept, s_step, e_step)
    return InfillSegments(pm, notes, past, gap, future, s_step, e_step, chosen, schedule, instruments, source)


def kept_schedule(codec, pm, kept: list[int], s_step: int, e_step: int) -> tuple[np.ndarray, np.ndarray]:
    """The note events of the `kept` tracks (as the codec reads them) in the gap's steps [s_step, e_step), as
    (steps from the gap's start, tokens) in stream order: what the model is made to hear while it writes the
    gap (`placed.PlacedGrammar` places them). Each note-on comes after its SET_VELOCITY and, with instruments,
    each note event after its INSTRUMENT token: the model's own notes in between may have changed either."""
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    if not kept:
        return empty
    try:
        notes = collect(codec.config, raw_instruments(codec.config, pm), kept)
    except InvalidMidiError:  # the kept tracks have no notes
        return empty
    listed = [
        pretty_midi.Note(int(v), int(p), float(a), float(b))
        for a, b, p, v in zip(notes.start, notes.end, notes.pitch, notes.velocity, strict=True)
    ]
    tokens = np.asarray(codec.encode_notes(listed, notes.instrument), dtype=np.int64)
    steps_of = shift_steps(codec)
    clock = np.cumsum(steps_of[tokens]) - steps_of[tokens]  # each token's step
    vel0, bins = codec.velocity_offset, codec.config.velocity_bins
    is_velocity = (tokens >= vel0) & (tokens < vel0 + bins)
    is_note = codec.is_note_on(tokens) | codec.is_note_off(tokens)
    velocity = _in_force(tokens, is_velocity)
    instrument = _in_force(tokens, codec.is_instrument(tokens))
    out_steps, out_tokens = [], []
    for k in np.flatnonzero(is_note & (clock >= s_step) & (clock < e_step)).tolist():
        prefix = [instrument[k]] if codec.instrument_offset is not None else []
        if codec.is_note_on(tokens[k]) and velocity[k] >= 0:
            prefix.append(velocity[k])
        for tok in [*prefix, int(tokens[k])]:
            out_steps.append(int(clock[k]) - s_step)
            out_tokens.append(int(tok))
    return np.asarray(out_steps, dtype=np.int64), np.asarray(out_tokens, dtype=np.int64)


def _in_force(tokens: np.ndarray, mask: np.ndarray) -> list[int]:
    """The last token of `mask` at or before each token (-1 before the first)."""
    index = np.where(mask, np.arange(len(tokens)), -1)
    last = np.maximum.accumulate(index) if len(tokens) else index
    return np.where(last >= 0, tokens[np.maximum(last, 0)], -1).tolist()


def past_velocity(codec, past: np.ndarray) -> np.ndarray:
    """The tokens in force at the gap's start that decoding its notes needs: the past's last velocity token
    (empty if it has none) and, for a codec with instruments, its last INSTRUMENT token before it (the gap's
    first notes may belong to an instrument set earlier)."""
    past = np.asarray(past, dtype=np.int64)
    lo = codec.velocity_offset
    velocity = past[(past >= lo) & (past < lo + codec.config.velocity_bins)][-1:]
    if codec.instrument_offset is None:
        return velocity
    return np.concatenate([past[codec.is_instrument(past)][-1:], velocity])


def gap_notes(
    codec, past: np.ndarray, tokens: np.ndarray, start: float, end: float
) -> tuple[list, list | None]:
    """A gap's tokens -> (notes in file time, the instrument of each or None for a codec without instruments):
    the velocity (and instrument) in force at the gap's start carries over, notes start at `start` + their
    time and end by `end`."""
    tokens = np.concatenate([past_velocity(codec, past), np.asarray(tokens, dtype=np.int64)])
    if codec.instrument_offset is None:
        decoded, instruments = codec.decode_notes(tokens), None
    else:
        parts = codec.decode_instrument_notes(tokens)
        decoded, instruments = parts.notes, parts.instruments
    notes, kept = [], []
    for k, n in enumerate(decoded):
        s, e = start + n.start, min(start + n.end, end)
        if s < end and e > s:
            notes.append(pretty_midi.Note(velocity=n.velocity, pitch=n.pitch, start=s, end=e))
            kept.append(k)
    return notes, None if instruments is None else [instruments[k] for k in kept]


def _read_instruments(codec, pm) -> list[int]:
    """Indices of the instruments the codec reads (and infilling can therefore regenerate): those of
    `tracks`, drums only for a codec with instruments."""
    tracks = codec.config.tracks
    chosen = (
        range(len(pm.instruments)) if tracks == "merge" else [i for i in tracks if i < len(pm.instruments)]
    )
    return [i for i in chosen if codec.config.instruments or not pm.instruments[i].is_drum]


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


def route(
    pm, tracks: list[int], start: float, end: float, notes: list, instruments: list | None, placer=None
) -> list:
    """The track (instrument index of `pm`) each new note goes to, None for a note that is dropped; the rule
    of docs/INFILL.md, nearest voice as `midi.tracks` has it for every route (`voices`, `nearest`: the median
    pitch of each chosen track around the gap). A model without instruments: with one chosen track, onto
    it; with several, the nearest voice among them. A model with instruments (`gap_placer`): the chosen track
    of the note's instrument (its General MIDI program, or drums), the nearest voice among several of one
    instrument; a note of an instrument no chosen track plays is dropped (the kept tracks stay exact).
    `placer`: that `gap_placer`, when the caller has it already."""
    if instruments is None:
        if len(tracks) == 1:
            return [tracks[0]] * len(notes)
        heard, candidates = voices(pm, tracks, start, end), sorted(tracks)
        return [nearest(heard, candidates, n.pitch) for n in notes]
    placer = placer or gap_placer(pm, tracks, start, end)
    return [placer.place(i, n.pitch) for n, i in zip(notes, instruments, strict=True)]


def gap_placer(pm, tracks: list[int], start: float, end: float) -> Placer:
    """Where a gap's new notes go, for a codec with instruments: the answer's (`route`) and the stream's
    (`streaming.NoteStream`), so that each streamed note is a note of the file, on its track. Every track of
    `pm` (a placed note's index is its index in the file), each with its voice around the gap [start, end);
    only the chosen `tracks` take notes, and a note of an instrument none of them plays is placed nowhere
    (None)."""
    every, _ = read_tracks(pm, "merge", [], [], start, end)
    return every.placer(only=set(tracks))


def merge(
    codec, pm, start: float, end: float, new_notes: list, tracks=None, instruments: list | None = None
) -> tuple[pretty_midi.PrettyMIDI, int, list, list]:
    """A copy of `pm` with the notes that start in [start, end) of the chosen `tracks` (None: every track
    read) removed and `new_notes` added to them (`route`; `instruments`: each new note's, from a codec with
    instruments) under the edge rules of docs/INFILL.md; how many notes were removed; the new notes as they
    stand in the copy (a new note struck while a kept note of its pitch sounds is dropped, and one `route`
    drops); and the track of each. New notes end by `end`, kept ones after the gap start at or after it: no
    other overlap can arise."""
    out = copy_midi(pm)
    tracks = _read_instruments(codec, pm) if tracks is None else list(tracks)
    removed = 0
    for i in tracks:
        inst = out.instruments[i]
        kept = [n for n in inst.notes if not start <= n.start < end]
        removed += len(inst.notes) - len(kept)
        inst.notes = kept
    sounding = sounding_into(codec, pm, start)
    placer = None if instruments is None else gap_placer(pm, tracks, start, end)
    fitted, where = [], []
    for g, t in zip(new_notes, route(pm, tracks, start, end, new_notes, instruments, placer), strict=True):
        if t is None or g.end <= g.start or struck_under(sounding, g.pitch, g.start):
            continue
        copies = () if placer is None else placer.copies(t)  # chosen tracks doubling t in unison
        for k in (t, *copies):
            note = pretty_midi.Note(g.velocity, g.pitch, g.start, g.end)
            out.instruments[k].notes.append(note)
            fitted.append(note)
            where.append(k)
    return out, removed, fitted, where
