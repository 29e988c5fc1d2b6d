"""`musicrel infill` on a file and a folder: outputs, summary, one line per error, exit codes."""

from __future__ import annotations

import json

import pretty_midi
import pytest
import torch

from musicrel.cli import main
from musicrel.midi.codec import CodecConfig, EventCodec
from musicrel.model.checkpoint import save_model
from musicrel.model.config import ModelConfig
from musicrel.model.transformer import MusicTransformer


def _model(folder, codec):
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=codec.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=128
    )
    save_model(MusicTransformer(cfg), folder, codec=codec)
    return folder


@pytest.fixture
def setup(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model, shared machine
    _model(tmp_path / "ckpt", EventCodec(CodecConfig(infill=True)))
    _model(tmp_path / "plain", EventCodec())
    songs = tmp_path / "songs"
    (songs / "sub").mkdir(parents=True)
    pm = pretty_midi.PrettyMIDI(initial_tempo=110)
    inst = pretty_midi.Instrument(program=11)
    inst.notes = [pretty_midi.Note(90, 60 + k % 8, 0.3 * k, 0.3 * k + 0.4) for k in range(40)]
    pm.instruments.append(inst)
    pm.write(str(songs / "sub" / "good.mid"))
    short = pretty_midi.PrettyMIDI()
    short.instruments.append(pretty_midi.Instrument(program=0))
    short.instruments[0].notes = [pretty_midi.Note(90, 60, 0.0, 1.0), pretty_midi.Note(90, 62, 4.0, 5.0)]
    short.write(str(songs / "short.mid"))  # nothing after the span
    (songs / "broken.mid").write_bytes(
        b"MThd\x00\x00\x00\x06\x00\x01\x00\x01\x01\xe0MTrk\x00\x00\x00\x10\x00\x90"
    )
    yield tmp_path, songs
    torch.set_num_threads(threads)


def run(tmp_path, source, out, *extra, checkpoint="ckpt") -> int:
    argv = ["infill", str(source), "--checkpoint", str(tmp_path / checkpoint), "--start", "3", "--end", "6",
            "--out", str(out), "--num-samples", "2", "--seed", "3", "--quiet", *extra]  # fmt: skip
    return main(argv)


def test_infill_a_folder_writes_each_sample_and_reports_each_error_on_one_line(setup, capsys):
    tmp_path, songs = setup
    out = tmp_path / "out"
    assert run(tmp_path, songs, out) == 0
    source = pretty_midi.PrettyMIDI(str(songs / "sub" / "good.mid"))
    kept = {(n.pitch, round(n.start, 3)) for n in source.instruments[0].notes if not 3 <= n.start < 6}
    for i in range(2):
        pm = pretty_midi.PrettyMIDI(str(out / "sub" / f"good.sample{i}.mid"))
        (inst,) = pm.instruments
        assert inst.program == 11
        got = {(n.pitch, round(n.start, 3)) for n in inst.notes}
        assert kept <= got
        assert all(3 <= s < 6 for _, s in got - kept)
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "short.mid" in line] == [
        line for line in err if "nothing_after" in line
    ] and len(err) == 2
    assert any("broken.mid" in line and "error [" in line for line in err)
    summary = json.loads((out / "summary.json").read_text())
    codes = {r["input"].rsplit("/", 1)[-1]: r.get("error", {}).get("code") for r in summary["files"]}
    assert codes["good.mid"] is None and codes["short.mid"] == "nothing_after" and codes["broken.mid"]
    # a rerun skips what exists
    assert run(tmp_path, songs / "sub" / "good.mid", out / "sub") == 0
    assert json.loads((out / "sub" / "summary.json").read_text())["files"][0]["skipped"] == "outputs exist"


def test_a_bad_span_and_a_model_without_infill_tokens_exit_2_with_one_line(setup, capsys):
    tmp_path, songs = setup
    good = songs / "sub" / "good.mid"
    assert run(tmp_path, good, tmp_path / "o1", "--end", "2") == 2
    assert (
        capsys.readouterr().err.strip().splitlines()[-1].startswith("musicrel infill: error [invalid_span]")
    )
    assert run(tmp_path, good, tmp_path / "o2", "--end", "60") == 2
    assert "error [span_too_long]" in capsys.readouterr().err
    assert run(tmp_path, good, tmp_path / "o3", checkpoint="plain") == 2
    assert "error [model_cannot_infill]" in capsys.readouterr().err
    assert run(tmp_path, songs / "short.mid", tmp_path / "o4") == 1  # every file failed


def test_bars_are_read_at_each_files_tempo(setup, capsys):
    """--bars 2-3: the span each file's own bars take (good.mid is 4/4 at 110 bpm, fast.mid at 150, both with
    notes every 0.3 s); the summary says the seconds; the notes outside come back unchanged."""
    tmp_path, songs = setup
    folder = tmp_path / "bars"
    folder.mkdir()
    for name, bpm in (("good.mid", 110), ("fast.mid", 150)):
        pm = pretty_midi.PrettyMIDI(str(songs / "sub" / "good.mid"))
        if bpm != 110:  # same notes, another tempo
            fast = pretty_midi.PrettyMIDI(initial_tempo=bpm)
            fast.instruments = pm.instruments
            pm = fast
        pm.write(str(folder / name))
    out = tmp_path / "bars-out"
    argv = ["infill", str(folder), "--checkpoint", str(tmp_path / "ckpt"), "--bars", "2-3", "--out", str(out),
            "--seed", "3", "--quiet"]  # fmt: skip
    assert main(argv) == 0
    assert "filled bars 2-3 in 2 of 2 files" in capsys.readouterr().out
    records = {
        r["input"].rsplit("/", 1)[-1]: r for r in json.loads((out / "summary.json").read_text())["files"]
    }
    for name, bpm in (("good.mid", 110), ("fast.mid", 150)):
        bar = 4 * 60 / bpm
        r = records[name]
        assert r["bars"] == [2, 3] and abs(r["start"] - bar) < 1e-3 and abs(r["end"] - 3 * bar) < 1e-3, r
        source = pretty_midi.PrettyMIDI(str(folder / name)).instruments[0].notes
        got = pretty_midi.PrettyMIDI(str(out / name.replace(".mid", ".sample0.mid"))).instruments[0].notes
        kept = {(n.pitch, round(n.start, 3)) for n in source if not r["start"] <= n.start < r["end"]}
        new = {(n.pitch, round(n.start, 3)) for n in got} - kept
        assert kept <= {(n.pitch, round(n.start, 3)) for n in got}
        assert all(r["start"] <= s < r["end"] for _, s in new)
    # a bar past a file's music is that file's error; --bars with seconds, or backwards, is every file's
    past = [
        "infill",
        str(folder / "good.mid"),
        "--checkpoint",
        str(tmp_path / "ckpt"),
        "--out",
        str(out / "x"),
    ]
    assert main([*past, "--bars", "5-40"]) == 1
    assert "error [span_outside_music]" in capsys.readouterr().err
    assert main([*past, "--bars", "3-2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("musicrel infill: error [invalid_span]: the bars must"), err
    assert main([*past, "--bars", "2-3", "--start", "1"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(past) == 2
    assert "--start and --end (seconds) or as --bars" in capsys.readouterr().err


def test_control_flags_steer_the_span_and_the_summary_says_what_they_applied(setup, capsys):
    tmp_path, songs = setup
    good = songs / "sub" / "good.mid"  # pitches 60-67 around the span: C major's notes and C#, D#, F#
    out = tmp_path / "steered"
    assert run(tmp_path, good, out, "--key", "C:major", "--key-strength", "only", "--low-note", "60") == 0
    (record,) = json.loads((out / "summary.json").read_text())["files"]
    assert record["controls"] == {"key": "C:major", "key_strength": "only", "low_note": 60, "high_note": 127}
    for i in range(2):
        (inst,) = pretty_midi.PrettyMIDI(str(out / f"good.sample{i}.mid")).instruments
        new = [n for n in inst.notes if 3 <= n.start < 6]
        assert new and all(n.pitch % 12 in {0, 2, 4, 5, 7, 9, 11} and n.pitch >= 60 for n in new)
    capsys.readouterr()
    assert run(tmp_path, good, tmp_path / "bad", "--chords", "X:2") == 2
    assert (
        capsys.readouterr().err.strip().splitlines()[-1].startswith("musicrel infill: error [unknown_chord]")
    )
    with pytest.raises(SystemExit) as exit_:  # no --program: the new notes join the file's instrument
        run(tmp_path, good, tmp_path / "bad", "--program", "40")
    assert exit_.value.code == 2


def test_tracks_regenerates_only_those_tracks_and_the_summary_says_where_the_notes_went(setup, capsys):
    import mido

    from tests.musicrel.generation.test_infill_tracks import with_markers

    tmp_path, _ = setup
    pm = pretty_midi.PrettyMIDI(initial_tempo=110)
    for k, low in enumerate((72, 60, 40)):
        inst = pretty_midi.Instrument(program=[0, 33, 48][k], name=f"t{k}")
        inst.notes = [
            pretty_midi.Note(80, low + j % 7, 0.4 * j + 0.1 * k, 0.4 * j + 0.1 * k + 0.3) for j in range(30)
        ]
        pm.instruments.append(inst)
    song = tmp_path / "three.mid"
    song.write_bytes(with_markers(pm))  # a copyright, SysEx, a marker, ports: pretty_midi writes none
    source = pretty_midi.PrettyMIDI(str(song))
    out = tmp_path / "tracks-out"
    assert run(tmp_path, song, out, "--tracks", "1") == 0
    (record,) = json.loads((out / "summary.json").read_text())["files"]
    assert record["tracks"] == [1] and record["removed"] == sum(
        3 <= n.start < 6 for n in source.instruments[1].notes
    )
    for i in range(2):
        got = pretty_midi.PrettyMIDI(str(out / f"three.sample{i}.mid"))
        assert [x.name for x in got.instruments] == ["t0", "t1", "t2"]
        for t in (0, 2):
            assert [(n.pitch, n.start, n.end) for n in got.instruments[t].notes] == [
                (n.pitch, n.start, n.end) for n in source.instruments[t].notes
            ]
        new = [n for n in got.instruments[1].notes if 2.99 <= n.start < 6]  # 3.0 s reads back a tick early
        assert record["new_notes_by_track"][i] == ({"1": len(new)} if new else {})
        sent = mido.MidiFile(song).tracks  # the file is the input's own messages, track 1's notes edited
        tracks = mido.MidiFile(out / f"three.sample{i}.mid").tracks
        assert [tracks[t] for t in (0, 1, 3)] == [sent[t] for t in (0, 1, 3)]
    assert run(tmp_path, song, tmp_path / "t2", "--tracks", "7") == 1  # this file has no track 7
    assert "error [no_such_track]" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        run(tmp_path, song, tmp_path / "t3", "--tracks", "a")
    assert exit_.value.code == 2


def test_an_instruments_checkpoint_fills_the_files_a_piano_infill_model_would_flatten(setup, capsys):
    """--instruments-checkpoint: a three-instrument song goes to the model with instruments (as the server
    routes an upload), comes back with its tracks and every note outside the span; a one-instrument file
    stays with --checkpoint; the summary says which wrote each; a model that cannot fill is one line."""
    from tests.musicrel.generation.test_infill_tracks import check_only_chosen_changed, three_tracks

    tmp_path, songs = setup
    _model(tmp_path / "band", EventCodec(CodecConfig(infill=True, instruments=True)))
    _model(tmp_path / "band-no-infill", EventCodec(CodecConfig(instruments=True)))
    song = three_tracks(programs=(0, 33, 40), seconds=12.0)  # piano, bass, violin
    song.write(str(songs / "song.mid"))
    song = pretty_midi.PrettyMIDI(str(songs / "song.mid"))  # as the command reads it
    out = tmp_path / "out"
    assert run(tmp_path, songs, out, "--instruments-checkpoint", str(tmp_path / "band")) == 0
    by_name = {
        r["input"].rsplit("/", 1)[-1]: r for r in json.loads((out / "summary.json").read_text())["files"]
    }
    assert by_name["song.mid"]["model"] == "instruments" and by_name["good.mid"]["model"] == "checkpoint"
    for k in range(2):
        filled = pretty_midi.PrettyMIDI(str(out / f"song.sample{k}.mid"))
        # a note written at 2.999997 s (ticks) starts at 3.00 s, the span's first 10 ms step
        check_only_chosen_changed(song, filled, {0, 1, 2}, 2.995, 6.0)
    capsys.readouterr()
    assert (
        run(tmp_path, songs, tmp_path / "o2", "--instruments-checkpoint", str(tmp_path / "band-no-infill"))
        == 2
    )
    err = capsys.readouterr().err
    assert "[bad_instruments_checkpoint]" in err and "infill" in err and "Traceback" not in err
