"""The motif side of generation: `prepare_primer` / `primer_at_cut` turn a motif into the tokens the model
reads (a `Primer`, with what rendering needs), and `render` turns generated tokens back into MIDI with the
motif's tempo and program; with a model whose codec has instruments, with the motif's tracks (each new note on
its instrument's track: `musicrel.midi.tracks`).
"""

from __future__ import annotations

import collections
import json
import math
from dataclasses import dataclass, field, replace

import numpy as np
import pretty_midi

from musicrel.errors import GenerationError, is_number
from musicrel.generation.controls import ControlError
from musicrel.generation.join import cut_steps
from musicrel.generation.streaming import NoteStream
from musicrel.midi.codec import CodecConfig, EventCodec, open_pitches, shift_steps
from musicrel.midi.decode import decode_tokens
from musicrel.midi.files import DEFAULT_BPM, Timeline, prevailing_tempo
from musicrel.midi.instruments import DRUMS, is_ensemble, played
from musicrel.midi.tracks import Tracks, read_tracks

PRIMER_SECONDS = 30.0  # how much of the motif's end the model reads, by default


@dataclass
class Primer:
    """The tokens the model reads before it continues, and what rendering the result needs."""

    tokens: np.ndarray  # events of the primer window from time 0 (led by bos when it holds the whole motif)
    start_time: float  # seconds in the source file where the primer window starts
    end_time: float  # seconds in the source file where the motif ends (last note-off): continuation starts
    tempo: float  # bpm: the tempo prevailing over the primer window (`midi.files.prevailing_tempo`)
    program: int  # the output's instrument: see `motif_program`
    notes: list  # pretty_midi.Note in the primer window (times in the source file)
    motif_notes: list = field(default_factory=list)  # every note of the motif (times in the source file)
    program_reason: str = "given"  # why `program`, in words (`motif_program`)
    requested_seconds: float | None = None  # the primer_seconds asked for
    cropped: bool = False  # the token cap (max_tokens) started the window later than requested_seconds
    # steps from the last token (an event, never a time shift) to end_time: the silence decoding accounts for
    # before its first event (musicrel.generation.join), so the continuation starts at end_time
    tail_steps: int = 0
    # A codec with instruments: each motif note's instrument (parallel to motif_notes), the motif's tracks
    # (the upload's selected tracks) and the tracks of each motif note (one, or both of a unison double); None
    # for a codec without instruments.
    motif_instruments: list | None = None
    tracks: Tracks | None = None
    motif_tracks: list | None = None
    # the upload's tempo map and signatures up to the cut (a file read by prepare_primer), which a file that
    # includes the motif is written with
    timeline: Timeline | None = None


def _codec_for_tracks(codec, tracks):
    if tracks is None or tracks == codec.config.tracks:
        return codec
    return EventCodec(CodecConfig.from_dict({**codec.config.to_dict(), "tracks": tracks}))


def _window_tokens(codec, notes, start: float, cut: float, instruments=None) -> tuple[np.ndarray, int]:
    """(events of the notes sounding in [start, cut) with time 0 at `start`, steps from the last of them to
    the cut). A note still sounding at `cut` stays open (no note-off: where it ends is for the continuation to
    say). The tokens end on their last event at or before the cut, never on a shift: the silence after it is
    the second value, which decoding accounts for (`musicrel.generation.join`). `instruments`: each note's
    (a codec with instruments)."""
    horizon = cut + 3600.0  # open notes end far beyond the cut; their note-offs are cut away below
    inside = [i for i, n in enumerate(notes) if n.end > start and n.start < cut]
    window = [
        pretty_midi.Note(notes[i].velocity, notes[i].pitch, max(notes[i].start, start) - start,
                         (notes[i].end if notes[i].end <= cut else horizon) - start)
        for i in inside
    ]  # fmt: skip
    window_instruments = None if instruments is None else [instruments[i] for i in inside]
    tokens = np.asarray(codec.encode_notes(window, window_instruments), dtype=np.int64)
    steps = shift_steps(codec)[tokens]
    cut_step = int(np.floor((cut - start) / (codec.config.step_ms / 1000.0) + 0.5))
    clock = np.cumsum(steps)  # time after each token
    n = int(np.searchsorted(clock, cut_step, side="right"))  # tokens up to the cut (events at it included)
    while n and steps[n - 1]:  # the shifts toward the first event after the cut: that gap is the tail
        n -= 1
    return tokens[:n], cut_step - (int(clock[n - 1]) if n else 0)


def primer_at_cut(
    codec,
    notes,
    cut: float,
    primer_seconds: float = PRIMER_SECONDS,
    max_tokens: int | None = None,
    tempo: float = DEFAULT_BPM,
    program: int = 0,
    instruments=None,
) -> Primer:
    """The `primer_seconds` before `cut` of `notes` (pretty_midi notes in source time) as a primer.

    Notes sounding at the window start are kept from the start on; notes still sounding at `cut` stay open
    and the continuation starts at `cut` (evaluation cuts pieces mid-phrase this way). The tokens end on the
    last event before the cut; the silence from it to the cut is `tail_steps`, which decoding covers before
    it lets anything else happen (`musicrel.generation.join`). When the window encodes
    to more than `max_tokens` tokens its start moves later (re-encoded, so the primer still begins at an event
    boundary). `instruments`: each note's instrument, parallel to `notes` (a codec with instruments)."""
    if (
        isinstance(primer_seconds, bool)
        or not isinstance(primer_seconds, int | float)
        or not primer_seconds > 0
    ):
        raise GenerationError(f"primer_seconds must be > 0, got {primer_seconds!r}", code="invalid_params")
    if max_tokens is not None and max_tokens < 1:
        raise GenerationError(f"max_tokens must be >= 1, got {max_tokens!r}", code="invalid_params")
    before = [i for i, n in enumerate(notes) if n.start < cut]
    notes = [notes[i] for i in before]
    instruments = None if instruments is None else [int(instruments[i]) for i in before]
    if not notes:
        raise GenerationError("no notes before the cut", code="no_notes")
    first_start = min(n.start for n in notes)
    start = asked_start = max(first_start, cut - float(primer_seconds))
    tokens, tail = _window_tokens(codec, notes, start, cut, instruments)
    step = codec.config.step_ms / 1000.0
    for _ in range(64):
        if max_tokens is None or len(tokens) <= max_tokens:
            break
        # Time at which the last max_tokens tokens begin: move the window start there (at least one step).
        elapsed = np.cumsum(np.asarray(codec.time_advance)[tokens])
        start += max(float(elapsed[len(tokens) - max_tokens - 1]), step)
        tokens, tail = _window_tokens(codec, notes, start, cut, instruments)
    cropped = start > asked_start
    if max_tokens is not None and len(tokens) > max_tokens:  # e.g. one huge chord: keep the tail as is
        tokens, cropped = tokens[-max_tokens:], True
    elif start <= first_start and (max_tokens is None or len(tokens) < max_tokens):
        # The window holds the whole motif: mark a piece start, as training streams do ([bos] piece [eos]).
        tokens = np.concatenate([[codec.bos_id], tokens])
    clipped = [pretty_midi.Note(n.velocity, n.pitch, n.start, min(n.end, cut)) for n in notes]
    return Primer(
        tokens=tokens,
        start_time=float(start),
        end_time=float(cut),
        tempo=float(tempo),
        program=int(program),
        notes=[
            pretty_midi.Note(n.velocity, n.pitch, max(n.start, start), n.end)
            for n in clipped
            if n.end > start
        ],
        motif_notes=clipped,
        requested_seconds=float(primer_seconds),
        cropped=cropped,
        tail_steps=int(tail),
        motif_instruments=instruments,
    )


def prepare_primer(
    codec,
    midi,
    primer_seconds: float = PRIMER_SECONDS,
    tracks="merge",
    max_tokens: int | None = None,
    motif_end: float | None = None,
):
    """The `primer_seconds` before the motif's end as primer tokens (InvalidMidiError for unusable MIDI); see
    `primer_at_cut`. The motif ends at `motif_end` seconds of the file (notes sounding there stay open), by
    default, or when that is later, at its last note-off: a whole piece is otherwise continued after its
    final cadence. GenerationError (no_notes) when no note starts before `motif_end`."""
    if motif_end is not None and (not is_number(motif_end) or not 0 < motif_end < math.inf):
        raise GenerationError(f"motif_end must be seconds > 0, got {motif_end!r}", code="invalid_params")
    codec = _codec_for_tracks(codec, tracks)
    pm = codec.read(midi)
    instruments = None
    if codec.config.instruments:  # every selected track's notes, drums too, each with its instrument
        parts = codec.instrument_notes(pm)
        notes, instruments = parts.notes, parts.instruments
    else:
        notes = codec.to_notes(pm)
    end_time = max(n.end for n in notes)
    if motif_end is not None and motif_end < end_time:
        if not any(n.start < motif_end for n in notes):
            first = min(n.start for n in notes)
            raise GenerationError(
                f"motif_end {motif_end:g} s: no note starts before it (the first starts at {first:.2f} s)",
                code="no_notes",
            )
        end_time = float(motif_end)
    primer = primer_at_cut(codec, notes, end_time, primer_seconds, max_tokens, instruments=instruments)
    # the beats of what the model reads, which the continuation goes on from (chords in beats, the file's)
    tempo = prevailing_tempo(pm, primer.start_time, primer.end_time)
    program, reason = motif_program(pm, tracks, primer.start_time, primer.end_time)
    if instruments is None:
        reason += flattened(played(pm, tracks))
    primer = replace(
        primer, tempo=tempo, program=program, program_reason=reason, timeline=Timeline.of(pm, end_time)
    )
    if instruments is not None:
        selection = codec.config.tracks
        found, places = read_tracks(pm, selection, primer.motif_notes, primer.motif_instruments, end_time)
        primer = replace(primer, tracks=found, motif_tracks=places, program_reason=TRACKS_REASON)
    return primer


def flattened(heard: set[int]) -> str:
    """What a codec without instruments did to an upload whose tracks read hold `heard` (instruments), in
    words to add to the program's reason: nothing for one instrument; else how many it merged into one stream
    and that it dropped the drums."""
    if not is_ensemble(heard):
        return ""
    pitched = len(heard - {DRUMS})
    merged = [f"{pitched} instruments merged into one stream"] if pitched > 1 else []
    return (
        "; "
        + " and ".join(merged + (["drums dropped"] if DRUMS in heard else []))
        + " (a model with instruments keeps them)"
    )


# What a continuation with instruments is written with, in the answers' words.
TRACKS_REASON = "a model with instruments: each new note on its instrument's track of the motif"


def refuse_program(primer: Primer, controls) -> None:
    """The `program` control chooses the one program a piano model's continuation is written with; a model
    with instruments writes each instrument on its own track, so no one program is the output's: refused
    (ControlError program_with_instruments) before anything is generated, rather than ignored; such a
    model's `instruments` control chooses who plays."""
    if primer.tracks is not None and controls is not None and controls.program is not None:
        raise ControlError(
            "program: this model writes each instrument of the motif on its own track with its own "
            "program; leave program empty (the instruments control chooses who plays)",
            code="program_with_instruments",
        )


CLEAR_SHARE = 0.5  # a program playing more than this share of the window's notes is the motif's instrument


def motif_program(pm, tracks, start: float, end: float) -> tuple[int, str]:
    """The General MIDI program the continuation is played on, and why in words: the program that plays
    most of the notes struck in the primer window [start, end) of the tracks read (drums aside), if it plays
    more than CLEAR_SHARE of them; else piano (0). The first track's program made a merged pop song "FX 1
    (rain)" and a piano piece with a vocal line "Choir Aahs"; a merge of a band, where no part has half the
    notes, is read back on the instrument most songs are reduced to."""
    instruments = pm.instruments
    if isinstance(tracks, list | tuple):
        instruments = [instruments[i] for i in tracks if isinstance(i, int) and 0 <= i < len(instruments)]
    counts: collections.Counter[int] = collections.Counter()
    for inst in instruments:
        if not inst.is_drum:
            counts[int(inst.program)] += sum(start <= n.start < end for n in inst.notes)
    counts = +counts  # programs that strike no note in the window are not candidates
    total = sum(counts.values())
    if not total:
        return 0, "no notes struck in the window: piano"
    program, notes = counts.most_common(1)[0]
    name = pretty_midi.program_to_instrument_name(program)
    if len(counts) == 1:
        return program, f"{name} plays every note of the motif"
    share = notes / total
    if share > CLEAR_SHARE:
        return program, f"{name} plays {share:.0%} of the motif's notes"
    return 0, f"no instrument plays more than half of the motif's notes ({name}: {share:.0%}): piano"


def default_max_primer_tokens(model) -> int:
    """Primers fill at most 3/4 of the context window, leaving room to generate before the window slides."""
    return max_primer_tokens(model.cfg.max_seq_len)


def max_primer_tokens(window: int) -> int:
    """`default_max_primer_tokens` of a model whose context window is `window` tokens (read from its config,
    without loading it)."""
    return max(1, window - max(1, window // 4))


def render(
    codec,
    primer: Primer,
    new_tokens,
    include_primer: bool = False,
    *,
    seed: int | None = None,
    sample_index: int | None = None,
    controls: dict | None = None,
) -> pretty_midi.PrettyMIDI:
    """Generated tokens -> MIDI with the motif's tempo and program.

    Continuation only: it starts at time 0, the cut (the tokens' first `primer.tail_steps` of time shifts lie
    before it; nothing struck before it, by the primer or the tokens, is the continuation's), and lasts as
    long as their time shifts after it (a text marker "end" holds that length even when the last notes end
    earlier). include_primer: every note of the motif at its original time, then the continuation from the
    motif's end, with the upload's tempo map and signatures up to there (`Primer.timeline`: its bars where
    the upload has them) and the continuation's tempo after. Notes still sounding at the end are closed
    there; any token stream renders to a valid file. The seed (and sample index) go into a text event, and
    the controls applied (`musicrel.generation.controls`), as JSON, into another.

    A primer with tracks (a codec with instruments): the motif's tracks in their order (names, programs,
    drums, the mix: `Tracks.write`), each new note on its instrument's track (`musicrel.midi.tracks`),
    placed as `NoteStream` reports it; instruments the motif lacks on new tracks after them.
    """
    if primer.tracks is not None:
        pm, end = _render_tracks(codec, primer, new_tokens, include_primer)
    else:
        pm, end = _render_piano(codec, primer, new_tokens, include_primer)
    if include_primer and primer.timeline is not None:
        primer.timeline.write_into(pm, primer.end_time, primer.tempo)
    if seed is not None:
        label = f"musicrel seed={seed}" + ("" if sample_index is None else f" sample={sample_index}")
        pm.text_events.append(pretty_midi.Text(label, 0.0))
    if controls:
        label = "musicrel controls=" + json.dumps(controls, sort_keys=True)
        pm.text_events.append(pretty_midi.Text(label, 0.0))
    pm.text_events.append(pretty_midi.Text("end", end))
    return pm


def _render_piano(
    codec, primer: Primer, new_tokens, include_primer: bool
) -> tuple[pretty_midi.PrettyMIDI, float]:
    """`render` for a codec without instruments: one track, the motif's program; (the file, its end)."""
    primer_tokens = np.asarray(primer.tokens, dtype=np.int64)
    new_tokens = np.asarray(new_tokens, dtype=np.int64).reshape(-1)
    vocab = codec.vocab_size
    new_tokens = new_tokens[(new_tokens >= 0) & (new_tokens < vocab)]
    steps = shift_steps(codec)
    step = codec.config.step_ms / 1000.0
    # Decode primer and continuation together so the velocity in force carries over; close what still sounds.
    # One step of time between them keeps what the primer struck on its last step the motif's: a note that
    # starts a hair before the cut (and rounds to it) was read by the model, and is no continuation's first
    # note (it was, at 0 s, in every continuation of 7 of 37 POP909 val pieces cut at 10 s).
    closing = (
        np.flatnonzero(open_pitches(codec, np.concatenate([primer_tokens, new_tokens])))
        + codec.note_off_offset
    )
    apart = np.array([codec.time_shift_offset])  # one step
    stream = np.concatenate([primer_tokens, apart, new_tokens, closing]).astype(np.int64)
    decoded = codec.decode(stream).instruments
    # The continuation's clock starts at the cut: the primer's end plus the silence before the cut, which the
    # first generated shifts cover (musicrel.generation.join).
    t_primer = (cut_steps(codec, primer_tokens, primer.tail_steps) + 1) * step
    length = max(int(steps[new_tokens].sum()) - primer.tail_steps, 0) * step
    offset = primer.end_time if include_primer else 0.0
    eps = 1e-6
    continuation = []
    for n in decoded[0].notes if decoded else []:
        start, end = n.start - t_primer, min(n.end - t_primer, length)
        if start >= -eps and end - start > eps:
            continuation.append(pretty_midi.Note(n.velocity, n.pitch, max(start, 0.0) + offset, end + offset))
    # Sustain pedal (codecs with pedal="events"): keep the continuation's changes, released at the end.
    pedal = [
        pretty_midi.ControlChange(c.number, c.value, min(max(c.time - t_primer, 0.0), length) + offset)
        for c in (decoded[0].control_changes if decoded else [])
        if c.time >= t_primer - eps
    ]
    if pedal and pedal[-1].value >= 64:
        pedal.append(pretty_midi.ControlChange(64, 0, offset + length))

    # 960 ticks per beat: the 10 ms grid survives writing at any usual tempo (< 1 ms per tick).
    pm = pretty_midi.PrettyMIDI(resolution=960, initial_tempo=primer.tempo)
    inst = pretty_midi.Instrument(program=primer.program, name="musicrel")
    if include_primer:
        inst.notes.extend(pretty_midi.Note(n.velocity, n.pitch, n.start, n.end) for n in primer.motif_notes)
    inst.notes.extend(continuation)
    inst.notes.sort(key=lambda n: (n.start, n.pitch))
    inst.control_changes = pedal
    pm.instruments.append(inst)
    return pm, offset + length


def _render_tracks(
    codec, primer: Primer, new_tokens, include_primer: bool
) -> tuple[pretty_midi.PrettyMIDI, float]:
    """`render` for a codec with instruments: the motif's tracks, each new note on its track; (file, end)."""
    assert primer.tracks is not None and primer.motif_tracks is not None
    new_tokens = np.asarray(new_tokens, dtype=np.int64).reshape(-1)
    new_tokens = new_tokens[(new_tokens >= 0) & (new_tokens < codec.vocab_size)]
    step = codec.config.step_ms / 1000.0
    length = max(int(shift_steps(codec)[new_tokens].sum()) - primer.tail_steps, 0) * step
    offset = primer.end_time if include_primer else 0.0
    placer = primer.tracks.placer()
    notes = NoteStream(codec, primer.tokens, primer.tail_steps, placer=placer)
    # The stream's own events, so that the file holds exactly the notes (and tracks) a stream reported.
    struck: dict[int, list] = {}  # note id -> [start, end, pitch, velocity, track]
    for e in notes.feed(new_tokens) + notes.close():
        if e.kind == "on":
            struck[e.id] = [e.time, None, e.pitch, e.velocity, e.track]
        elif e.kind == "off":
            struck[e.id][1] = min(e.time, length)
        else:
            struck.pop(e.id, None)
    by_track: list[list[pretty_midi.Note]] = [[] for _ in placer.tracks]
    if include_primer:
        for n, own in zip(primer.motif_notes, primer.motif_tracks, strict=True):
            for k in own:  # a unison double's note, read once, goes back to both its tracks
                by_track[k].append(pretty_midi.Note(n.velocity, n.pitch, n.start, n.end))
    for start, end, pitch, velocity, k in struck.values():
        by_track[k].append(pretty_midi.Note(velocity, pitch, start + offset, end + offset))
    pedal = []
    if codec.config.pedal == "events":  # the continuation's changes, released at the end, as _render_piano's
        primer_tokens = np.asarray(primer.tokens, dtype=np.int64)
        apart = np.array([codec.time_shift_offset])
        _, changes, _ = decode_tokens(codec, np.concatenate([primer_tokens, apart, new_tokens]))
        t_primer = (cut_steps(codec, primer_tokens, primer.tail_steps) + 1) * step
        pedal = [
            pretty_midi.ControlChange(64, 127 if down else 0, min(max(t - t_primer, 0.0), length) + offset)
            for t, down in changes
            if t >= t_primer - 1e-6
        ]
        if pedal and pedal[-1].value >= 64:
            pedal.append(pretty_midi.ControlChange(64, 0, offset + length))
    motif_until = primer.end_time if include_primer else None  # the upload's controllers up to the cut
    pm = primer.tracks.write(
        placer.tracks, by_track, primer.tempo, control_changes=pedal, motif_until=motif_until
    )
    return pm, offset + length


def render_result(
    codec, primer: Primer, result, include_primer: bool = False
) -> list[pretty_midi.PrettyMIDI]:
    """One MIDI per sample of a finished job (a `decode_batch.ContinuationResult`: tokens, seed, the controls
    applied), as the user gets it: the program the controls chose, else the motif's; the seed and sample index
    and the controls in text events."""
    program = (result.controls or {}).get("program")
    if program is not None and primer.tracks is None:  # refused with tracks: refuse_program
        primer = replace(primer, program=program)
    return [
        render(
            codec,
            primer,
            tokens,
            include_primer=include_primer,
            seed=result.seed,
            sample_index=i,
            controls=result.controls,
        )
        for i, tokens in enumerate(result.tokens)
    ]
