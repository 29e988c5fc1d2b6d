"""The upload's tracks and where a generated note goes: the one place that knows them, for every route of a
model whose codec has instruments (`CodecConfig(instruments=True)`; docs/INSTRUMENTS.md).

Tracks are counted as pretty_midi counts instruments (the index the `tracks`/`track` form fields use): a
program change inside a track makes pretty_midi two instruments, so it is two tracks here, each with its
program. Each track keeps its name, program, is_drum and its codec instrument (`instrument_of`).

Where a note goes (`Placer.place`): to the track of its instrument. Where one instrument has several tracks
(a quartet's Violin I and II, both program 40; a piano's two hands on two program-0 tracks), to the nearest
voice (`voices`, `nearest`: the one rule of every route, a piano model's infill among several chosen tracks
too): the track whose voice, the median pitch of its notes that start within VOICE_WINDOW_SECONDS of the
music being written (all its notes when none do), is nearest the note's pitch; ties go to the earlier track;
a track without a voice is chosen only when none has one (then the first). The voices are read from the
upload once and do not move with the notes placed, so the place of a note depends on its instrument and
pitch alone, never on the order notes are read in. Measured against the real parts (docs/INSTRUMENTS.md,
"Where a note goes"), this rule recovers a note's own track as often as the latest onset before it did, or
more often (POP909's three tracks 77 % against 52 %). An instrument the upload does not have gets a new
track, after the upload's, named by its General MIDI name ("Drums": is_drum), in the order the instruments
first sound.

A track that doubles another of its instrument in unison (`doublings`: nearly every note it strikes near the
music being written, the other strikes at the same time and pitch: a Mass's Flute II on Flute I) takes no
note of its own, since the codec hears the two as one part: it gets a copy of each note placed on the track
it doubles (`Placer.copies`), so it keeps playing where nearest voice left it silent.

The output (`Tracks.write`): the tracks in their order with their names, programs and is_drum (pretty_midi
writes drums on channel 10; with more than 15 pitched tracks it reuses channels 0, 1, ... but every track
keeps its program), every track written even when it has no notes, so a track's index in the answer is its
index here. Each of the upload's tracks keeps its mix: a continuation's track starts with the values its
`MIX_CONTROLLERS` have at the cut (a quiet guitar panned left stays so in the answer; band files set them:
875 of Freedoom's 960 tracks with notes set a volume, 845 a pan), and with the motif included, the track's
own controller changes and pitch bends before the cut come back at their times."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np
import pretty_midi

from musicrel.midi.instruments import DRUMS, NUM_INSTRUMENTS, instrument_name, instrument_of

_EPS = 1e-6  # seconds: times on the codec's 10 ms grid, read on two paths, compare within this
# A track's voice: the median pitch of its notes that start this near the music being written (`voices`).
VOICE_WINDOW_SECONDS = 10.0
# A track doubles another of its instrument when at least this share of its notes near the music being
# written (DOUBLING_MIN_NOTES or more) are struck by the other at the same time and pitch (`doublings`).
DOUBLING_SHARE = 0.9
DOUBLING_MIN_NOTES = 4
# The controllers that set a track's mix (volume, balance, pan, expression, the sound controllers, the
# effects' depths), which a continuation's track starts with as the upload's has them at the cut. Not bank
# select (0/32: heard only at a program change), modulation or breath (1/2: a gesture under way), data
# entry and (N)RPN (6/38/96-101: sequences, not states), the pedals or channel mode messages (120-127).
MIX_CONTROLLERS = frozenset({7, 8, 10, 11, *range(70, 80), *range(91, 96)})
# What never comes back, even with the motif: the pedals (64-69: the codec has already held the motif's
# notes by them, and a pedal down at the cut would hold the continuation's), and the messages that only mean
# something in their order (bank select before a program change, data entry after its (N)RPN, channel mode
# messages), which pretty_midi writes sorted by controller number where they share a tick (an RPN setting a
# bend range of 12 came out as data entry first, then the RPN: the range lost).
LEFT_OUT = frozenset({0, 32, 6, 38, *range(64, 70), *range(96, 102), *range(120, 128)})
# A data entry or (N)RPN: a track that sends one may set its own bend range, which cannot be written back
# (above), so its pitch bends do not come back either (they would sound at the default range: out of tune).
RANGE_SETTERS = frozenset({6, 38, 98, 99, 100, 101})


@dataclass(frozen=True)
class Track:
    """One track of the answer: the upload's (`source`: its pretty_midi instrument index) or a new one."""

    name: str
    program: int
    is_drum: bool
    instrument: int  # the codec's instrument: the program, or DRUMS
    source: int | None = None  # the upload's track index; None: a track the upload does not have
    # the upload's track up to the cut: (time, number, value) of its controller changes (not LEFT_OUT), and
    # (time, pitch) of its pitch bends where it keeps the default bend range
    controls: tuple[tuple[float, int, int], ...] = ()
    bends: tuple[tuple[float, int], ...] = ()

    def mix(self) -> list[pretty_midi.ControlChange]:
        """The track's `MIX_CONTROLLERS` as they stand at the cut, at time 0: a continuation's start."""
        last = {number: value for _, number, value in self.controls if number in MIX_CONTROLLERS}
        return [pretty_midi.ControlChange(number, value, 0.0) for number, value in sorted(last.items())]

    def motif_controls(self, cut: float) -> tuple[list, list]:
        """(control changes, pitch bends) of the track up to the cut at their times, for a file that includes
        the motif; a bend still held at the cut is released there, so the continuation plays in tune. Of two
        values at one time the later (pretty_midi would write them in the order of their values)."""
        last = {(t, number): value for t, number, value in self.controls}
        changes = [pretty_midi.ControlChange(number, value, t) for (t, number), value in last.items()]
        bends = [pretty_midi.PitchBend(pitch, t) for t, pitch in dict(self.bends).items()]
        if bends and bends[-1].pitch != 0:
            bends.append(pretty_midi.PitchBend(0, cut))
        return changes, bends

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


def voices(
    pm: pretty_midi.PrettyMIDI, indices: Sequence[int], start: float, end: float | None = None
) -> dict[int, float]:
    """Each track's voice (`indices`: pretty_midi instrument indices of `pm`), the median pitch of its notes
    that start within VOICE_WINDOW_SECONDS of [start, end) (of all of them when none do); a track without
    notes has none. An infill (`end`: the gap's) reads the music on both sides of the gap and the gap's own
    notes, the part being rewritten; a continuation (`end` None) only what starts before the cut `start`."""
    out = {}
    for t in indices:
        notes = _heard(pm, t, start, end)
        pitches = [n.pitch for n in _near(notes, start, end)] or [n.pitch for n in notes]
        if pitches:
            out[t] = float(np.median(pitches))
    return out


def _heard(pm: pretty_midi.PrettyMIDI, t: int, start: float, end: float | None) -> list:
    """Track `t`'s notes a continuation hears (those before the cut `start`) or an infill's (all)."""
    notes = pm.instruments[t].notes
    return [n for n in notes if n.start < start - _EPS] if end is None else notes


def _near(notes: list, start: float, end: float | None) -> list:
    """The notes that start within VOICE_WINDOW_SECONDS of [start, end) (`voices`' window)."""
    stop = start if end is None else end + VOICE_WINDOW_SECONDS
    return [n for n in notes if start - VOICE_WINDOW_SECONDS <= n.start < stop]


def doublings(
    pm: pretty_midi.PrettyMIDI, indices: Sequence[int], start: float, end: float | None = None
) -> dict[int, int]:
    """{track: the track it doubles} among `indices` (pretty_midi instrument indices of `pm`), read in
    `voices`' window: a track doubles another of its instrument (program, or drums) when DOUBLING_SHARE of
    its notes there (DOUBLING_MIN_NOTES at least) are struck by the other at the same time and pitch. Of two
    tracks in unison the later doubles the earlier; a track that others double doubles none."""
    instrument = {t: instrument_of(pm.instruments[t].program, pm.instruments[t].is_drum) for t in indices}
    struck = {}
    for t in indices:
        near = _near(_heard(pm, t, start, end), start, end)
        if len(near) >= DOUBLING_MIN_NOTES:
            struck[t] = {(n.pitch, round(n.start, 4)) for n in near}
    out: dict[int, int] = {}
    for k in sorted(struck):
        if k in out.values():  # doubled by an earlier track: a part of its own
            continue
        for j in sorted(struck):
            if j == k or j in out or instrument[j] != instrument[k]:
                continue
            shared = len(struck[k] & struck[j])
            follows = shared >= DOUBLING_SHARE * len(struck[k])
            led = shared >= DOUBLING_SHARE * len(struck[j])  # j follows k as closely
            if follows and not (led and j > k):  # in unison both ways, the later follows the earlier
                out[k] = j
                break
    return out


def nearest(heard: dict, candidates: Sequence, pitch: int):
    """The candidate whose voice (`heard`, as `voices` gives them) is nearest `pitch`, the earlier of
    `candidates` on a tie; the first when none has a voice."""
    best, best_distance = candidates[0], None
    for c in candidates:
        if c in heard and (best_distance is None or abs(pitch - heard[c]) < best_distance):
            best, best_distance = c, abs(pitch - heard[c])
    return best


@dataclass
class Tracks:
    """The tracks of an upload (those selected), each one's voice (`voices`, keyed by its place here: where
    nearest voice reads) and the notes' places (`placer`)."""

    tracks: list[Track]
    voices: dict[int, float] = field(default_factory=dict)
    doubles: dict[int, int] = field(default_factory=dict)  # {place: the place it doubles} (`doublings`)

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

    def placer(self, only: Collection[int] | None = None) -> Placer:
        """A fresh placement of one sample's notes. `only`: the tracks a note may go to (an infill's chosen
        tracks); a note of an instrument none of them plays is then not placed (None) and no track is
        added."""
        return Placer(self, only)

    def write(
        self,
        tracks: Sequence[Track],
        notes: Sequence[Sequence[pretty_midi.Note]],
        tempo: float,
        resolution: int = 960,
        control_changes: Sequence[pretty_midi.ControlChange] = (),
        motif_until: float | None = None,
    ) -> pretty_midi.PrettyMIDI:
        """`tracks` (the upload's, then a placer's new ones) with their notes (parallel), sorted by (start,
        pitch); `control_changes` (the pedal) on every track but the drums'. Each of the upload's tracks with
        its mix at the cut (`Track.mix`), or, for a file that includes the motif up to `motif_until` (the
        cut, in the file's seconds), with its own controller changes and bends up to there
        (`Track.motif_controls`)."""
        pm = pretty_midi.PrettyMIDI(resolution=resolution, initial_tempo=tempo)
        for track, track_notes in zip(tracks, notes, strict=True):
            inst = pretty_midi.Instrument(program=track.program, is_drum=track.is_drum, name=track.name)
            inst.notes = sorted(track_notes, key=lambda n: (n.start, n.pitch))
            if motif_until is None:
                inst.control_changes = track.mix()
            else:
                inst.control_changes, inst.pitch_bends = track.motif_controls(motif_until)
            if not track.is_drum:
                inst.control_changes += [
                    pretty_midi.ControlChange(c.number, c.value, c.time) for c in control_changes
                ]
            pm.instruments.append(inst)
        return pm


class Placer:
    """One sample's notes placed on tracks (`place`); new instruments get new tracks."""

    def __init__(self, tracks: Tracks, only: Collection[int] | None = None) -> None:
        self.tracks = list(tracks.tracks)
        self._voices = tracks.voices
        self._of: dict[int, list[int]] = {}
        self._copies: dict[int, list[int]] = {}
        for i, t in enumerate(self.tracks):
            if only is not None and i not in only:
                continue
            doubled = tracks.doubles.get(i)
            if doubled is not None and (only is None or doubled in only):
                self._copies.setdefault(doubled, []).append(i)  # a double takes copies, no note of its own
            else:
                self._of.setdefault(t.instrument, []).append(i)
        self._adds = only is None  # an infill's placer adds no track: its file keeps the upload's

    def place(self, instrument: int, pitch: int) -> int | None:
        """The track of a note; None: a note no track may take (a placer with `only`), which the answer
        leaves out."""
        candidates = self._of.get(int(instrument))
        if candidates is None and not self._adds:
            return None
        if candidates is None:
            self.tracks.append(new_track(int(instrument)))
            candidates = self._of[int(instrument)] = [len(self.tracks) - 1]
        return candidates[0] if len(candidates) == 1 else nearest(self._voices, candidates, pitch)

    def copies(self, track: int) -> list[int]:
        """The tracks that double `track` (`doublings`): each takes a copy of every note placed on it."""
        return self._copies.get(track, [])


def read_tracks(
    pm: pretty_midi.PrettyMIDI,
    selection,
    notes: Sequence[pretty_midi.Note],
    instruments: Sequence[int],
    cut: float,
    end: float | None = None,
) -> tuple[Tracks, list[tuple[int, ...]]]:
    """The `selection` ("merge": every track, drums included; else pretty_midi instrument indices) of the
    upload's tracks, each one's voice (`voices` of the music before `cut`, or around the gap [cut, `end`)
    of an infill) and its controller changes and bends up to `cut` (`Track.controls`), and the track of each
    of `notes` (the codec's reading of the upload: `instruments`
    parallel) by its own tracks: the tracks of its instrument that strike its pitch at its start (both of a
    unison double, which the codec reads as one note), else nearest voice's one."""
    indices = range(len(pm.instruments)) if selection == "merge" else sorted(set(selection))
    tracks, strikes = [], []
    for i in indices:
        inst = pm.instruments[i]
        before = [c for c in sorted(inst.control_changes, key=lambda c: c.time) if c.time <= cut + _EPS]
        controls = tuple((c.time, c.number, c.value) for c in before if c.number not in LEFT_OUT)
        bends = ()
        if not any(c.number in RANGE_SETTERS for c in before):
            bends = tuple(
                (b.time, b.pitch)
                for b in sorted(inst.pitch_bends, key=lambda b: b.time)
                if b.time <= cut + _EPS
            )
        instrument = instrument_of(inst.program, inst.is_drum)
        tracks.append(Track(inst.name, int(inst.program), bool(inst.is_drum), instrument, i, controls, bends))
        strikes.append({(n.pitch, round(n.start, 4)) for n in inst.notes})
    heard, doubled = voices(pm, indices, cut, end), doublings(pm, indices, cut, end)
    place = {i: k for k, i in enumerate(indices)}
    out = Tracks(
        tracks,
        {k: heard[i] for k, i in enumerate(indices) if i in heard},
        {place[i]: place[j] for i, j in doubled.items()},
    )
    of: dict[int, list[int]] = {}
    for k, t in enumerate(tracks):
        of.setdefault(t.instrument, []).append(k)
    # The motif's own notes: the one track that struck each (a note's start and pitch are the upload's);
    # nearest voice only for what no track of its instrument struck as such.
    placer = out.placer()
    places: list[tuple[int, ...]] = []
    for note, instrument in zip(notes, instruments, strict=True):
        own = [k for k in of.get(int(instrument), []) if (note.pitch, round(note.start, 4)) in strikes[k]]
        places.append(tuple(own) if own else (placer.place(int(instrument), note.pitch),))
    return out, places
