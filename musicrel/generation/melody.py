"""A melody and how to accompany it, as the input side sees them: `melody_track` and `melody_notes` (which
track is the tune, its notes one at a time, or why the file cannot be accompanied), `AccompanimentParams` and
`AccompanimentResult`. No torch here: the server's HTTP process checks an upload with these before it queues
the job; musicrel.generation.accompaniment decodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pretty_midi

from musicrel.errors import InvalidMidiError
from musicrel.generation.sampling import Sampling

MAX_MELODY_SECONDS = 600.0
# A melody's notes start one at a time: notes struck within CHORD_SECONDS of another count as a chord, and a
# track with more than MAX_CHORD_SHARE of its notes in chords is not a melody. POP909's MELODY tracks, in 30 s
# stretches: 99 % have at most 4.5 % of their notes in such pairs (a doubled note, a grace note); a chord
# accompaniment has most of its notes in chords. Of the few doubled notes kept, the highest is the tune.
CHORD_SECONDS = 0.03
MAX_CHORD_SHARE = 0.25
ACCOMPANIMENT_NAME = "accompaniment"  # the answer file's accompaniment track


@dataclass(kw_only=True)
class AccompanimentParams(Sampling):
    """How to accompany one melody: the shared sampling fields and their checks (Sampling). `controls`:
    key, chords, density, range, polyphony, program (of the accompaniment)."""

    # Sampling's defaults (their one source) but for top-p: the accompaniment model was measured without the
    # nucleus too (37 validation songs x 3 seeds, 2026-11-25): harmony 0.526 -> 0.502, clashes 0.016 -> 0.028
    # (real 0.025), 3.8 -> 2.9 notes/s (real 3.6): it keeps the nucleus.
    top_p: float = 0.95


@dataclass
class AccompanimentResult:
    midis: list  # pretty_midi.PrettyMIDI per sample: the melody track unchanged + the accompaniment's
    notes: list  # the accompaniment's pretty_midi.Notes per sample
    seed: int
    melody_track: int
    seconds: float  # length of the accompaniment
    decode_seconds: float
    controls: dict | None = None
    warnings: list = field(default_factory=list)


def melody_track(pm: pretty_midi.PrettyMIDI, track: int | None) -> int:
    """Which instrument holds the melody: `track`, or the only one with notes."""
    with_notes = [i for i, inst in enumerate(pm.instruments) if inst.notes and not inst.is_drum]
    if not with_notes:
        raise InvalidMidiError("the file has no notes outside drum tracks", code="no_notes")
    if track is None:
        if len(with_notes) != 1:
            names = ", ".join(f"{i}: {pm.instruments[i].name or 'unnamed'}" for i in with_notes)
            raise InvalidMidiError(
                f"the file has {len(with_notes)} tracks with notes ({names}): say which is the melody",
                code="which_track",
            )
        return with_notes[0]
    if (
        isinstance(track, bool)
        or not isinstance(track, int | np.integer)
        or not 0 <= track < len(pm.instruments)
    ):
        raise InvalidMidiError(
            f"melody track {track!r} out of range: the file has {len(pm.instruments)} instruments",
            code="no_such_track",
        )
    if pm.instruments[track].is_drum:
        raise InvalidMidiError(f"track {track} is a drum track, not a melody", code="no_notes")
    return int(track)


def melody_notes(pm: pretty_midi.PrettyMIDI, track: int, max_seconds: float = MAX_MELODY_SECONDS) -> list:
    """The melody's notes, one at a time: a note overlapping the next (legato) ends where the next starts.
    InvalidMidiError: no notes, chords (not a melody), longer than `max_seconds`."""
    notes = sorted(pm.instruments[track].notes, key=lambda n: (n.start, -n.pitch))
    notes = [n for n in notes if n.end > n.start and 0 <= n.pitch <= 127]
    if not notes:
        raise InvalidMidiError(f"track {track} has no notes", code="no_notes")
    end = max(n.end for n in notes)
    if end > max_seconds:
        raise InvalidMidiError(
            f"the melody lasts {end:.0f} s; at most {max_seconds:.0f} s can be accompanied", code="too_long"
        )
    starts = np.array([n.start for n in notes])
    gap = np.diff(starts)
    in_chord = np.zeros(len(notes), dtype=bool)
    in_chord[1:] |= gap < CHORD_SECONDS
    in_chord[:-1] |= gap < CHORD_SECONDS
    share = float(in_chord.mean())
    if share > MAX_CHORD_SHARE:
        raise InvalidMidiError(
            f"track {track} is not a melody: {share:.0%} of its notes are struck together with another "
            f"(at most {MAX_CHORD_SHARE:.0%}); give the track with the tune alone",
            code="melody_has_chords",
        )
    out = []
    for i, n in enumerate(notes):
        if in_chord[i] and i and abs(notes[i - 1].start - n.start) < CHORD_SECONDS:
            continue  # the few stray doubled notes: the first (highest) stays
        nxt = notes[i + 1].start if i + 1 < len(notes) else math.inf
        out.append(pretty_midi.Note(n.velocity, n.pitch, n.start, max(n.start + 1e-3, min(n.end, nxt))))
    return out
