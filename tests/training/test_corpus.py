from __future__ import annotations

import json
import sys

import pretty_midi
import pytest

from musicrel.errors import MusicrelError

pytest.importorskip("music21", reason="music21 is the optional `corpus` extra")


def test_export_a_few_works_then_resume(tmp_path, capsys):
    from musicrel.cli import main

    out = tmp_path / "m21"
    assert main(["corpus", "music21", "--out", str(out), "--limit", "2", "--workers", "1", "--quiet"]) == 0
    assert "2 exported" in capsys.readouterr().out
    report = json.loads((out / "corpus_report.json").read_text())
    assert report["works"] == 2 and report["exported"] + report["failed"] == 2
    files = sorted(out.rglob("*.mid"))
    assert len(files) == 2
    for f in files:
        pm = pretty_midi.PrettyMIDI(str(f))
        assert sum(len(i.notes) for i in pm.instruments) > 0
    stamps = [f.stat().st_mtime_ns for f in files]
    assert main(["corpus", "music21", "--out", str(out), "--limit", "2", "--workers", "1", "--quiet"]) == 0
    assert json.loads((out / "corpus_report.json").read_text())["existing"] == 2
    assert [f.stat().st_mtime_ns for f in files] == stamps


def test_multi_tune_abc_files_become_one_work_per_tune():
    from training.corpus import list_works

    works = list_works()
    tunes = [w for w in works if w.path.endswith("essenFolksong/erk30.abc")]
    assert len(tunes) > 100 and len({w.number for w in tunes}) == len(tunes)
    assert len({w.out for w in works}) == len(works)


def test_without_music21_one_line_error(monkeypatch):
    from training import corpus

    monkeypatch.setitem(sys.modules, "music21", None)
    with pytest.raises(MusicrelError) as err:
        corpus.export_music21("unused", limit=1)
    assert err.value.code == "missing_dependency" and "musicrel[corpus]" in str(err.value)


def test_tunes_whose_time_signature_music21_cannot_write_are_exported(tmp_path):
    # han2.abc X:669 (and ~5 % of the ABC tunes) made music21's MIDI writer raise "TimeSignature ... is
    # already found in this Stream"; the tune's notes must come out all the same, as parsed from its text.
    from music21 import converter

    from training.corpus import _export_one, abc_tune, list_works

    (work,) = [w for w in list_works() if w.path.endswith("essenFolksong/han2.abc") and w.number == 669]
    text = abc_tune(work.path, 669)
    assert text.count("X:") == 1 and "X:669" in text and "Songlang dangbin" in text
    assert _export_one((work, str(tmp_path))) == ("exported", None)
    pm = pretty_midi.PrettyMIDI(str(tmp_path / work.out))
    parsed = converter.parse(text, format="abc")
    assert len(pm.instruments[0].notes) == len(parsed.flatten().notes) == 58
