"""Fixtures of the training tests: small repetitive MIDI files written by code, prepared once per session."""

from __future__ import annotations

from pathlib import Path

import pretty_midi
import pytest


def write_pattern_midi(path: Path, root: int, repeats: int = 12, program: int = 0) -> Path:
    """A repeated arpeggio (easy to learn: the loss of a tiny model drops within a few steps)."""
    pm = pretty_midi.PrettyMIDI()
    inst = pretty_midi.Instrument(program=program)
    t = 0.0
    for _ in range(repeats):
        for step in (0, 4, 7, 12, 7, 4):
            inst.notes.append(pretty_midi.Note(velocity=80, pitch=root + step, start=t, end=t + 0.2))
            t += 0.25
    pm.instruments.append(inst)
    pm.write(str(path))
    return path


@pytest.fixture(scope="session")
def pattern_midi_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("pattern_midi")
    for i, root in enumerate((48, 50, 52, 53, 55, 57, 59, 60)):
        write_pattern_midi(folder / f"pattern_{i}.mid", root)
    return folder


@pytest.fixture(scope="session")
def tiny_data(pattern_midi_dir, tmp_path_factory) -> Path:
    from training.prepare import prepare

    out = tmp_path_factory.mktemp("tiny_data")
    prepare([pattern_midi_dir], out, workers=1, progress=False)
    return out
