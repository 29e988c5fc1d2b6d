"""The upload's tracks and where a generated note goes: the one place that knows them, for every route of a
model whose codec has instruments (`CodecConfig(instruments=True)`; docs/INSTRUMENTS.md).

Tracks are counted as pretty_midi counts instruments (the index the `tracks`/`track` form fields use): a
program change inside a track makes pretty_midi two instruments, so it is two tracks here, each with its
program. Each track keeps its name, program, is_drum and its codec instrument (`instrument_of`).

Where a note goes (`Placer.place`): to the track of its instrument. Where one instrument has several tracks
(a quartet's Violin I and II, both program 40; a piano's two hands on two program-0 tracks), to the nearest
voice: the track whose latest onset strictly before the note's time (the distinct pitches struck then, their
mean) is closest to the note's pitch; ties go to the earlier track; a track that has struck nothing yet is
chosen only when none of them has (then the first). Only onsets strictly before the note count, so notes
struck together never steer each other and the answer does not depend on the order they are read in at
one time step (a double stop near Violin I's last notes goes to Violin I). An instrument the upload does not
have gets a new track, after the upload's, named by its General MIDI name ("Drums": is_drum), in the order
the instruments first sound.

The output (`Tracks.write`): the tracks in their order with their names, programs and is_drum (pretty_midi
writes drums on channel 10; with more than 15 pitched tracks it reuses channels 0, 1, ... but every track
keeps its program), every track written even when it has no notes, so a track's index in the answer is its
index here."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np
import pretty_midi

from musicrel.midi.instruments import DRUMS, NUM_INSTRUMENTS, instrument_name, instrument_of

_EPS = 1e-6  # seconds: times on the codec's 10 ms grid, read on two paths, compare within this


@dataclass(frozen=True)
class Track:
    """One track of the answer: the upload's (`source`: its pretty_midi instrument index) or a new one."""

    name: str
    program: int
    is_drum: bool
    instrument: int  # the codec's instrument: the program, or DRUMS
    source: int | None = None  # the upload's track index; None: a track the upload does not have

    def describe(self, index: int) -> dict:
        """The track as the answers list it (`index`: its place in the answer's file)."""
        return {
            "index": index,
            "name": self.name,
            "program": self.program,
            "drum": self.is_drum,
            "source": self.source,
        }


def new_track(instrument: int) -> Track:
    """The track of an instrument the upload does not have: named by its General MIDI name."""
    drums = instrument == DRUMS
    return Track(instrument_name(instrument), 0 if drums else int(instrument), drums, int(instrument))


@dataclass(frozen=True)
class Onset:
    time: float  # seconds, in the clock of the Tracks (the upload's)
    pitches: frozenset[int]

    @property
    def pitch(self) -> float:
        return sum(self.pitches) / len(self.pitches)


@dataclass
class Tracks:
    """The tracks of an upload (those selected), each one's latest onset before the cut (where nearest voice
    starts from), and the notes' places (`placer`)."""

    tracks: list[Track]
    last_onsets: list[Onset | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.last_onsets:
            self.last_onsets = [None] * len(self.tracks)

    def __len__(self) -> int:
        return len(self.tracks)

    def instruments(self) -> np.ndarray:
        """(NUM_INSTRUMENTS,) bool: the instruments of these tracks, the ones a continuation plays by default
        (the `instruments` control's "motif": a Lied's voice comes in after a piano introduction)."""
        plays = np.zeros(NUM_INSTRUMENTS, dtype=bool)
        plays[[t.instrument for t in self.tracks]] = True
        return plays

    def describe(self) -> list[dict]:
        return [t.describe(i) for i, t in enumerate(self.tracks)]

    def describe_file(self, pm: pretty_midi.PrettyMIDI) -> list[dict]:
        """The tracks of a file `write` wrote from these (the upload's first, then a sample's new ones), as
        the answers list them."""
        return [
            Track(
                inst.name,
                int(inst.program),
                bool(inst.is_drum),
                instrument_of(inst.program, inst.is_drum),
                self.tracks[k].source if k < len(self.tracks) else None,
            ).describe(k)
            for k, inst in enumerate(pm.instruments)
        ]

    def placer(self, offset: float = 0.0, only: Collection[int] | None = None) -> Placer:
        """A fresh placement of one sample's notes (`offset`: added to the times `place` is given, to read
        them in the upload's clock). `only`: the tracks a note may go to (an infill's chosen tracks); a note
        of an instrument none of them plays is then not placed (None) and no track is added."""
        return Placer(self, offset, only)

    def write(
        self,
        tracks: Sequence[Track],
        notes: Sequence[Sequence[pretty_midi.Note]],
        tempo: float,
        resolution: int = 960,
        control_changes: Sequence[pretty_midi.ControlChange] = (),
    ) -> pretty_midi.PrettyMIDI:
        """`tracks` (the upload's, then a placer's new ones) with their notes (parallel), sorted by (start,
        pitch); `control_changes` (the pedal) on every track but the drums'."""
        pm = pretty_midi.PrettyMIDI(resolution=resolution, initial_tempo=tempo)
        for track, track_notes in zip(tracks, notes, strict=True):
            inst = pretty_midi.Instrument(program=track.program, is_drum=track.is_drum, name=track.name)
            inst.notes = sorted(track_notes, key=lambda n: (n.start, n.pitch))
            if not track.is_drum:
                inst.control_changes = [
                    pretty_midi.ControlChange(c.number, c.value, c.time) for c in control_changes
                ]
            pm.instruments.append(inst)
        return pm


class Placer:
    """One sample's notes placed on tracks, in time order (`place`); new instruments get new tracks."""

    def __init__(self, tracks: Tracks, offset: float = 0.0, only: Collection[int] | None = None) -> None:
        self.tracks = list(tracks.tracks)
        self.offset = offset
        self._last: list[Onset | None] = list(tracks.last_onsets)  # latest onset of each track
        self._before: list[Onset | None] = [None] * len(self.tracks)  # the one before it, once struck here
        self._of: dict[int, list[int]] = {}
        for i, t in enumerate(self.tracks):
            if only is None or i in only:
                self._of.setdefault(t.instrument, []).append(i)
        self._adds = only is None  # an infill's placer adds no track: its file keeps the upload's

    def place(self, instrument: int, pitch: int, time: float) -> int | None:
        """The track of a note struck at `time` (plus the offset); times never go back. None: a note no
        track may take (a placer with `only`), which the answer leaves out."""
        time = time + self.offset
        candidates = self._of.get(int(instrument))
        if candidates is None and not self._adds:
            return None
        if candidates is None:
            self.tracks.append(new_track(int(instrument)))
            self._last.append(None)
            self._before.append(None)
            candidates = self._of[int(instrument)] = [len(self.tracks) - 1]
        index = candidates[0] if len(candidates) == 1 else self._nearest(candidates, pitch, time)
        self._strike(index, pitch, time)
        return index

    def _reference(self, index: int, time: float) -> Onset | None:
        last = self._last[index]
        if last is not None and last.time >= time - _EPS:  # struck at this very time: not before it
            return self._before[index]
        return last

    def _nearest(self, candidates: list[int], pitch: int, time: float) -> int:
        best, best_distance = candidates[0], None
        for i in candidates:
            onset = self._reference(i, time)
            if onset is None:
                continue
            distance = abs(onset.pitch - pitch)
            if best_distance is None or distance < best_distance:
                best, best_distance = i, distance
        return best

    def _strike(self, index: int, pitch: int, time: float) -> None:
        last = self._last[index]
        if last is not None and abs(last.time - time) <= _EPS:
            self._last[index] = Onset(last.time, last.pitches | {int(pitch)})
        else:
            self._before[index] = last
            self._last[index] = Onset(time, frozenset({int(pitch)}))


def read_tracks(
    pm: pretty_midi.PrettyMIDI,
    selection,
    notes: Sequence[pretty_midi.Note],
    instruments: Sequence[int],
    cut: float,
) -> tuple[Tracks, list[int]]:
    """The `selection` ("merge": every track, drums included; else pretty_midi instrument indices) of the
    upload's tracks, each one's latest onset before `cut`, and the track of each of `notes` (the codec's
    reading of the upload: `instruments` parallel) by its own track: the track of its instrument that
    strikes its pitch at its start, else nearest voice."""
    indices = range(len(pm.instruments)) if selection == "merge" else sorted(set(selection))
    tracks, onsets, strikes = [], [], []
    for i in indices:
        inst = pm.instruments[i]
        tracks.append(
            Track(
                inst.name, int(inst.program), bool(inst.is_drum), instrument_of(inst.program, inst.is_drum), i
            )
        )
        before = [n for n in inst.notes if n.start < cut - _EPS]
        latest = max((n.start for n in before), default=None)
        onsets.append(
            None
            if latest is None
            else Onset(latest, frozenset(n.pitch for n in before if abs(n.start - latest) <= _EPS))
        )
        strikes.append({(n.pitch, round(n.start, 4)) for n in inst.notes})
    out = Tracks(tracks, onsets)
    of: dict[int, list[int]] = {}
    for k, t in enumerate(tracks):
        of.setdefault(t.instrument, []).append(k)
    # The motif's own notes: the one track that struck each (a note's start and pitch are the upload's);
    # nearest voice (from the motif's start) only for what no track of its instrument struck as such.
    placer = Placer(Tracks(tracks))
    places = [0] * len(notes)
    for j in sorted(range(len(notes)), key=lambda j: notes[j].start):
        note, instrument = notes[j], int(instruments[j])
        own = [k for k in of.get(instrument, []) if (note.pitch, round(note.start, 4)) in strikes[k]]
        if own:
            places[j] = own[0]
            placer._strike(own[0], note.pitch, note.start)
        else:
            places[j] = placer.place(instrument, note.pitch, note.start)
    return out, places
