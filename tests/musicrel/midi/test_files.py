"""musicrel.midi.files: which files count as MIDI, and copy_midi (what infills and accompaniments answer)."""

from __future__ import annotations

import io

import pretty_midi
import pytest

from musicrel.midi.files import copy_midi, find_midi_files


def _song() -> pretty_midi.PrettyMIDI:
    pm = pretty_midi.PrettyMIDI(initial_tempo=96)
    pm.time_signature_changes.append(pretty_midi.TimeSignature(3, 4, 0.0))
    pm.key_signature_changes.append(pretty_midi.KeySignature(2, 0.0))
    pm.lyrics.append(pretty_midi.Lyric("la", 0.5))
    piano = pretty_midi.Instrument(program=0, name="piano")
    piano.notes = [pretty_midi.Note(80, 60 + k, 0.3 * k, 0.3 * k + 0.25) for k in range(12)]
    piano.control_changes = [pretty_midi.ControlChange(64, 127, 0.1), pretty_midi.ControlChange(64, 0, 1.9)]
    piano.pitch_bends = [pretty_midi.PitchBend(512, 0.7)]
    bass = pretty_midi.Instrument(program=33, name="bass")
    bass.notes = [pretty_midi.Note(90, 36, 0.0, 1.5)]
    pm.instruments = [piano, bass]
    return pm


def _bytes(pm) -> bytes:
    buffer = io.BytesIO()
    pm.write(buffer)
    return buffer.getvalue()


def test_copy_midi_writes_the_same_file_and_changes_alone():
    pm = _song()
    before = _bytes(pm)
    out = copy_midi(pm)
    assert _bytes(out) == before
    # every event is the copy's own: changing them leaves the original as it was
    out.instruments[0].notes[0].pitch = 20
    out.instruments[0].notes.append(pretty_midi.Note(70, 72, 4.0, 4.5))
    out.instruments[0].control_changes[0].value = 1
    out.instruments[0].pitch_bends[0].pitch = -100
    out.instruments[1].program = 40
    out.time_signature_changes[0].numerator = 5
    out.lyrics[0].text = "lo"
    out.adjust_times([0.0, 10.0], [0.0, 20.0])  # rebuilds the copy's tempo map
    assert _bytes(pm) == before
    assert pm.get_tempo_changes()[1][0] == pytest.approx(96.0)


def test_copy_midi_keeps_the_instruments_asked_for():
    pm = _song()
    out = copy_midi(pm, instruments=[1])
    assert [i.name for i in out.instruments] == ["bass"] and len(pm.instruments) == 2
    assert [(n.pitch, n.start, n.end) for n in out.instruments[0].notes] == [(36, 0.0, 1.5)]
    assert out.time_signature_changes[0].numerator == 3  # the signatures and tempo map come along


def test_find_midi_files(tmp_path):
    (tmp_path / "a").mkdir()
    for name in ("a/x.mid", "y.MIDI", "z.txt"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in find_midi_files(tmp_path)] == ["x.mid", "y.MIDI"]
    assert find_midi_files(tmp_path / "y.MIDI") == [tmp_path / "y.MIDI"]
    with pytest.raises(FileNotFoundError):
        find_midi_files(tmp_path / "missing")
