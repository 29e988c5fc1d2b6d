"""The accompaniment report's figures on songs built by hand, and one real POP909 song."""

from __future__ import annotations

import numpy as np
import pretty_midi
import pytest

from musicrel.evaluation.accompaniments import (
    Song,
    chord_symbol,
    clashes,
    describe,
    format_report,
    harmony,
    load_song,
    rule_accompaniment,
    told_chords,
)
from tests.conftest import SHARED_MIDI

C_MAJOR, G_MAJOR = frozenset({0, 4, 7}), frozenset({7, 11, 2})


def note(pitch, start, end):
    return pretty_midi.Note(80, pitch, start, end)


def two_bars() -> Song:
    """4/4 at 60 bpm: a C bar then a G bar; the melody holds E then D."""
    return Song(
        name="x",
        melody=[note(76, 0.0, 4.0), note(74, 4.0, 8.0)],
        real=[note(48, 0.0, 4.0), note(43, 4.0, 8.0)],
        beats=np.arange(8.0),
        downbeats=np.array([0.0, 4.0]),
        chords=[(0.0, 4.0, C_MAJOR), (4.0, 8.0, G_MAJOR)],
        seconds=8.0,
    )


def test_harmony_counts_notes_sounding_at_downbeats_in_the_chord():
    s = two_bars()
    assert harmony([note(48, 0.0, 4.0), note(55, 4.0, 8.0)], s) == (2, 2)
    # F at the first downbeat is outside C major; a note struck a hair late still counts; one that ends
    # before the downbeat does not
    assert harmony([note(53, 0.02, 1.0), note(60, 3.0, 3.5)], s) == (0, 1)
    unlabelled = Song(**{**s.__dict__, "chords": [(0.0, 8.0, None)]})
    assert harmony([note(48, 0.0, 8.0)], unlabelled) == (0, 0)


def test_clashes_are_semitones_from_the_melody_note_on_beats():
    s = two_bars()
    # F (a semitone over the melody's E) held through the first bar: 4 beats of clash; C is fine
    assert clashes([note(65, 0.0, 4.0)], s) == (4, 4)
    assert clashes([note(60, 0.0, 4.0)], s) == (0, 4)
    assert clashes([note(63, 4.0, 5.0)], s) == (1, 1)  # Eb against D


def test_the_rule_strikes_the_bars_melody_pitch_classes_on_every_beat():
    s = two_bars()
    notes = rule_accompaniment(s)
    assert sorted({n.start for n in notes}) == list(np.arange(8.0))
    assert {n.pitch % 12 for n in notes if n.start < 4} == {4} and {
        n.pitch % 12 for n in notes if n.start >= 4
    } == {2}
    row = describe(notes, s)
    assert row["harmony"] == 1.0 and row["clashes"] == 0.0 and row["notes/s"] == 1.0


def test_annotated_chords_become_the_chords_controls_text():
    from musicrel.generation.controls import parse_chord, parse_chords

    assert [chord_symbol(x) for x in ("G:min", "Eb:maj", "A:min7/b3", "D:7", "F#:hdim7", "C:sus4(9)")] == [
        "Gm", "Eb", "Am7", "D7", "F#m7b5", "Csus4"
    ]  # fmt: skip
    assert parse_chord(chord_symbol("Bb:maj9")) == parse_chord("Bb")  # no such quality: the root's triad
    s = two_bars()
    # the excerpt starts inside an "N" stretch and its last chord runs past its end
    s = Song(**{**s.__dict__, "chords": [(-1.0, 1.0, None), (1.0, 4.0, C_MAJOR), (4.0, 9.0, G_MAJOR)],
                "chord_labels": ("N", "C:maj", "G:maj")})  # fmt: skip
    text = told_chords(s)
    assert text == "C:1.000 C:3.000 G:4.000"
    assert sum(c.duration for c in parse_chords(text)) == 8.0  # the excerpt's 8 s, from its start
    assert told_chords(Song(**{**s.__dict__, "chord_labels": ("N", "N", "N")})) is None


def test_report_table_has_a_row_per_metric():
    from musicrel.evaluation.accompaniments import METRICS

    cell = {"mean": 0.5, "low": 0.4, "high": 0.6, "n": 3}
    report = {"songs": 3, "split": "test", "seconds": 8.0, "seeds": 1, "systems": ["real"],
              "metrics": {"real": {m: cell for m in METRICS}}, "timing_seconds": {"real": 0.0}}  # fmt: skip
    text = format_report(report)
    assert all(m in text for m in METRICS) and "0.500 [0.400,0.600]" in text


def test_a_real_pop909_song_loads_with_its_annotations():
    folder = SHARED_MIDI / "corpora" / "pop909" / "001"
    if not folder.is_dir():
        pytest.skip(f"POP909 not available at {folder} (set MUSICREL_SHARED)")
    s = load_song(folder, 20.0)
    assert s.melody and s.real and len(s.downbeats) >= 3 and s.downbeats[0] == 0.0
    assert all(0 <= n.start < 20.0 for n in s.melody + s.real)
    hit, total = harmony(s.real, s)
    assert total > 10 and hit / total > 0.5  # the song's own piano part mostly plays the annotated chords
    assert len(s.chord_labels) == len(s.chords) and told_chords(s)  # its chords, as a control can take them


def test_the_command_scores_the_baselines_and_writes_its_report(tmp_path, capsys):
    """`musicrel evaluate-accompaniments` through the shared evaluation flow (musicrel.cli.tasks): its
    options from the flags (--data, --systems), the table printed, report.json and report.txt written. The
    baselines that need no model: the song's own piano part and the rule."""
    import json

    from musicrel.cli import main

    songs = [SHARED_MIDI / "corpora" / "pop909" / name for name in ("001", "002")]
    if not all(s.is_dir() for s in songs):
        pytest.skip(f"POP909 not available at {songs[0].parent} (set MUSICREL_SHARED)")
    files = [{"path": str(s / f"{s.name}.mid"), "source": "pop909"} for s in songs]
    (tmp_path / "manifest.json").write_text(
        json.dumps({"codec": {"melody": True}, "splits": {"test": {"files": files}}})
    )
    out = tmp_path / "out"
    argv = ["evaluate-accompaniments", "--checkpoint", str(tmp_path / "unused"), "--data", str(tmp_path),
            "--systems", "real,rule", "--seconds", "8", "--seeds", "1",
            "--out", str(out), "--quiet"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "2 held-out POP909 songs (test), 8 s each, 1 seeds" in printed
    assert f"wrote {out / 'report.json'}, {out / 'report.txt'}" in printed
    report = json.loads((out / "report.json").read_text())
    assert list(report["metrics"]) == ["real", "rule"] and report["songs"] == 2
    assert report["metrics"]["real"]["harmony"]["mean"] > 0.5  # the songs' own piano plays their chords
    assert (out / "report.txt").read_text().startswith("2 held-out POP909 songs")
    assert main([*argv[:-3], "--systems", "real,nonsense", "--quiet"]) == 2
    assert "error [bad_systems]" in capsys.readouterr().err
