"""A MIDI file's notes as the codec reads them: the bytes pre-scanned against the caps, each instrument's
notes and sustain changes, then tracks selected or merged, the pedal policy applied and one sounding note per
pitch left (`collect`). The codec's conventions are in `musicrel.midi.codec`'s docstring."""

from __future__ import annotations

import io
import os
import warnings
from dataclasses import dataclass, field

import numpy as np
import pretty_midi

from musicrel.errors import ConfigError, InvalidMidiError
from musicrel.midi.config import CodecConfig
from musicrel.midi.instruments import DRUMS, instrument_of
from musicrel.midi.scan import RawInstrument, instruments_from_scan, scan


@dataclass
class Notes:
    """Notes as parallel arrays (seconds), the codec's working form."""

    start: np.ndarray
    end: np.ndarray
    pitch: np.ndarray
    velocity: np.ndarray
    pedal_time: np.ndarray = field(default_factory=lambda: np.zeros(0))  # pedal="events": transition times
    pedal_down: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    # an instruments codec: each note's instrument (program 0..127, DRUMS); None: one instrument
    instrument: np.ndarray | None = None

    def voice(self) -> np.ndarray:
        """(N,) int64: instrument x 128 + pitch, the key of "one sounding note per (instrument, pitch)"; the
        pitch itself without instruments."""
        return voices(self.instrument, self.pitch)

    def __len__(self) -> int:
        return len(self.start)


def voices(instrument: np.ndarray | None, pitch: np.ndarray) -> np.ndarray:
    pitch = np.asarray(pitch, dtype=np.int64)
    return pitch if instrument is None else np.asarray(instrument, dtype=np.int64) * 128 + pitch


def notes_array(notes, instruments=None) -> Notes:
    """Anything with start/end/pitch/velocity (and, for an instruments codec, each note's instrument)."""
    arr = np.array([(n.start, n.end, n.pitch, n.velocity) for n in notes], dtype=np.float64).reshape(-1, 4)
    out = Notes(arr[:, 0], arr[:, 1], arr[:, 2].astype(np.int64), arr[:, 3].astype(np.int64))
    if instruments is not None:
        out.instrument = np.asarray(instruments, dtype=np.int64).reshape(-1)
        if len(out.instrument) != len(out):
            raise ConfigError(
                f"{len(out)} notes but {len(out.instrument)} instruments", code="bad_instruments"
            )
        if len(out.instrument) and not (out.instrument.min() >= 0 and out.instrument.max() <= DRUMS):
            raise ConfigError(f"instruments are 0..{DRUMS} (programs, then drums)", code="bad_instruments")
    return out


def midi_bytes(config: CodecConfig, midi) -> bytes:
    if isinstance(midi, (bytes, bytearray, memoryview)):
        return bytes(midi)
    if isinstance(midi, (str, os.PathLike)):
        with open(midi, "rb") as f:  # OSError (missing file, ...) is the caller's to report
            data = f.read(config.max_bytes + 1)  # never read a huge upload whole
        return data
    raise TypeError(f"midi must be a path, bytes or pretty_midi.PrettyMIDI, not {type(midi).__name__}")


def read(config: CodecConfig, midi) -> pretty_midi.PrettyMIDI:
    """Path, bytes or PrettyMIDI -> PrettyMIDI, pre-scanned against the caps; else InvalidMidiError."""
    if isinstance(midi, pretty_midi.PrettyMIDI):
        return midi
    data = midi_bytes(config, midi)
    scan(data, config)
    import mido

    try:
        mf = mido.MidiFile(file=io.BytesIO(data))
        # pretty_midi crashes on an empty track chunk; it carries nothing, so drop it
        mf.tracks = [t for t in mf.tracks if len(t)]
        if not mf.tracks:
            raise InvalidMidiError("the file has no events", code="no_notes")
        signatures = _later_tracks_signatures(mf)  # before pretty_midi makes the tracks' times absolute
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tempo on non-zero tracks: pretty_midi's choice is documented
            pm = pretty_midi.PrettyMIDI(mido_object=mf)
        _add_signatures(pm, signatures)
        return pm
    except InvalidMidiError:
        raise
    except Exception as exc:  # the parser stack raises OSError/ValueError/KeyError/...: one typed error
        raise InvalidMidiError(f"MIDI parser rejected the file: {exc}", code="not_midi") from None


def _later_tracks_signatures(mf) -> dict[str, dict[int, object]]:
    """The key and time signatures of tracks after the first, by type and absolute tick (the first at a
    tick kept)."""
    found: dict[str, dict[int, object]] = {"key_signature": {}, "time_signature": {}}
    for track in mf.tracks[1:]:
        tick = 0
        for msg in track:
            tick += msg.time
            if msg.type in found:
                found[msg.type].setdefault(tick, msg)
    return found


def _add_signatures(pm: pretty_midi.PrettyMIDI, found: dict[str, dict[int, object]]) -> None:
    """Add to `pm` the signatures only later tracks carry (pretty_midi reads track 0's alone, and MuseScore
    writes a key signature on every staff): an infill or an accompaniment writes the upload back, and a
    score view would lose its keys. Track 0's signature wins at a tick; the tempo map stays pretty_midi's
    (the times every note was read with)."""
    if not any(found.values()):
        return
    have = {pm.time_to_tick(k.time) for k in pm.key_signature_changes}
    for tick, msg in found["key_signature"].items():
        if tick not in have:
            number = pretty_midi.key_name_to_key_number(msg.key)
            pm.key_signature_changes.append(pretty_midi.KeySignature(number, pm.tick_to_time(tick)))
    have = {pm.time_to_tick(t.time) for t in pm.time_signature_changes}
    for tick, msg in found["time_signature"].items():
        if tick not in have:
            meter = pretty_midi.TimeSignature(msg.numerator, msg.denominator, pm.tick_to_time(tick))
            pm.time_signature_changes.append(meter)
    pm.key_signature_changes.sort(key=lambda k: k.time)
    pm.time_signature_changes.sort(key=lambda t: t.time)


def raw_instruments(config: CodecConfig, midi) -> list[RawInstrument]:
    """Each instrument's notes and sustain changes, as pretty_midi builds its instruments."""
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
    data = midi_bytes(config, midi)
    result = scan(data, config, collect=True)
    if not result.tracks:
        raise InvalidMidiError("the file has no events", code="no_notes")
    return instruments_from_scan(result)


def collect(config: CodecConfig, instruments: list[RawInstrument], tracks=None) -> Notes:
    """Select/merge tracks, drop drums (an instruments codec keeps them, and each note's instrument), apply
    the pedal policy, leave one sounding note per pitch (per instrument and pitch)."""
    tracks = config.tracks if tracks is None else tracks
    if tracks != "merge":
        bad = [i for i in tracks if i >= len(instruments)]
        if bad:
            raise InvalidMidiError(
                f"track index {bad[0]} out of range: the file has {len(instruments)} instruments",
                code="no_such_track",
            )
        instruments = [instruments[i] for i in tracks]
    if not config.instruments:
        instruments = [inst for inst in instruments if not inst.is_drum]
    parts, transitions, tags = [], [], []
    for inst in instruments:
        notes = inst.notes
        if not len(notes):
            continue
        cc = inst.sustain[np.argsort(inst.sustain[:, 0], kind="stable")]
        if config.pedal == "extend" and not inst.is_drum:
            notes = notes.copy()
            notes[:, 1] = extend_by_pedal(notes[:, 1], cc[:, 0], cc[:, 1] >= 64)
        elif len(cc) and not inst.is_drum:  # a kit's CC64 is no sustain
            down = cc[:, 1] >= 64
            change = down != np.concatenate(([False], down[:-1]))
            transitions.append(np.stack([cc[change, 0], np.where(down[change], 1.0, -1.0)], axis=1))
        parts.append(notes)
        tags.append(np.full(len(notes), instrument_of(inst.program, inst.is_drum), dtype=np.int64))
    if not parts:
        raise InvalidMidiError("no notes (after dropping drums and unselected tracks)", code="no_notes")
    notes = np.concatenate(parts)
    start, pitch, velocity = notes[:, 0], notes[:, 2].astype(np.int64), notes[:, 3].astype(np.int64)
    end = np.maximum(notes[:, 1], start)
    inst = np.concatenate(tags) if config.instruments else None
    keep = (pitch >= 0) & (pitch <= 127)
    if not keep.any():
        raise InvalidMidiError("no notes with a pitch in 0..127", code="no_notes")
    start, end, pitch, velocity = start[keep], end[keep], pitch[keep], velocity[keep]
    inst = inst[keep] if inst is not None else None
    # one sounding note per voice (pitch, or instrument and pitch): duplicates keep the longest, overlaps end
    # at the next onset
    voice = voices(inst, pitch)
    order = np.lexsort((-end, start, voice))
    start, end, pitch, velocity, voice = start[order], end[order], pitch[order], velocity[order], voice[order]
    same = voice[1:] == voice[:-1]
    dup = np.concatenate(([False], same & (start[1:] == start[:-1])))
    start, end, pitch, velocity, voice = start[~dup], end[~dup], pitch[~dup], velocity[~dup], voice[~dup]
    nxt = np.concatenate((np.where(voice[1:] == voice[:-1], start[1:], np.inf), [np.inf]))
    end = np.minimum(end, nxt)
    order = np.lexsort((voice, start))  # by (start, pitch) without instruments
    out = Notes(start[order], end[order], pitch[order], velocity[order])
    if inst is not None:
        out.instrument = voice[order] // 128
    if transitions:
        tr = np.concatenate(transitions)
        tr = tr[np.argsort(tr[:, 0], kind="stable")]
        out.pedal_time = tr[:, 0]
        out.pedal_down = np.cumsum(tr[:, 1]) > 0  # merged pedal: down while any instrument holds it
    return out


def extend_by_pedal(end: np.ndarray, cc_time: np.ndarray, cc_down: np.ndarray) -> np.ndarray:
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
