"""MIDI <-> event tokens, the performance encoding of Oore et al. (2018) used by Huang et al. (2018).

Event vocabulary (defaults): NOTE_ON 0..127, NOTE_OFF 128..255, TIME_SHIFT 256..355 (k+1 steps of 10 ms),
SET_VELOCITY 356..387 (32 bins), then PEDAL_ON, PEDAL_OFF when pedal="events", then MELODY_ON 0..127,
MELODY_OFF 0..127 when melody=True (a given melody the model accompanies: `encode_with_melody`; decoding
ignores them), then pad, bos, eos, then FUTURE, PAST, FILL when infill=True (the markers of an infill
sequence, musicrel.generation.fim: after eos, so every other id is the same with or without them).

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
- decode accepts any integers: ids outside the event ranges and specials are ignored, velocity is 64 until the
  first SET_VELOCITY, a NOTE_OFF without NOTE_ON is ignored, a NOTE_OFF on the step of its NOTE_ON gives a
  one-step note, a NOTE_ON of a pitch already sounding closes it (or replaces it when struck on the same
  step), notes left open at the end are closed at the final time but last at least `OPEN_NOTE_MIN_SECONDS`.
  The result has one piano instrument, 480 ticks per beat at 125 bpm, i.e. one tick per millisecond, so step
  times are written exactly.
- Errors: InvalidMidiError codes not_midi, truncated, bad_data_byte, bad_event (a meta/status byte the parsers
  crash on), no_notes, no_such_track, smpte_division, zero_division, too_large, too_many_tracks,
  too_many_events, too_long; paths that cannot be opened raise OSError.

Over 450 lines on purpose: the vocabulary's layout, its token kinds and both directions (encode, decode,
augmentation) change together; the raw-MIDI pre-scan they rely on is `musicrel.midi.scan`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings
from dataclasses import dataclass, field

import numpy as np
import pretty_midi

from musicrel.errors import ConfigError, InvalidMidiError
from musicrel.midi.scan import RawInstrument, instruments_from_scan, scan

OPEN_NOTE_MIN_SECONDS = 0.1
_DECODE_RESOLUTION, _DECODE_BPM = 480, 125.0  # 60 / (125 * 480) = exactly 1 ms per tick


@dataclass
class CodecConfig:
    """Codec settings; saved with every checkpoint, so `from_dict(to_dict())` is exact."""

    step_ms: int = 10  # TIME_SHIFT resolution
    max_shift_steps: int = 100  # longest single shift (1 s)
    velocity_bins: int = 32
    pedal: str = "extend"  # "extend" | "events"
    tracks: str | list[int] = "merge"  # "merge" | [instrument index, ...]
    # MELODY_ON/MELODY_OFF tokens: a given melody, interleaved with the part the model writes (accompaniment)
    melody: bool = False
    # the melody's tokens sit this far ahead of when they sound (anticipation: the part hears it coming)
    melody_lead_ms: int = 0
    # FUTURE/PAST/FILL markers after eos: the model fills a gap between the music before and after it
    # (musicrel.generation.fim); encoding is unchanged, so a folder prepared without them trains with them
    infill: bool = False
    # caps on hostile uploads, enforced by the pre-scan before any parser runs
    max_bytes: int = 4 * 1024 * 1024
    max_tracks: int = 256
    max_events: int = 2_000_000
    max_ticks: int = 4_000_000  # pretty_midi allocates ~24 bytes per tick while parsing
    max_seconds: float = 3600.0

    def __post_init__(self):
        ranges = {
            "step_ms": (1, 1000),
            "max_shift_steps": (1, 10_000),
            "melody_lead_ms": (0, 60_000),
            "velocity_bins": (1, 128),
            "max_bytes": (14, 1 << 31),
            "max_tracks": (1, 65535),
            "max_events": (1, 1 << 31),
            "max_ticks": (1, 1 << 40),
        }
        for name, (lo, hi) in ranges.items():
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not lo <= value <= hi:
                raise ConfigError(f"CodecConfig.{name} must be an integer in [{lo}, {hi}], got {value!r}")
            setattr(self, name, int(value))
        if (
            not isinstance(self.max_seconds, (int, float))
            or isinstance(self.max_seconds, bool)
            or not 0 < self.max_seconds < math.inf
        ):
            raise ConfigError(f"CodecConfig.max_seconds must be a positive number, got {self.max_seconds!r}")
        self.max_seconds = float(self.max_seconds)
        if self.pedal not in ("extend", "events"):
            raise ConfigError(f"CodecConfig.pedal must be 'extend' or 'events', got {self.pedal!r}")
        if isinstance(self.tracks, (list, tuple)):
            if not self.tracks or not all(
                isinstance(i, (int, np.integer)) and not isinstance(i, bool) and i >= 0 for i in self.tracks
            ):
                raise ConfigError(
                    f"CodecConfig.tracks must be 'merge' or a non-empty list of instrument indices >= 0, "
                    f"got {self.tracks!r}"
                )
            self.tracks = [int(i) for i in self.tracks]
        elif self.tracks != "merge":
            raise ConfigError(f"CodecConfig.tracks must be 'merge' or a list of indices, got {self.tracks!r}")
        if not isinstance(self.melody, bool):
            raise ConfigError(f"CodecConfig.melody must be true or false, got {self.melody!r}")
        if not isinstance(self.infill, bool):
            raise ConfigError(f"CodecConfig.infill must be true or false, got {self.infill!r}")
        if self.melody and not (isinstance(self.tracks, list) and len(self.tracks) >= 2):
            raise ConfigError(
                "CodecConfig.melody reads the melody from the first of `tracks` and its part from the "
                f"others: tracks must list at least two instruments, got {self.tracks!r}"
            )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CodecConfig:
        if not isinstance(d, dict):
            raise ConfigError(f"CodecConfig must be a JSON object, got {type(d).__name__}")
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(f"CodecConfig has no field(s) {', '.join(unknown)}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> CodecConfig:
        try:
            d = json.loads(s)
        except (json.JSONDecodeError, TypeError) as exc:
            raise ConfigError(f"CodecConfig JSON is malformed: {exc}") from None
        return cls.from_dict(d)


@dataclass
class _Notes:
    """Notes as parallel arrays (seconds), the codec's working form."""

    start: np.ndarray
    end: np.ndarray
    pitch: np.ndarray
    velocity: np.ndarray
    pedal_time: np.ndarray = field(default_factory=lambda: np.zeros(0))  # pedal="events": transition times
    pedal_down: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    def __len__(self) -> int:
        return len(self.start)


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
        # after eos: the ids of every other token are those of the same codec without infill
        self.future_id = self.past_id = self.fill_id = None
        if cfg.infill:
            self.future_id, self.past_id, self.fill_id = n + 3, n + 4, n + 5
            self.vocab_size = n + 6
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

    def is_melody(self, tokens):
        if self.melody_on_offset is None:
            return tokens < -1  # all False, for arrays and tensors alike
        return (tokens >= self.melody_on_offset) & (tokens < self.melody_off_offset + 128)

    # ---------------------------------------------------------------- reading
    def _bytes(self, midi) -> bytes:
        if isinstance(midi, (bytes, bytearray, memoryview)):
            return bytes(midi)
        if isinstance(midi, (str, os.PathLike)):
            with open(midi, "rb") as f:  # OSError (missing file, ...) is the caller's to report
                data = f.read(self.config.max_bytes + 1)  # never read a huge upload whole
            return data
        raise TypeError(f"midi must be a path, bytes or pretty_midi.PrettyMIDI, not {type(midi).__name__}")

    def read(self, midi) -> pretty_midi.PrettyMIDI:
        """Path, bytes or PrettyMIDI -> PrettyMIDI, pre-scanned against the caps; else InvalidMidiError."""
        if isinstance(midi, pretty_midi.PrettyMIDI):
            return midi
        data = self._bytes(midi)
        scan(data, self.config)
        import io

        import mido

        try:
            mf = mido.MidiFile(file=io.BytesIO(data))
            # pretty_midi crashes on an empty track chunk; it carries nothing, so drop it
            mf.tracks = [t for t in mf.tracks if len(t)]
            if not mf.tracks:
                raise InvalidMidiError("the file has no events", code="no_notes")
            with warnings.catch_warnings():
                warnings.simplefilter(
                    "ignore"
                )  # tempo on non-zero tracks: pretty_midi's choice is documented
                return pretty_midi.PrettyMIDI(mido_object=mf)
        except InvalidMidiError:
            raise
        except Exception as exc:  # the parser stack raises OSError/ValueError/KeyError/...: one typed error
            raise InvalidMidiError(f"MIDI parser rejected the file: {exc}", code="not_midi") from None

    def _instruments(self, midi) -> list[RawInstrument]:
        if isinstance(midi, pretty_midi.PrettyMIDI):
            out = []
            for inst in midi.instruments:
                notes = np.array(
                    [(n.start, n.end, n.pitch, n.velocity) for n in inst.notes], dtype=np.float64
                ).reshape(-1, 4)
                cc = np.array(
                    [(c.time, c.value) for c in inst.control_changes if c.number == 64], dtype=np.float64
                ).reshape(-1, 2)
                out.append(RawInstrument(int(inst.program), bool(inst.is_drum), notes, cc))
            return out
        # fast path: the pre-scan already walked every event; build pretty_midi's instruments from it
        data = self._bytes(midi)
        result = scan(data, self.config, collect=True)
        if not result.tracks:
            raise InvalidMidiError("the file has no events", code="no_notes")
        return instruments_from_scan(result)

    # ---------------------------------------------------------------- notes
    def _collect(self, instruments: list[RawInstrument], tracks=None) -> _Notes:
        """Select/merge tracks, drop drums, apply the pedal policy, leave one sounding note per pitch."""
        tracks = self.config.tracks if tracks is None else tracks
        if tracks != "merge":
            bad = [i for i in tracks if i >= len(instruments)]
            if bad:
                raise InvalidMidiError(
                    f"track index {bad[0]} out of range: the file has {len(instruments)} instruments",
                    code="no_such_track",
                )
            instruments = [instruments[i] for i in tracks]
        instruments = [inst for inst in instruments if not inst.is_drum]
        parts, transitions = [], []
        for inst in instruments:
            notes = inst.notes
            if not len(notes):
                continue
            cc = inst.sustain[np.argsort(inst.sustain[:, 0], kind="stable")]
            if self.config.pedal == "extend":
                notes = notes.copy()
                notes[:, 1] = _extend_by_pedal(notes[:, 1], cc[:, 0], cc[:, 1] >= 64)
            elif len(cc):
                down = cc[:, 1] >= 64
                change = down != np.concatenate(([False], down[:-1]))
                transitions.append(np.stack([cc[change, 0], np.where(down[change], 1.0, -1.0)], axis=1))
            parts.append(notes)
        if not parts:
            raise InvalidMidiError("no notes (after dropping drums and unselected tracks)", code="no_notes")
        notes = np.concatenate(parts)
        start, pitch, velocity = notes[:, 0], notes[:, 2].astype(np.int64), notes[:, 3].astype(np.int64)
        end = np.maximum(notes[:, 1], start)
        keep = (pitch >= 0) & (pitch <= 127)
        if not keep.any():
            raise InvalidMidiError("no notes with a pitch in 0..127", code="no_notes")
        start, end, pitch, velocity = start[keep], end[keep], pitch[keep], velocity[keep]
        # one sounding note per pitch: same-pitch duplicates keep the longest, overlaps end at the next onset
        order = np.lexsort((-end, start, pitch))
        start, end, pitch, velocity = start[order], end[order], pitch[order], velocity[order]
        same = pitch[1:] == pitch[:-1]
        dup = np.concatenate(([False], same & (start[1:] == start[:-1])))
        start, end, pitch, velocity = start[~dup], end[~dup], pitch[~dup], velocity[~dup]
        nxt = np.concatenate((np.where(pitch[1:] == pitch[:-1], start[1:], np.inf), [np.inf]))
        end = np.minimum(end, nxt)
        order = np.lexsort((pitch, start))
        out = _Notes(start[order], end[order], pitch[order], velocity[order])
        if transitions:
            tr = np.concatenate(transitions)
            tr = tr[np.argsort(tr[:, 0], kind="stable")]
            out.pedal_time = tr[:, 0]
            out.pedal_down = np.cumsum(tr[:, 1]) > 0  # merged pedal: down while any instrument holds it
        return out

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
        return np.floor(np.asarray(seconds, dtype=np.float64) / self.step + 0.5).astype(np.int64)

    def _encode(self, notes: _Notes) -> np.ndarray:
        return self._with_shifts(*self._events(notes))

    def _events(self, notes: _Notes) -> tuple[np.ndarray, np.ndarray]:
        """(step, token) of every non-shift token, in stream order."""
        qs = np.maximum(self._steps(notes.start), 0)
        qe = np.maximum(self._steps(notes.end), qs + 1)  # a note shorter than a step still sounds one step
        pitch = np.asarray(notes.pitch, dtype=np.int64)
        vel = np.clip(np.asarray(notes.velocity, dtype=np.int64), 0, 127)
        keep = (pitch >= 0) & (pitch <= 127)
        qs, qe, pitch, vel = qs[keep], qe[keep], pitch[keep], vel[keep]
        if not len(qs):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        # quantisation can make same-pitch notes collide: keep the longest, end each at the next onset
        order = np.lexsort((-qe, qs, pitch))
        qs, qe, pitch, vel = qs[order], qe[order], pitch[order], vel[order]
        same = pitch[1:] == pitch[:-1]
        dup = np.concatenate(([False], same & (qs[1:] == qs[:-1])))
        qs, qe, pitch, vel = qs[~dup], qe[~dup], pitch[~dup], vel[~dup]
        never = np.iinfo(np.int64).max
        nxt = np.concatenate((np.where(pitch[1:] == pitch[:-1], qs[1:], never), [never]))
        qe = np.minimum(qe, nxt)

        n = len(qs)
        times = [qe, qs]
        kinds = [np.full(n, 1), np.full(n, 2)]  # at one step: pedal (0), note-off (1), note-on (2)
        toks = [self.note_off_offset + pitch, self.note_on_offset + pitch]
        keys = [pitch, pitch]
        bins = [np.full(n, -1), vel * self.config.velocity_bins // 128]
        if self.pedal_on_id is not None and len(notes.pedal_time):
            pt = np.maximum(self._steps(notes.pedal_time), 0)
            down = notes.pedal_down
            last = np.concatenate((pt[1:] != pt[:-1], [True]))  # the state at the end of each step counts
            pt, down = pt[last], down[last]
            change = down != np.concatenate(([False], down[:-1]))
            pt, down = pt[change], down[change]
            times.append(pt)
            kinds.append(np.zeros(len(pt), dtype=np.int64))
            toks.append(np.where(down, self.pedal_on_id, self.pedal_off_id))
            keys.append(np.zeros(len(pt), dtype=np.int64))
            bins.append(np.full(len(pt), -1))
        time, kind, tok, key, vbin = (np.concatenate(x) for x in (times, kinds, toks, keys, bins))
        order = np.lexsort((key, kind, time))
        time, kind, tok, vbin = time[order], kind[order], tok[order], vbin[order]
        # SET_VELOCITY only when the bin differs from the previous note-on's
        on = np.flatnonzero(kind == 2)
        on_bins = vbin[on]
        changed = on[on_bins != np.concatenate(([-1], on_bins[:-1]))]
        tok = np.insert(tok, changed, self.velocity_offset + vbin[changed])
        time = np.insert(time, changed, time[changed])
        return time, tok

    def _with_shifts(self, time: np.ndarray, tok: np.ndarray, end_time: int | None = None) -> np.ndarray:
        """Interleave TIME_SHIFT tokens so that token i happens at step time[i] (non-decreasing)."""
        if end_time is not None:
            time = np.append(time, max(end_time, time[-1] if len(time) else 0))
        delta = np.diff(time, prepend=0)
        m = self.config.max_shift_steps
        full, rem = delta // m, delta % m
        nshift = full + (rem > 0)
        count = nshift + 1
        if end_time is not None:
            count[-1] -= 1  # the end marker itself emits no token
        pos = np.cumsum(count) - count  # where each event's shifts begin
        out = np.empty(int(count.sum()), dtype=np.int32)
        # full shifts: pos[i] + 0 .. full[i]-1
        total_full = int(full.sum())
        if total_full:
            first = np.repeat(pos, full)
            within = np.arange(total_full) - np.repeat(np.cumsum(full) - full, full)
            out[first + within] = self.time_shift_offset + m - 1
        r = rem > 0
        out[(pos + full)[r]] = self.time_shift_offset + rem[r] - 1
        ev = pos + nshift
        out[ev[:-1] if end_time is not None else ev] = tok
        return out

    def encode_notes(self, notes) -> np.ndarray:
        """Notes (anything with start/end/pitch/velocity; seconds from 0.0) -> event tokens (int32)."""
        return self._encode(_notes_array(notes))

    def encode_with_melody(self, melody, notes) -> np.ndarray:
        """A melody (notes; velocities ignored) and the notes that go with it -> one stream (needs
        `CodecConfig.melody`): the melody as MELODY_OFF/MELODY_ON tokens placed first at each step, so the
        part written at a step knows the melody note sounding then."""
        return self._melody_stream(_notes_array(melody), _notes_array(notes))

    def melody_events(self, melody) -> tuple[np.ndarray, np.ndarray]:
        """A melody (notes) -> (step, MELODY token) of its events in stream order, for a decoder to place."""
        return self._melody_events(_notes_array(melody))

    def _melody_events(self, melody: _Notes) -> tuple[np.ndarray, np.ndarray]:
        if self.melody_on_offset is None:
            raise ConfigError(
                "this codec has no melody tokens (CodecConfig.melody is false)", code="no_melody"
            )
        mt, mtok = self._events(melody)
        keep = self.is_note_on(mtok) | self.is_note_off(mtok)  # a melody carries no velocity
        mt, mtok = mt[keep], mtok[keep]
        lead = self.melody_lead_steps
        if lead:  # ahead of time; order kept (a stable sort later merges them with the part)
            mt = np.maximum(mt - lead, 0)
        on = self.is_note_on(mtok)
        return mt, np.where(
            on, self.melody_on_offset + mtok, self.melody_off_offset + mtok - self.note_off_offset
        )

    def _melody_stream(self, melody: _Notes, part: _Notes) -> np.ndarray:
        mt, mtok = self._melody_events(melody)
        time, tok = self._events(part)
        both_t, both = np.concatenate((mt, time)), np.concatenate((mtok, tok))
        order = np.argsort(both_t, kind="stable")
        return self._with_shifts(both_t[order], both[order])

    def encode(self, midi) -> np.ndarray:
        """Path, bytes or PrettyMIDI -> event tokens (int32, no bos/eos). Paths and bytes never go through
        pretty_midi: the pre-scan reproduces its notes exactly and is several times faster. With
        `CodecConfig.melody` the first of `tracks` is the melody and the others are its part."""
        instruments = self._instruments(midi)
        if self.config.melody:
            first, *rest = self.config.tracks
            return self._melody_stream(self._collect(instruments, [first]), self._collect(instruments, rest))
        return self._encode(self._collect(instruments))

    # ---------------------------------------------------------------- decoding
    def _decode(self, tokens) -> tuple[list[pretty_midi.Note], list[tuple[float, bool]]]:
        try:
            toks = np.asarray(tokens).astype(np.int64, copy=False).ravel().tolist()
        except (OverflowError, TypeError, ValueError):  # ints beyond int64 are out of range anyway
            toks = [int(t) if abs(int(t)) < 1 << 62 else -1 for t in np.asarray(tokens, dtype=object).ravel()]
        step = self.step
        off_off, ts_off, vel_off = (
            self.note_off_offset,
            self.time_shift_offset,
            self.velocity_offset,
        )
        vel_end = vel_off + self.config.velocity_bins
        bin_velocity = self._bin_velocity.tolist()
        t = 0
        velocity = 64
        open_notes: dict[int, tuple[int, int]] = {}  # pitch -> (start step, velocity)
        last_closed: dict[
            int, int
        ] = {}  # pitch -> index in notes, to trim a one-step note a re-strike overlaps
        notes: list[list] = []  # [start step, end step, pitch, velocity]
        pedal: list[tuple[int, bool]] = []
        pedal_down = False
        for tok in toks:
            if tok < 0:
                continue
            if tok < off_off:
                pitch = tok
                prev = open_notes.pop(pitch, None)
                if prev is not None and prev[0] < t:
                    last_closed[pitch] = len(notes)
                    notes.append([prev[0], t, pitch, prev[1]])
                j = last_closed.get(pitch)
                if j is not None and notes[j][1] > t:  # a one-step note would overlap the re-strike
                    notes[j][1] = t
                open_notes[pitch] = (t, velocity)
            elif tok < ts_off:
                pitch = tok - off_off
                prev = open_notes.pop(pitch, None)
                if prev is not None:
                    last_closed[pitch] = len(notes)
                    notes.append([prev[0], max(t, prev[0] + 1), pitch, prev[1]])
            elif tok < vel_off:
                t += tok - ts_off + 1
            elif tok < vel_end:
                velocity = bin_velocity[tok - vel_off]
            elif tok == self.pedal_on_id or tok == self.pedal_off_id:
                down = tok == self.pedal_on_id
                if down != pedal_down:
                    pedal.append((t, down))
                    pedal_down = down
        min_open = max(1, round(OPEN_NOTE_MIN_SECONDS / step))
        for pitch, (s, v) in open_notes.items():
            notes.append([s, max(t, s + min_open), pitch, v])
        notes = [n for n in notes if n[1] > n[0]]
        notes.sort(key=lambda n: (n[0], n[2]))
        out = [pretty_midi.Note(velocity=v, pitch=p, start=s * step, end=e * step) for s, e, p, v in notes]
        return out, [(s * step, d) for s, d in pedal]

    def decode_notes(self, tokens) -> list[pretty_midi.Note]:
        """Any int sequence -> notes sorted by (start, pitch) (pedal events are not applied to notes)."""
        return self._decode(tokens)[0]

    def heard(self, notes) -> list[pretty_midi.Note]:
        """`notes` as this codec renders them (encoded, then decoded): times on its step, velocities on its
        bins, what a model's notes can be. An evaluation reads the truth this way, so that a comparison with a
        model's notes is about the music, not the codec's rounding (the classifier told a music21 score from
        its own notes through the codec at AUC 0.74, by durations on its bin edges)."""
        return self.decode_notes(self.encode_notes(notes))

    def decode(self, tokens) -> pretty_midi.PrettyMIDI:
        """Any int sequence -> a valid PrettyMIDI with one piano instrument (pedal events become CC64)."""
        notes, pedal = self._decode(tokens)
        pm = pretty_midi.PrettyMIDI(resolution=_DECODE_RESOLUTION, initial_tempo=_DECODE_BPM)
        inst = pretty_midi.Instrument(program=0, name="musicrel")
        inst.notes = notes
        inst.control_changes = [pretty_midi.ControlChange(64, 127 if d else 0, s) for s, d in pedal]
        pm.instruments.append(inst)
        return pm

    # ---------------------------------------------------------------- augmentation
    def transpose(self, tokens, semitones: int) -> np.ndarray:
        """Shift every NOTE_ON/NOTE_OFF (and MELODY_ON/OFF) by `semitones`; notes pushed out of 0..127 are
        dropped (on & off)."""
        toks = np.asarray(tokens).astype(np.int64).ravel()
        is_on, is_off, is_mel = self.is_note_on(toks), self.is_note_off(toks), self.is_melody(toks)
        note = is_on | is_off | is_mel
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


def _notes_array(notes) -> _Notes:
    arr = np.array([(n.start, n.end, n.pitch, n.velocity) for n in notes], dtype=np.float64).reshape(-1, 4)
    return _Notes(arr[:, 0], arr[:, 1], arr[:, 2].astype(np.int64), arr[:, 3].astype(np.int64))


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


def _extend_by_pedal(end: np.ndarray, cc_time: np.ndarray, cc_down: np.ndarray) -> np.ndarray:
    """Magenta's sustain: a note whose release falls while the pedal is down (a pedal change at the very
    same time counts first) sounds until the next pedal release, or the instrument's last event if none."""
    if not len(cc_time):
        return end
    idx = np.searchsorted(cc_time, end, side="right") - 1
    held = (idx >= 0) & cc_down[np.maximum(idx, 0)]
    ups = np.flatnonzero(~cc_down)
    k = np.searchsorted(ups, idx, side="right")
    last = max(float(end.max()), float(cc_time.max()))
    release = np.where(k < len(ups), cc_time[ups[np.minimum(k, len(ups) - 1)]] if len(ups) else last, last)
    return np.where(held, np.maximum(end, release), end)
