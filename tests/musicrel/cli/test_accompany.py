"""`musicrel accompany` with a model whose codec has instruments: the melody track kept note for note, the
instruments it writes on tracks of their own, `--instruments` choosing them, `--program` refused."""

from __future__ import annotations

import json

import pretty_midi
import torch

from musicrel.cli import main
from musicrel.model.checkpoint import save_model
from tests.musicrel.generation.test_continuation_tracks import CODEC, instruments_model


def test_a_model_with_instruments_accompanies_on_tracks_of_their_own(tmp_path, capsys):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        save_model(instruments_model(max_seq_len=128), tmp_path / "ckpt", codec=CODEC)
        pm = pretty_midi.PrettyMIDI(initial_tempo=100)
        voice = pretty_midi.Instrument(program=68, name="Voice")
        voice.notes = [pretty_midi.Note(90, 67 + k % 5, 0.5 * k, 0.5 * k + 0.4) for k in range(8)]
        pm.instruments.append(voice)
        pm.write(str(tmp_path / "tune.mid"))
        argv = ["accompany", "--checkpoint", str(tmp_path / "ckpt"), "--input", str(tmp_path / "tune.mid"),
                "--out", str(tmp_path / "out"), "--seed", "2", "--num-samples", "2", "--quiet"]  # fmt: skip
        assert main([*argv, "--instruments", "Cello"]) == 0
        source = pretty_midi.PrettyMIDI(str(tmp_path / "tune.mid")).instruments[0].notes
        written = 0
        for i in range(2):
            out = pretty_midi.PrettyMIDI(str(tmp_path / "out" / f"tune.sample{i}.mid"))
            first, *others = out.instruments
            assert first.name == "Voice" and first.program == 68
            assert [(n.pitch, n.start, n.end) for n in first.notes] == [
                (n.pitch, n.start, n.end) for n in source
            ]
            assert all((t.name, t.program) == ("Cello", 42) for t in others)
            written += sum(len(t.notes) for t in others)
        assert written > 0
        (record,) = json.loads((tmp_path / "out" / "summary.json").read_text())["files"]
        assert record["melody_track"] == 0 and record["controls"]["instruments"] == ["Cello"]
        assert main([*argv[:-5], "--out", str(tmp_path / "bad"), "--program", "40", "--quiet"]) == 1
        assert "error [program_with_instruments]" in capsys.readouterr().err
    finally:
        torch.set_num_threads(threads)
