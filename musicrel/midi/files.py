"""MIDI files: finding them on disk (the one place that says which names count as MIDI), and copying a
parsed one."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the commands import this module at start-up, before anything reads MIDI
    import pretty_midi

MIDI_SUFFIXES = (".mid", ".midi")


def find_midi_files(path: Path) -> list[Path]:
    """The file itself, or every .mid/.midi under the folder (recursive, sorted). FileNotFoundError when the
    path does not exist."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(2, "No such file or directory", str(path))
    return sorted(p for p in path.rglob("*") if p.suffix.lower() in MIDI_SUFFIXES and p.is_file())


def copy_midi(pm: pretty_midi.PrettyMIDI, instruments: list[int] | None = None) -> pretty_midi.PrettyMIDI:
    """A copy of `pm` that changes without touching it: every event a new object, the tempo map's arrays
    copied; only the instruments at `instruments` (indices, in that order) when given. Field by field, since
    copy.deepcopy of a 10,000-note performance took 0.2-0.4 s of an infill's second (this: ~6 ms)."""
    import pretty_midi

    out = copy.copy(pm)
    tick_to_time = "_PrettyMIDI__tick_to_time"
    setattr(out, tick_to_time, copy.copy(getattr(pm, tick_to_time)))
    out._tick_scales = list(pm._tick_scales)
    for name in ("key_signature_changes", "time_signature_changes", "lyrics", "text_events"):
        setattr(out, name, [copy.copy(event) for event in getattr(pm, name)])
    chosen = range(len(pm.instruments)) if instruments is None else instruments
    out.instruments = []
    for i in chosen:
        inst = copy.copy(pm.instruments[i])
        inst.notes = [pretty_midi.Note(n.velocity, n.pitch, n.start, n.end) for n in inst.notes]
        inst.pitch_bends = [pretty_midi.PitchBend(b.pitch, b.time) for b in inst.pitch_bends]
        inst.control_changes = [
            pretty_midi.ControlChange(c.number, c.value, c.time) for c in inst.control_changes
        ]
        out.instruments.append(inst)
    return out
