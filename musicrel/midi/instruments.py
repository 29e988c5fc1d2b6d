"""The instruments of an instruments codec (`CodecConfig(instruments=True)`): an instrument is a General MIDI
program 0..127 or DRUMS (128), whatever the file's channel for them; `InstrumentNotes` is a file's notes with
the instrument of each, as the codec reads and writes them. Decoding builds one track per instrument, named by
its General MIDI name ("Drums" for drums, on a drum track: channel 10)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pretty_midi

DRUMS = 128  # the instrument index of drums (programs are 0..127)
NUM_INSTRUMENTS = 129
DRUMS_NAME = "Drums"


# The sounding range (lowest, highest MIDI pitch) of the General MIDI programs that stand for one orchestral
# instrument or voice, as orchestration texts give them (Adler, *The Study of Orchestration*; a few semitones
# of room at the top, where players reach): a model with instruments strikes no note of such an instrument
# outside it, nor outside the notes the upload gives that instrument (`playable`). Ensembles, keyboards,
# guitars, basses, synthesizers and pitched percussion are left free: their "range" is the patch's, not a
# player's. Drums strike the keys of the General MIDI 2 percussion map (27 High Q to 87 Open Surdo; GM 1's
# 35-81 inside it): a key outside it sounds nothing or a player's own choice (the instruments model struck
# 95 and 119 on pop songs; its training drums never did, but for the Groove kit's 22 and 26, which a motif
# that plays them widens the range to).
RANGES = {
    40: (55, 103),  # violin: G3 up
    41: (48, 93),  # viola: C3
    42: (36, 88),  # cello: C2
    43: (24, 67),  # contrabass: sounding C1 (with the extension) to G4
    46: (23, 103),  # harp
    47: (38, 60),  # timpani
    52: (36, 86),  # choir aahs (one part)
    53: (36, 86),  # voice oohs
    56: (52, 86),  # trumpet
    57: (34, 77),  # trombone
    58: (24, 65),  # tuba
    59: (52, 86),  # muted trumpet
    60: (34, 79),  # French horn
    64: (56, 88),  # soprano sax
    65: (49, 81),  # alto sax
    66: (44, 76),  # tenor sax
    67: (36, 69),  # baritone sax
    68: (58, 93),  # oboe
    69: (52, 84),  # English horn
    70: (34, 77),  # bassoon
    71: (50, 94),  # clarinet
    72: (74, 108),  # piccolo
    73: (59, 98),  # flute
    DRUMS: (27, 87),  # the General MIDI 2 percussion keys
}


def playable(instruments_pitches: dict[int, np.ndarray]) -> np.ndarray:
    """(NUM_INSTRUMENTS, 128) bool: the pitches each instrument may strike: its RANGES (every pitch for one
    without), widened to the lowest and highest of `instruments_pitches` (instrument -> the pitches an
    upload gives it), so that music the upload plays is never refused its own register."""
    may = np.ones((NUM_INSTRUMENTS, 128), bool)
    pitch = np.arange(128)
    for program, (low, high) in RANGES.items():
        given = instruments_pitches.get(program)
        if given is not None and len(given):
            low, high = min(low, int(np.min(given))), max(high, int(np.max(given)))
        may[program] = (pitch >= low) & (pitch <= high)
    return may


def instrument_of(program: int, is_drum: bool) -> int:
    """The instrument index of a pretty_midi instrument: its program, or DRUMS (a drum kit's program
    chooses the kit, not an instrument: all kits are one instrument here)."""
    return DRUMS if is_drum else int(program)


def instrument_name(instrument: int) -> str:
    """The General MIDI name of a program, or "Drums"."""
    if instrument == DRUMS:
        return DRUMS_NAME
    return pretty_midi.program_to_instrument_name(int(instrument))


def played(pm: pretty_midi.PrettyMIDI, tracks="merge") -> set[int]:
    """The instruments (`instrument_of`) of `pm`'s tracks that hold notes: every track ("merge") or those of
    the indices `tracks` (indices past the file are left for the codec to refuse)."""
    chosen = (
        pm.instruments
        if tracks == "merge"
        else [pm.instruments[i] for i in tracks if 0 <= i < len(pm.instruments)]
    )
    return {instrument_of(inst.program, inst.is_drum) for inst in chosen if inst.notes}


def is_ensemble(instruments: set[int]) -> bool:
    """Music one piano stream would flatten: drums (which a piano codec drops), or more than one instrument
    (which it merges into one)."""
    return DRUMS in instruments or len(instruments) > 1


def asked_instruments(controls) -> bool | None:
    """What a request's controls (generation.controls.Controls, or None) say of a model with instruments:
    False when `program` asks one instrument for every note (what a piano model writes), True when
    `instruments` asks for others than the motif's (what only a model with instruments can), None when they
    leave it to the upload."""
    if controls is None or (controls.program is None and controls.instruments in (None, "motif")):
        return None
    return controls.program is None


def wants_instruments(pm: pretty_midi.PrettyMIDI, tracks="merge", asked: bool | None = None) -> bool:
    """Whether an upload goes to a model with instruments rather than a piano model beside it (the server's
    instruments model, `musicrel generate --instruments-checkpoint`): as the controls ask
    (`asked_instruments`), else when the tracks read hold drums or more than one instrument, which one piano
    stream would flatten."""
    return asked if asked is not None else is_ensemble(played(pm, tracks))


@dataclass
class InstrumentNotes:
    """Notes (pretty_midi.Note, sorted by (start, instrument, pitch)) and the instrument of each, parallel."""

    notes: list[pretty_midi.Note]
    instruments: list[int]

    def by_instrument(self) -> dict[int, list[pretty_midi.Note]]:
        """{instrument: its notes}, instruments in ascending order (drums last)."""
        out: dict[int, list[pretty_midi.Note]] = {}
        for i in sorted(set(self.instruments)):
            out[i] = []
        for note, i in zip(self.notes, self.instruments, strict=True):
            out[i].append(note)
        return out


def to_pretty_midi(
    parts: InstrumentNotes, pedal: list[tuple[float, bool]], resolution: int, bpm: float
) -> pretty_midi.PrettyMIDI:
    """One track per instrument (ascending, drums last), named by its General MIDI name; CC64 from `pedal`
    (pedal="events": the codec's one merged pedal) on every track but the drums'."""
    pm = pretty_midi.PrettyMIDI(resolution=resolution, initial_tempo=bpm)
    for i, notes in parts.by_instrument().items():
        drums = i == DRUMS
        inst = pretty_midi.Instrument(program=0 if drums else i, is_drum=drums, name=instrument_name(i))
        inst.notes = notes
        if not drums:
            inst.control_changes = [pretty_midi.ControlChange(64, 127 if d else 0, s) for s, d in pedal]
        pm.instruments.append(inst)
    return pm


def current_instrument(
    tokens: np.ndarray, is_instrument: np.ndarray, first: int, default: int = 0
) -> np.ndarray:
    """(N,) int64: the instrument in effect at each token (the last INSTRUMENT token at or before it;
    `default` before the first); `first` is the id of instrument 0."""
    index = np.where(is_instrument, np.arange(len(tokens)), -1)
    last = np.maximum.accumulate(index) if len(tokens) else index
    return np.where(last >= 0, tokens[np.maximum(last, 0)] - first, default).astype(np.int64)
