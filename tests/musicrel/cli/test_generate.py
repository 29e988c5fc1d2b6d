"""`musicrel generate` on a folder: outputs, summary, broken files reported, reruns resume; Lightning path."""

from __future__ import annotations

import json

import pretty_midi
import pytest
import torch

from musicrel.cli import main
from musicrel.midi.codec import EventCodec
from musicrel.model.checkpoint import save_model
from musicrel.model.config import ModelConfig
from musicrel.model.transformer import MusicTransformer


@pytest.fixture
def setup(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model, shared machine
    codec = EventCodec()
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=codec.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=128
    )
    save_model(MusicTransformer(cfg), tmp_path / "ckpt", codec=codec)
    motifs = tmp_path / "motifs"
    (motifs / "sub").mkdir(parents=True)
    pm = pretty_midi.PrettyMIDI(initial_tempo=110)
    inst = pretty_midi.Instrument(program=11)
    inst.notes = [pretty_midi.Note(90, 60 + k % 8, 0.3 * k, 0.3 * k + 0.4) for k in range(12)]
    pm.instruments.append(inst)
    pm.write(str(motifs / "sub" / "good.mid"))
    (motifs / "broken.mid").write_bytes(
        b"MThd\x00\x00\x00\x06\x00\x01\x00\x01\x01\xe0MTrk\x00\x00\x00\x10\x00\x90"
    )
    (motifs / "notes.txt").write_text("not a motif")
    yield tmp_path, motifs
    torch.set_num_threads(threads)


def run(tmp_path, motifs, out, *extra) -> int:
    argv = ["generate", "--checkpoint", str(tmp_path / "ckpt"), "--input", str(motifs), "--out", str(out),
            "--num-samples", "2", "--seconds", "2", "--seed", "3", "--quiet", *extra]  # fmt: skip
    return main(argv)


def test_generate_folder_reports_broken_and_resumes(setup, capsys):
    tmp_path, motifs = setup
    out = tmp_path / "out"
    assert run(tmp_path, motifs, out) == 0
    outputs = [out / "sub" / f"good.sample{i}.mid" for i in range(2)]
    for path in outputs:
        pm = pretty_midi.PrettyMIDI(str(path))
        assert pm.instruments[0].program == 11 and pm.get_end_time() == pytest.approx(2.0, abs=0.011)
    err = capsys.readouterr().err
    assert err.count("broken.mid") == 1 and "skipped" in err and "Traceback" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"] == {"ok": 1, "exists": 0, "error": 1}
    assert summary["settings"]["seed"] == 3 and summary["settings"]["num_samples"] == 2
    by_name = {r["input"].rsplit("/", 1)[-1]: r for r in summary["files"]}
    assert by_name["good.mid"]["status"] == "ok" and by_name["good.mid"]["seed"] == 3
    assert set(by_name["good.mid"]["timings"]) >= {"prefill", "decode"}
    assert by_name["broken.mid"]["status"] == "error" and by_name["broken.mid"]["error"]["code"]

    first = [p.read_bytes() for p in outputs]
    outputs[1].unlink()  # an interrupted run: one output missing
    assert run(tmp_path, motifs, out) == 0
    assert [p.read_bytes() for p in outputs] == first  # same seed, same files
    outputs[0].write_bytes(b"kept")  # complete outputs are never regenerated
    assert run(tmp_path, motifs, out) == 0
    assert outputs[0].read_bytes() == b"kept"
    assert json.loads((out / "summary.json").read_text())["counts"]["exists"] == 1


def test_generate_only_broken_input_fails(setup, capsys):
    tmp_path, motifs = setup
    assert run(tmp_path, motifs / "broken.mid", tmp_path / "out") == 2
    assert "broken.mid" in capsys.readouterr().err


def test_generate_with_lightning_predict_matches_single_process(setup):
    tmp_path, motifs = setup
    assert run(tmp_path, motifs, tmp_path / "plain") == 0
    assert run(tmp_path, motifs, tmp_path / "pl", "--devices", "1", "--accelerator", "cpu") == 0
    for i in range(2):
        name = f"sub/good.sample{i}.mid"
        assert (tmp_path / "pl" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()
    summary = json.loads((tmp_path / "pl" / "summary.json").read_text())
    # the default, auto: what the probe chose on this CPU, said as the weights the model holds
    assert summary["counts"]["ok"] == 1 and summary["weights"] in ("int8", "float32")
    # an accelerator that is not the CPU gets the weights as trained (Lightning moves the model after loading)
    assert run(tmp_path, motifs, tmp_path / "auto", "--devices", "1", "--accelerator", "auto") == 0
    assert json.loads((tmp_path / "auto" / "summary.json").read_text())["weights"] == "float32"


def test_bench_generate_smoke(setup, capsys, monkeypatch):
    """The benchmark runs end to end and prints its table (speed itself is never asserted in tests)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # an explicit count would win over the choice
    tmp_path, _ = setup
    argv = ["bench", "generate", "--checkpoint", str(tmp_path / "ckpt"), "--tokens", "8", "--repeats", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    # The tiny model's window (128) is too short for the long prefixes: a 1024-window stand-in is measured.
    assert "decode @ prefix 1024" in out and "max_seq_len 1024 (random weights)" in out
    assert "batch 8 vs 1" in out and "real-time factor, b=1" in out
    assert "torch threads" in out and "(chosen: " in out and "CPUs available" in out  # what it chose, and why


def test_bench_neighbour_smoke(setup, capsys):
    """musicrel generate alone and beside a CPU-bound process, side by side: the table, the threads each run
    chose and the ratio (speed itself is never asserted in tests)."""
    tmp_path, _ = setup
    argv = ["bench", "neighbour", "--checkpoint", str(tmp_path / "ckpt"), "--seconds", "0.2", "--rounds", "1",
            "--motifs", "1", "--num-samples", "1", "--neighbours", "1"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "alone" in out and "beside a neighbour" in out and "torch thread" in out
    assert "beside a neighbour / alone: " in out and "(goal <= 2x)" in out


def test_generate_says_how_many_threads_it_chose(setup, capsys, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # an explicit count would win over the choice
    tmp_path, motifs = setup
    assert main(["generate", "--checkpoint", str(tmp_path / "ckpt"), "--input", str(motifs), "--out",
                 str(tmp_path / "o"), "--seconds", "0.5", "--seed", "1"]) == 0  # fmt: skip
    said = [line for line in capsys.readouterr().err.splitlines() if "torch thread" in line]
    assert said and said[0].startswith("musicrel generate: ") and "CPUs available" in said[0]
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["settings"]["threads"] in said[0]


def test_generate_reports_what_each_sample_copied_from_the_index_beside_the_checkpoint(setup):
    from musicrel.evaluation.novelty import INDEX_FILE, NoveltyIndex

    tmp_path, motifs = setup
    assert run(tmp_path, motifs / "sub", tmp_path / "first", "--seconds", "10", "--seed", "5") == 0
    first = json.loads((tmp_path / "first" / "summary.json").read_text())
    assert first["settings"]["novelty_index"] is None and "novelty" not in first["files"][0]
    # A "training set" holding sample 0 itself (transposed): the same seed must find all of it copied.
    copied = pretty_midi.PrettyMIDI(str(tmp_path / "first" / "good.sample0.mid")).instruments[0].notes
    planted = [pretty_midi.Note(n.velocity, n.pitch + 5, n.start + 1.0, n.end + 1.0) for n in copied]
    other = [pretty_midi.Note(80, 40 + (7 * k) % 11, 0.37 * k, 0.37 * k + 0.2) for k in range(30)]
    NoveltyIndex.build([("other.mid", other), ("planted.mid", planted)]).save(tmp_path / "ckpt" / INDEX_FILE)

    assert run(tmp_path, motifs / "sub", tmp_path / "again", "--seconds", "10", "--seed", "5") == 0
    summary = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert summary["settings"]["novelty_index"] == {"pieces": 2, "notes": 30 + len(planted)}
    (record,) = summary["files"]
    assert len(record["novelty"]) == 2
    assert len(copied) >= 3
    assert record["novelty"][0]["source"] == "planted.mid"
    assert record["novelty"][0]["notes"] == len(copied)
    assert record["novelty"][0]["start_time_in_source"] == pytest.approx(planted[0].start, abs=0.011)


def test_generate_control_flags_reach_the_outputs_and_summary(setup):
    tmp_path, motifs = setup
    out = tmp_path / "steered"
    flags = ["--key", "auto", "--key-strength", "only", "--chords", "C:1 G:2b", "--program", "Violin",
             "--low-note", "50", "--high-note", "80", "--max-polyphony", "2", "--density", "4"]  # fmt: skip
    assert run(tmp_path, motifs, out, *flags) == 0
    summary = json.loads((out / "summary.json").read_text())
    record = next(r for r in summary["files"] if r["status"] == "ok")
    applied = record["controls"]
    assert applied["program"] == 40 and applied["key_strength"] == "only" and applied["key_detected"] is True
    # "G:2b" is two beats at the motif's 110 bpm, on the 10 ms grid
    assert applied["chords"] == [{"chord": "C", "seconds": 1.0}, {"chord": "G", "seconds": 1.09}]
    assert summary["settings"]["controls"]["chords"] == "C:1 G:2b"
    for path in record["outputs"]:
        pm = pretty_midi.PrettyMIDI(path)
        assert pm.instruments[0].program == 40
        assert all(50 <= n.pitch <= 80 for n in pm.instruments[0].notes)


def test_generate_motif_end_and_what_was_read_are_in_the_summary(setup):
    tmp_path, motifs = setup
    out = tmp_path / "cut"
    assert run(tmp_path, motifs, out, "--motif-end", "1.5", "--primer-seconds", "1") == 0
    summary = json.loads((out / "summary.json").read_text())
    record = next(r for r in summary["files"] if r["status"] == "ok")
    assert summary["settings"]["motif_end"] == 1.5
    assert record["primer"]["end_time"] == 1.5 and record["primer"]["start_time"] == 0.5
    assert record["primer"]["program"] == 11 and "every note" in record["primer"]["program_reason"]


@pytest.mark.parametrize(
    "flags, code",
    [
        (["--chords", "C:2 Hm:2"], "unknown_chord"),
        (["--low-note", "70", "--high-note", "60"], "empty_range"),
        (["--key", "C:bebop"], "unknown_key"),
    ],
)
def test_generate_bad_control_is_one_line_with_its_code(setup, capsys, flags, code):
    tmp_path, motifs = setup
    assert run(tmp_path, motifs, tmp_path / "bad", *flags) == 2
    err = capsys.readouterr().err
    assert f"[{code}]" in err and "Traceback" not in err


def test_an_instruments_checkpoint_takes_the_motifs_a_piano_model_would_flatten(setup, capsys):
    """--instruments-checkpoint: a quartet goes to the model with instruments and keeps its four tracks, a
    piano motif stays with --checkpoint; the summary says which model wrote each; a bad pair is one line."""
    from musicrel.midi.codec import CodecConfig
    from tests.musicrel.generation.test_continuation_tracks import quartet

    tmp_path, motifs = setup
    codec = EventCodec(CodecConfig(instruments=True))
    torch.manual_seed(1)
    cfg = ModelConfig(
        vocab_size=codec.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=256
    )
    save_model(MusicTransformer(cfg), tmp_path / "band", codec=codec)
    quartet().write(str(motifs / "quartet.mid"))
    out = tmp_path / "out"
    assert (
        run(tmp_path, motifs, out, "--instruments-checkpoint", str(tmp_path / "band"), "--include-primer")
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    by_name = {r["input"].rsplit("/", 1)[-1]: r for r in summary["files"]}
    assert by_name["quartet.mid"]["model"] == "instruments" and by_name["good.mid"]["model"] == "checkpoint"
    assert summary["instruments_checkpoint"] == str(tmp_path / "band")
    assert [t["name"] for t in by_name["quartet.mid"]["primer"]["tracks"]] == [
        "Violin I", "Violin II", "Viola", "Violoncello"
    ]  # fmt: skip
    written = pretty_midi.PrettyMIDI(str(out / "quartet.sample0.mid"))
    assert [i.name for i in written.instruments][:4] == ["Violin I", "Violin II", "Viola", "Violoncello"]
    assert pretty_midi.PrettyMIDI(str(out / "sub" / "good.sample0.mid")).instruments[0].program == 11
    capsys.readouterr()
    assert run(tmp_path, motifs, tmp_path / "o2", "--instruments-checkpoint", str(tmp_path / "ckpt")) == 2
    err = capsys.readouterr().err
    assert "[bad_instruments_checkpoint]" in err and "no instruments" in err and "Traceback" not in err
