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


def test_an_instruments_checkpoint_accompanies_the_melodies_asking_for_instruments(tmp_path, capsys):
    """--instruments-checkpoint: a melody whose --instruments name instruments goes to the model with them
    (as the server routes an accompaniment), one without stays with the piano accompaniment model; the
    summary says which wrote each."""
    from musicrel.midi.codec import CodecConfig, EventCodec
    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import MusicTransformer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        save_model(instruments_model(max_seq_len=128), tmp_path / "band", codec=CODEC)
        piano = EventCodec(CodecConfig(melody=True, tracks=[0, 1]))
        torch.manual_seed(0)
        cfg = ModelConfig(
            vocab_size=piano.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=128
        )
        save_model(MusicTransformer(cfg), tmp_path / "piano", codec=piano)
        pm = pretty_midi.PrettyMIDI(initial_tempo=100)
        voice = pretty_midi.Instrument(program=68, name="Voice")
        voice.notes = [pretty_midi.Note(90, 67 + k % 5, 0.5 * k, 0.5 * k + 0.4) for k in range(8)]
        pm.instruments.append(voice)
        pm.write(str(tmp_path / "tune.mid"))
        argv = ["accompany", "--checkpoint", str(tmp_path / "piano"), "--instruments-checkpoint",
                str(tmp_path / "band"), "--input", str(tmp_path / "tune.mid"), "--seed", "2",
                "--quiet"]  # fmt: skip
        assert main([*argv, "--out", str(tmp_path / "cello"), "--instruments", "Cello"]) == 0
        assert main([*argv, "--out", str(tmp_path / "plain")]) == 0
        for out, model in (("cello", "instruments"), ("plain", "checkpoint")):
            (record,) = json.loads((tmp_path / out / "summary.json").read_text())["files"]
            assert record["model"] == model
        cello = pretty_midi.PrettyMIDI(str(tmp_path / "cello" / "tune.sample0.mid")).instruments
        assert cello[0].name == "Voice" and all((t.name, t.program) == ("Cello", 42) for t in cello[1:])
        assert len(pretty_midi.PrettyMIDI(str(tmp_path / "plain" / "tune.sample0.mid")).instruments) == 2
    finally:
        torch.set_num_threads(threads)
