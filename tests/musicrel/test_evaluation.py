"""Evaluation metrics on hand-made notes, and evaluate-continuations end to end on a tiny checkpoint."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pretty_midi
import pytest
import torch

from musicrel.checkpoint import save_model
from musicrel.codec import EventCodec
from musicrel.config import ModelConfig
from musicrel.evaluation import (
    compare,
    evaluate_continuations,
    format_table,
    grammar_errors,
    histogram_overlap,
    inter_onset_intervals,
    ioi_histogram,
    pitch_class_histogram,
    pitch_range,
    repeat_motif,
    split_piece,
)
from musicrel.model import MusicTransformer

CODEC = EventCodec()


def N(pitch, start, end, velocity=80):
    return pretty_midi.Note(velocity, pitch, start, end)


SCALE = [N(60 + k, 0.5 * i, 0.5 * i + 0.4) for i, k in enumerate([0, 2, 4, 5, 7, 9, 11, 12])]


def test_identical_notes_score_perfectly():
    s = compare(SCALE, SCALE, seconds=4.0)
    assert s == {
        "pc_overlap": 1.0,
        "ioi_overlap": 1.0,
        "range_diff": 0.0,
        "density": 2.0,
        "density_ratio": 1.0,
    }


def test_disjoint_and_partial_histograms():
    c_major = [N(60, 0, 1), N(64, 1, 2)]
    f_sharp = [N(66, 0, 1), N(66 + 12, 1, 2)]
    assert histogram_overlap(pitch_class_histogram(c_major), pitch_class_histogram(f_sharp)) == 0.0
    half = [N(60, 0, 1), N(66, 1, 2)]  # shares C with c_major: 0.5 of the mass
    assert histogram_overlap(pitch_class_histogram(c_major), pitch_class_histogram(half)) == pytest.approx(
        0.5
    )
    assert pitch_class_histogram([N(61, 0, 1), N(73, 1, 2)])[1] == 1.0  # octaves share a class
    assert histogram_overlap(pitch_class_histogram([]), pitch_class_histogram([])) == 1.0
    assert histogram_overlap(pitch_class_histogram([]), pitch_class_histogram(c_major)) == 0.0


def test_rhythm_range_density():
    chords = [N(60, 0, 1), N(64, 0, 1), N(67, 0, 1), N(60, 1, 2), N(64, 1, 2)]
    np.testing.assert_allclose(inter_onset_intervals(chords), [1.0])  # a chord is one onset
    eighths = [N(60, 0.25 * i, 0.25 * i + 0.2) for i in range(8)]
    assert histogram_overlap(ioi_histogram(chords), ioi_histogram(eighths)) == 0.0
    assert pitch_range(SCALE) == 12 and pitch_range([]) == 0
    s = compare(eighths, SCALE, seconds=4.0)
    assert s["range_diff"] == 12.0 and s["density_ratio"] == 1.0
    assert math.isnan(compare(SCALE, [], seconds=4.0)["density_ratio"])


def test_grammar_errors_counts_each_kind():
    on, off = CODEC.note_on_offset, CODEC.note_off_offset
    assert not any(grammar_errors(CODEC, [on + 60, 256, off + 60]).values())
    errs = grammar_errors(CODEC, [off + 61, on + 60, on + 60, CODEC.eos_id, 10_000])  # a re-strike is legal
    assert errs == {"orphan_note_off": 1, "special_token": 1, "out_of_vocab": 1}
    # a note the primer leaves sounding may be closed; without that knowledge its note-off is an orphan
    primer_open = np.zeros(128, dtype=bool)
    primer_open[62] = True
    assert grammar_errors(CODEC, [off + 62], primer_open)["orphan_note_off"] == 0
    assert grammar_errors(CODEC, [off + 62])["orphan_note_off"] == 1


def test_split_piece_and_repeat_motif():
    notes = [N(60, 1.0, 2.5), N(62, 2.0, 3.0), N(64, 3.5, 6.0), N(65, 7.0, 8.0)]
    motif, reference, cut = split_piece(notes, motif_seconds=2.0, seconds=3.0)
    assert cut == 3.0
    assert [(n.pitch, n.start, n.end) for n in motif] == [(60, 1.0, 2.5), (62, 2.0, 3.0)]
    assert [(n.pitch, n.start, n.end) for n in reference] == [(64, 0.5, 3.0)]  # clipped to the window
    rep = repeat_motif(motif, seconds=4.5)
    assert [(n.pitch, n.start) for n in rep] == [(60, 0.0), (62, 1.0), (60, 2.0), (62, 3.0), (60, 4.0)]
    assert max(n.end for n in rep) <= 4.5


@pytest.fixture
def one_thread():
    # A tiny model on a shared machine: thread hand-offs cost more than the arithmetic.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_evaluate_continuations_end_to_end(tmp_path, one_thread):
    torch.manual_seed(1)
    cfg = ModelConfig(
        vocab_size=CODEC.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=128
    )
    save_model(MusicTransformer(cfg), tmp_path / "ckpt", codec=CODEC)
    pieces = tmp_path / "pieces"
    pieces.mkdir()
    for k in range(3):
        pm = pretty_midi.PrettyMIDI()
        inst = pretty_midi.Instrument(program=0)
        inst.notes = [N(60 + (i * (k + 2)) % 12, 0.25 * i, 0.25 * i + 0.2) for i in range(24)]
        pm.instruments.append(inst)
        pm.write(str(pieces / f"p{k}.mid"))
    (pieces / "short.mid").write_bytes(b"MThd\x00\x00\x00\x06")
    report = evaluate_continuations(tmp_path / "ckpt", pieces, motif_seconds=3.0, seconds=2.0, batch_size=2)
    assert report["pieces"] == 3 and sum(report["skipped"].values()) == 1
    rows = report["systems"]
    assert set(rows) == {"model", "model, no grammar mask", "untrained model", "repeat motif"}
    assert rows["model"]["grammar_error"] == 0.0 and rows["untrained model"]["grammar_error"] == 0.0
    # The pieces repeat a 3 s pattern, so repeating the motif reproduces the pitch classes exactly.
    assert rows["repeat motif"]["pc_overlap"] == pytest.approx(1.0)
    for r in rows.values():
        assert 0.0 <= r["pc_overlap"] <= 1.0 and 0.0 <= r["ioi_overlap"] <= 1.0
    table = format_table(report)
    assert "repeat motif" in table and "PC overlap" in table


def test_held_out_files_reads_a_prepared_split(tmp_path):
    import json

    from musicrel.errors import GenerationError
    from musicrel.evaluation import held_out_files

    (tmp_path / "a.mid").write_bytes(b"")
    assert held_out_files(tmp_path) == [tmp_path / "a.mid"]  # a plain folder: its MIDI files
    files = [
        {"path": "/data/x.mid", "sha256": "0", "tokens": 5},
        {"path": "/data/y.mid", "sha256": "1", "tokens": 7},
    ]
    manifest = {"splits": {"train": {"files": []}, "test": {"files": files}}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert held_out_files(tmp_path) == [Path("/data/x.mid"), Path("/data/y.mid")]
    with pytest.raises(GenerationError, match="val"):
        held_out_files(tmp_path, "val")
