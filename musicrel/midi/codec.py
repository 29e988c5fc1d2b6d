"""MIDI <-> event tokens, the performance encoding of Oore et al. (2018) used by Huang et al. (2018).

Event vocabulary (defaults): NOTE_ON 0..127, NOTE_OFF 128..255, TIME_SHIFT 256..355 (k+1 steps of 10 ms),
SET_VELOCITY 356..387 (32 bins), then PEDAL_ON, PEDAL_OFF when pedal="events", then MELODY_ON 0..127,
MELODY_OFF 0..127 when melody=True (a given melody the model accompanies: `encode_with_melody`; decoding
ignores them), then pad, bos, eos, then FUTURE, PAST, FILL when infill=True (the markers of an infill
sequence, musicrel.generation.fim: after eos, so every id before them is the same with or without them, and
the INSTRUMENT ids after them move up by three: `id_map`), then INSTRUMENT 0..128 when instruments=True
(General MIDI programs 0..127, then drums: after every other id, so a checkpoint's rows keep their ids when
its vocabulary grows by them).

Choices a caller can rely on:
- Absolute times are quantised by rounding to the step grid, then shifts are emitted between quantised times,
  so errors never accumulate (a 20-minute piece ends within half a step). Gaps longer than one max shift are
  repeated max shifts.
- At one time step: pedal changes, then note-offs, then note-ons (each sorted by pitch); SET_VELOCITY only
  when the bin changes, just before the NOTE_ON it applies to.
- One sounding note per pitch: a re-struck pitch closes the previous note first; two notes of a pitch starting
  on the same step keep the longest. Notes shorter than a step get one step rather than being dropped.
- pedal="extend" (Magenta): a note released while CC64 >= 64 sounds until the pedal is released, or until its
  pitch is struck again; if the pedal is never released it sounds until the instrument's last event.
  pedal="events": notes keep their own lengths and PEDAL_ON/PEDAL_OFF tokens carry the (merged) pedal;
  `decode` writes them back as CC64 127/0 so any player sustains.
- tracks="merge" merges every non-drum instrument; a list selects pretty_midi instrument indices (drums among
  them are still dropped); an index the file does not have raises InvalidMidiError(code="no_such_track").
- instruments=True (musicrel.midi.instruments; docs/INSTRUMENTS.md): every note has an instrument, its track's
  General MIDI program, or DRUMS for a drum track (channel 10) whatever its program; drums are kept (merged or
  selected). An INSTRUMENT token precedes a note event (on or off) whose instrument differs from the previous
  note event's; time shifts, SET_VELOCITY (one velocity state for all) and the pedal are shared. At one step:
  the pedal, then instrument by instrument, each note-offs before note-ons by pitch, so an instrument is
  switched to at most once per step: first the instrument of the previous note event when it plays at this
  step (it needs no INSTRUMENT token: 15-45 % fewer of them on the multi corpus), then the others by number
  (drums last); INSTRUMENT comes before the SET_VELOCITY of its note.
  One sounding note per (instrument, pitch). Tracks of one program (a quartet's two violins) are one
  instrument: merged as a piano's two hands are. A note's program is the one in effect at its note-off
  (pretty_midi's rule), so a program change inside a track splits it into instruments. decode gives one
  track per instrument with notes (ascending, drums last), named by its General MIDI name ("Drums", is_drum:
  channel 10); `decode_instrument_notes` gives each note's instrument, `instrument_notes` a file's.
  transpose leaves the drums' pitches alone. melody=True with instruments is refused (ConfigError).
- decode accepts any integers: ids outside the event ranges and specials are ignored, velocity is 64 until the
  first SET_VELOCITY, a NOTE_OFF without NOTE_ON is ignored, a NOTE_OFF on the step of its NOTE_ON gives a
  one-step note, a NOTE_ON of a pitch already sounding closes it (or replaces it when struck on the same
  step), notes left open at the end are closed at the final time but last at least `OPEN_NOTE_MIN_SECONDS`.
  The result has one piano instrument, 480 ticks per beat at 125 bpm, i.e. one tick per millisecond, so step
  times are written exactly.
- Errors: InvalidMidiError codes not_midi, truncated, bad_data_byte, bad_event (a meta/status byte the parsers
  crash on), no_notes, no_such_track, smpte_division, zero_division, too_large, too_many_tracks,
  too_many_events, too_long; paths that cannot be opened raise OSError.

The modules: `config.py` `CodecConfig` · `notes.py` reading a file's instruments and collecting its
notes · `encode.py` notes -> tokens · `decode.py` tokens -> notes · this module the vocabulary, the token
kinds and the `EventCodec` that ties them together (and the augmentations, which edit tokens in place).
"""

from __future__ import annotations

import math

import numpy as np
import pretty_midi

from musicrel.errors import ConfigError
from musicrel.midi.config import CodecConfig
from musicrel.midi.decode import OPEN_NOTE_MIN_SECONDS, decode_tokens
from musicrel.midi.encode import events, melody_events, melody_stream, to_steps, with_shifts
from musicrel.midi.instruments import (
    DRUMS,
    NUM_INSTRUMENTS,
    InstrumentNotes,
    current_instrument,
    to_pretty_midi,
)
from musicrel.midi.notes import Notes, collect, notes_array, raw_instruments
from musicrel.midi.notes import read as read_midi
from musicrel.midi.scan import RawInstrument

__all__ = ["OPEN_NOTE_MIN_SECONDS", "CodecConfig", "EventCodec", "open_pitches", "shift_steps"]

_DECODE_RESOLUTION, _DECODE_BPM = 480, 125.0  # 60 / (125 * 480) = exactly 1 ms per tick


class EventCodec:
    """MIDI <-> 1-D int token sequences (see the module docstring for every convention)."""

    def __init__(self, config: CodecConfig | None = None):
        self.config = config if config is not None else CodecConfig()
        cfg = self.config
        self.step = cfg.step_ms / 1000.0
        self.note_on_offset = 0
        self.note_off_offset = 128
        self.time_shift_offset = 256
        self.velocity_offset = self.time_shift_offset + cfg.max_shift_steps
        n = self.velocity_offset + cfg.velocity_bins
        if cfg.pedal == "events":
            self.pedal_on_id, self.pedal_off_id = n, n + 1
            n += 2
        else:
            self.pedal_on_id = self.pedal_off_id = None
        self.melody_on_offset = self.melody_off_offset = None
        self.melody_lead_steps = int(round(cfg.melody_lead_ms / cfg.step_ms))
        if cfg.melody:  # before the specials, so `token >= pad_id` still means "a special"
            self.melody_on_offset, self.melody_off_offset = n, n + 128
            n += 256
        self.num_events = n
        self.pad_id, self.bos_id, self.eos_id = n, n + 1, n + 2
        self.vocab_size = n + 3
        # after eos: every id before them is the one without infill (INSTRUMENT ids move up: `id_map`)
        self.future_id = self.past_id = self.fill_id = None
        if cfg.infill:
            self.future_id, self.past_id, self.fill_id = n + 3, n + 4, n + 5
            self.vocab_size = n + 6
        # after everything else, so a checkpoint's rows keep their ids and the new rows are appended
        self.instrument_offset = self.drums_id = None
        self.num_instruments = 0
        if cfg.instruments:
            self.instrument_offset, self.num_instruments = self.vocab_size, NUM_INSTRUMENTS
            self.drums_id = self.instrument_offset + DRUMS
            self.vocab_size += NUM_INSTRUMENTS
        self.time_advance = np.zeros(self.vocab_size, dtype=np.float64)
        steps = np.arange(1, cfg.max_shift_steps + 1)
        self.time_advance[self.time_shift_offset : self.velocity_offset] = steps * self.step
        bins = np.arange(cfg.velocity_bins)
        self._bin_velocity = np.clip((bins * 128 + 64) // cfg.velocity_bins, 1, 127)

    def __repr__(self) -> str:
        return f"EventCodec({self.config!r})"

    # ---------------------------------------------------------------- token kinds
    # Work on numpy arrays and torch tensors alike (comparisons only), so the grammar masks with them too.
    def is_note_on(self, tokens):
        return (tokens >= self.note_on_offset) & (tokens < self.note_on_offset + 128)

    def is_note_off(self, tokens):
        return (tokens >= self.note_off_offset) & (tokens < self.note_off_offset + 128)

    def is_time_shift(self, tokens):
        return (tokens >= self.time_shift_offset) & (tokens < self.velocity_offset)

    def is_instrument(self, tokens):
        if self.instrument_offset is None:
            return tokens < -1  # all False, for arrays and tensors alike
        return (tokens >= self.instrument_offset) & (tokens < self.instrument_offset + self.num_instruments)

    def is_special(self, tokens):
        """pad, bos, eos and the infill markers: placed, never events (an INSTRUMENT token is an event)."""
        return (tokens >= self.pad_id) & ~self.is_instrument(tokens)

    def is_melody(self, tokens):
        if self.melody_on_offset is None:
            return tokens < -1  # all False, for arrays and tensors alike
        return (tokens >= self.melody_on_offset) & (tokens < self.melody_off_offset + 128)

    # ---------------------------------------------------------------- reading
    def read(self, midi) -> pretty_midi.PrettyMIDI:
        """Path, bytes or PrettyMIDI -> PrettyMIDI, pre-scanned against the caps; else InvalidMidiError."""
        return read_midi(self.config, midi)

    def _instruments(self, midi) -> list[RawInstrument]:
        return raw_instruments(self.config, midi)

    def _collect(self, instruments: list[RawInstrument], tracks=None) -> Notes:
        return collect(self.config, instruments, tracks)

    def instrument_notes(self, midi) -> InstrumentNotes:
        """A file's notes as `to_notes` reads them, with the instrument of each (needs instruments: a codec
        without them has one stream, ConfigError code no_instruments)."""
        self._require_instruments()
        notes = self._collect(self._instruments(midi))
        return InstrumentNotes(
            [
                pretty_midi.Note(velocity=int(v), pitch=int(p), start=float(s), end=float(e))
                for s, e, p, v in zip(notes.start, notes.end, notes.pitch, notes.velocity, strict=True)
            ],
            [int(i) for i in notes.instrument],
        )

    def _require_instruments(self) -> None:
        if self.instrument_offset is None:
            raise ConfigError(
                "this codec has no instrument tokens (CodecConfig.instruments is false)",
                code="no_instruments",
            )

    def to_notes(self, pm) -> list[pretty_midi.Note]:
        """Drums dropped, tracks selected/merged, pedal extended (pedal="extend"), one note per pitch at a
        time, sorted by (start, pitch). InvalidMidiError(code="no_notes") when nothing is left."""
        notes = self._collect(self._instruments(pm))
        return [
            pretty_midi.Note(velocity=int(v), pitch=int(p), start=float(s), end=float(e))
            for s, e, p, v in zip(notes.start, notes.end, notes.pitch, notes.velocity, strict=True)
        ]

    # ---------------------------------------------------------------- encoding
    def _steps(self, seconds: np.ndarray) -> np.ndarray:
        """Round (not truncate) to the step grid."""
        return to_steps(self, seconds)

    def _with_shifts(self, time: np.ndarray, tok: np.ndarray, end_time: int | None = None) -> np.ndarray:
        return with_shifts(self, time, tok, end_time)

    def encode_notes(self, notes, instruments=None) -> np.ndarray:
        """Notes (anything with start/end/pitch/velocity; seconds from 0.0) -> event tokens (int32).
        `instruments`: each note's instrument (program 0..127, DRUMS), for a codec with instruments (None:
        all the piano's, program 0); a codec without them ignores it."""
        if instruments is None and self.instrument_offset is not None:
            instruments = np.zeros(len(notes), np.int64)
        return with_shifts(self, *events(self, notes_array(notes, instruments)))

    def encode_with_melody(self, melody, notes) -> np.ndarray:
        """A melody (notes; velocities ignored) and the notes that go with it -> one stream (needs
        `CodecConfig.melody`): the melody as MELODY_OFF/MELODY_ON tokens placed first at each step, so the
        part written at a step knows the melody note sounding then."""
        return melody_stream(self, notes_array(melody), notes_array(notes))

    def melody_events(self, melody) -> tuple[np.ndarray, np.ndarray]:
        """A melody (notes) -> (step, MELODY token) of its events in stream order, for a decoder to place."""
        return melody_events(self, notes_array(melody))

    def encode(self, midi) -> np.ndarray:
        """Path, bytes or PrettyMIDI -> event tokens (int32, no bos/eos). Paths and bytes never go through
        pretty_midi: the pre-scan reproduces its notes exactly and is several times faster. With
        `CodecConfig.melody` the first of `tracks` is the melody and the others are its part."""
        instruments = self._instruments(midi)
        if self.config.melody:
            first, *rest = self.config.tracks
            return melody_stream(self, self._collect(instruments, [first]), self._collect(instruments, rest))
        return with_shifts(self, *events(self, self._collect(instruments)))

    # ---------------------------------------------------------------- decoding
    def _decode(self, tokens) -> tuple[list[pretty_midi.Note], list[tuple[float, bool]]]:
        return decode_tokens(self, tokens)[:2]

    def decode_notes(self, tokens) -> list[pretty_midi.Note]:
        """Any int sequence -> notes sorted by (start, pitch) (pedal events are not applied to notes); with
        instruments by (start, instrument, pitch), each note's instrument in `decode_instrument_notes`."""
        return self._decode(tokens)[0]

    def decode_instrument_notes(self, tokens) -> InstrumentNotes:
        """Any int sequence -> its notes and the instrument of each (what a route maps back to tracks)."""
        self._require_instruments()
        notes, _, instruments = decode_tokens(self, tokens)
        return InstrumentNotes(notes, instruments)

    def heard(self, notes) -> list[pretty_midi.Note]:
        """`notes` as this codec renders them (encoded, then decoded): times on its step, velocities on its
        bins, what a model's notes can be. An evaluation reads the truth this way, so that a comparison with a
        model's notes is about the music, not the codec's rounding (the classifier told a music21 score from
        its own notes through the codec at AUC 0.74, by durations on its bin edges)."""
        return self.decode_notes(self.encode_notes(notes))

    def decode(self, tokens) -> pretty_midi.PrettyMIDI:
        """Any int sequence -> a valid PrettyMIDI with one piano instrument (pedal events become CC64); with
        instruments, one track per instrument that has notes (`instruments.to_pretty_midi`)."""
        notes, pedal, instruments = decode_tokens(self, tokens)
        if self.instrument_offset is not None:
            return to_pretty_midi(InstrumentNotes(notes, instruments), pedal, _DECODE_RESOLUTION, _DECODE_BPM)
        pm = pretty_midi.PrettyMIDI(resolution=_DECODE_RESOLUTION, initial_tempo=_DECODE_BPM)
        inst = pretty_midi.Instrument(program=0, name="musicrel")
        inst.notes = notes
        inst.control_changes = [pretty_midi.ControlChange(64, 127 if d else 0, s) for s, d in pedal]
        pm.instruments.append(inst)
        return pm

    # ---------------------------------------------------------------- augmentation
    def transpose(self, tokens, semitones: int, instrument: int = 0) -> np.ndarray:
        """Shift every NOTE_ON/NOTE_OFF (and MELODY_ON/OFF) by `semitones`; notes pushed out of 0..127 are
        dropped (on & off). With instruments, drums keep their pitches (a pitch is a drum there);
        `instrument` is the one in effect before the first token (a crop from inside a piece)."""
        toks = np.asarray(tokens).astype(np.int64).ravel()
        is_on, is_off, is_mel = self.is_note_on(toks), self.is_note_off(toks), self.is_melody(toks)
        note = is_on | is_off | is_mel
        if self.instrument_offset is not None:
            playing = current_instrument(toks, self.is_instrument(toks), self.instrument_offset, instrument)
            note &= playing != DRUMS
        base = np.where(is_on, self.note_on_offset, self.note_off_offset)
        if is_mel.any():
            base = np.where(
                is_mel,
                np.where(toks < self.melody_off_offset, self.melody_on_offset, self.melody_off_offset),
                base,
            )
        pitch = toks - base + int(semitones)
        out = np.where(note, toks + int(semitones), toks)
        keep = ~note | ((pitch >= 0) & (pitch <= 127))
        return out[keep].astype(np.int32)

    def stretch(self, tokens, factor: float) -> np.ndarray:
        """Scale time by `factor` (> 1 slower): every non-shift token moves to round(t * factor) on the step
        grid and shifts are re-emitted; time after the last event is kept (scaled) as trailing shifts."""
        if not (isinstance(factor, (int, float)) and 0 < factor < math.inf):
            raise ConfigError(f"stretch factor must be a positive number, got {factor!r}")
        toks = np.asarray(tokens).astype(np.int64).ravel()
        is_shift = self.is_time_shift(toks)
        adv = np.where(is_shift, toks - self.time_shift_offset + 1, 0)
        clock = np.cumsum(adv)
        keep = ~is_shift
        times = np.floor(clock[keep] * float(factor) + 0.5).astype(np.int64)
        end = int(np.floor((clock[-1] if len(clock) else 0) * float(factor) + 0.5))
        return self._with_shifts(times, toks[keep], end_time=end)


def id_map(old: EventCodec, new: EventCodec) -> np.ndarray | None:
    """(old.vocab_size,) int64: each of `old`'s ids as `new` spells the same token, for a `new` that only adds
    infill markers or instruments to `old` (a folder prepared without markers, read by a model with them);
    None where every id stays. The markers come after eos and the INSTRUMENT ids after them, so adding the
    markers to a codec with instruments moves every INSTRUMENT id up by three."""
    dropped = old.instrument_offset is not None and new.instrument_offset is None
    if old.num_events != new.num_events or dropped:
        raise ValueError(f"{new} does not extend {old}")
    table = np.arange(old.vocab_size, dtype=np.int64)
    if old.fill_id is not None:
        if new.fill_id is None:
            raise ValueError(f"{new} does not extend {old}")
        table[old.future_id : old.fill_id + 1] = [new.future_id, new.past_id, new.fill_id]
    if old.instrument_offset is not None:
        table[old.instrument_offset :] = new.instrument_offset + np.arange(old.num_instruments)
    return None if np.array_equal(table, np.arange(old.vocab_size)) else table


def shift_steps(codec: EventCodec) -> np.ndarray:
    """(vocab,) int64: time steps each token advances (0 but for shifts); integers, so lengths add up."""
    return np.rint(codec.time_advance / codec.step).astype(np.int64)


def open_pitches(codec: EventCodec, tokens) -> np.ndarray:
    """(128,) bool: pitches sounding after `tokens` (a note-on more recent than the pitch's last note-off)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    index = np.arange(len(tokens))
    last_on = np.full(128, -1)
    last_off = np.full(128, -1)
    on, off = codec.is_note_on(tokens), codec.is_note_off(tokens)
    np.maximum.at(last_on, tokens[on] - codec.note_on_offset, index[on])
    np.maximum.at(last_off, tokens[off] - codec.note_off_offset, index[off])
    return last_on > last_off
