"""Evaluation metrics on hand-made notes with known answers, the bootstrap on known data, and
evaluate-continuations end to end on a tiny checkpoint (report, JSON, both pictures, the CLI)."""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch

from musicrel.cli import main
from musicrel.evaluation.continuation_systems import SYSTEMS, repeat_motif, system_continuations
from musicrel.evaluation.continuations import EvaluationOptions, evaluate_continuations
from musicrel.evaluation.metrics import (
    GEOMETRIC_FLOOR,
    METRICS,
    bootstrap_interval,
    compare,
    describe,
    duration_histogram,
    grammar_errors,
    held_share,
    histogram_overlap,
    inter_onset_intervals,
    ioi_histogram,
    key_correlation,
    one_pitch,
    paired_difference,
    pitch_class_histogram,
    pitch_range,
    polyphony,
    repetition,
    sounding_at_end,
    velocity_histogram,
)
from musicrel.evaluation.ngram import NGramModel
from musicrel.evaluation.pieces import EvaluationError, held_out_files, split_piece
from musicrel.evaluation.report import format_report, write_report
from musicrel.generation.keys import find_key
from musicrel.generation.primer import primer_at_cut
from musicrel.generation.sampling import SamplingParams
from musicrel.midi.codec import shift_steps
from musicrel.model.checkpoint import load_model
from tests.musicrel.evaluation.conftest import CODEC, N


def scale(tonic: int) -> list:
    return [N(tonic + k, 0.5 * i, 0.5 * i + 0.4) for i, k in enumerate([0, 2, 4, 5, 7, 9, 11, 12])]


SCALE = scale(60)


# ---------------------------------------------------------------------------------------------- metrics


def test_identical_notes_score_perfectly():
    s = compare(SCALE, SCALE, seconds=4.0, key=(0, "major"))
    assert {
        k: s[k] for k in ("pc_overlap", "ioi_overlap", "duration_overlap", "velocity_overlap")
    } == dict.fromkeys(("pc_overlap", "ioi_overlap", "duration_overlap", "velocity_overlap"), 1.0)
    assert s["range_diff"] == 0.0 and s["density"] == 2.0 and s["density_ratio"] == 1.0
    assert s == {**s, **describe(SCALE, 4.0, (0, "major"))}  # the intrinsic figures ride along
    assert set(s) == {m.name for m in METRICS if not (m.tokens or m.index or m.instruments)}


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
    # duration weighting: a 3 s C against a 1 s E is 3/4 C
    assert pitch_class_histogram([N(60, 0, 3), N(64, 3, 4)], weight="duration")[0] == pytest.approx(0.75)


def test_rhythm_range_density():
    chords = [N(60, 0, 1), N(64, 0, 1), N(67, 0, 1), N(60, 1, 2), N(64, 1, 2)]
    np.testing.assert_allclose(inter_onset_intervals(chords), [1.0])  # a chord is one onset
    eighths = [N(60, 0.25 * i, 0.25 * i + 0.2) for i in range(8)]
    assert histogram_overlap(ioi_histogram(chords), ioi_histogram(eighths)) == 0.0
    assert pitch_range(SCALE) == 12 and pitch_range([]) == 0
    s = compare(eighths, SCALE, seconds=4.0)
    assert s["range_diff"] == 12.0 and s["density_ratio"] == 1.0
    assert math.isnan(compare(SCALE, [], seconds=4.0)["density_ratio"])


def test_duration_and_velocity_overlap():
    short = [N(60, i, i + 0.1) for i in range(4)]
    mixed = short[:2] + [N(60, 2, 3.5), N(60, 3, 4.5)]  # half the notes in another duration bin
    assert histogram_overlap(duration_histogram(short), duration_histogram(mixed)) == pytest.approx(0.5)
    loud, soft = [N(60, 0, 1, 100)] * 3, [N(60, 0, 1, 40)] * 3
    assert histogram_overlap(velocity_histogram(loud), velocity_histogram(soft)) == 0.0
    assert histogram_overlap(velocity_histogram(loud), velocity_histogram(loud + soft)) == pytest.approx(0.5)
    # 100 and 101 share a bin of 8: a velocity one step away is the same dynamic
    assert histogram_overlap(velocity_histogram(loud), velocity_histogram([N(60, 0, 1, 101)])) == 1.0


def test_key_of_scales():
    assert find_key(SCALE) == (0, "major")
    assert key_correlation(SCALE, (0, "major")) == pytest.approx(0.9014, abs=1e-4)
    assert find_key(scale(67)) == (7, "major")
    # A harmonic minor, tonic and dominant held longest
    a_minor = [
        N(p, 0.5 * i, 0.5 * i + d)
        for i, (p, d) in enumerate(
            [(57, 1.0), (59, 0.3), (60, 0.6), (62, 0.3), (64, 0.8), (65, 0.3), (68, 0.3), (69, 1.0)]
        )
    ]
    assert find_key(a_minor) == (9, "minor")
    # F# major sits outside C major: a negative correlation with its profile
    assert key_correlation(scale(66), (0, "major")) < -0.5
    assert find_key([]) is None and math.isnan(key_correlation([], (0, "major")))
    assert math.isnan(key_correlation(SCALE, None))


def test_polyphony():
    assert polyphony([N(60, 0, 2), N(64, 1, 3)]) == (pytest.approx(4 / 3), 2)
    # a chord of three, then one note that starts as the chord ends (touching is not overlapping)
    assert polyphony([N(60, 0, 1), N(64, 0, 1), N(67, 0, 1), N(72, 1, 2)]) == (pytest.approx(2.0), 3)
    assert polyphony([N(60, 0, 1), N(62, 2, 3)]) == (pytest.approx(1.0), 1)  # silence does not count
    mean, most = polyphony([])
    assert math.isnan(mean) and most == 0


def test_repetition():
    pattern = [60, 62, 64, 65, 67, 65, 64, 62]  # no 4 successive intervals repeat within it

    def notes(copies):
        return [N(p, 0.25 * i, 0.25 * i + 0.2) for i, p in enumerate(pattern * copies)]

    assert repetition(notes(1)) == 0.0
    # 15 (interval, IOI) steps, 12 4-grams; the last 4 repeat the first 4
    assert repetition(notes(2)) == pytest.approx(4 / 12)
    assert repetition(notes(8)) == pytest.approx((64 - 1 - 4 + 1 - 8) / (64 - 1 - 4 + 1))
    assert repetition([N(60, i, i + 1) for i in range(10)]) == pytest.approx(5 / 6)  # one repeated note
    # the same pitches in another rhythm are not a repeat
    assert repetition(notes(1) + [N(p, 2 + 0.5 * i, 2.4 + 0.5 * i) for i, p in enumerate(pattern)]) == 0.0
    assert math.isnan(repetition(notes(1)[:4]))


def test_one_pitch_marks_a_drone():
    drone = [N(69, 0.1 * i, 0.1 * i + 0.05) for i in range(5)] + [N(60 + i, 1 + i, 1.5 + i) for i in range(4)]
    assert one_pitch(drone) == 1.0  # 5 of 9 notes on A4
    assert one_pitch(drone[1:]) == 0.0  # 4 of 8: half is not a drone
    assert math.isnan(one_pitch([]))
    assert describe(drone, 10.0, None)["one_pitch"] == 1.0


def test_held_share():
    notes = [N(60, 0, 5), N(62, 0, 1), N(64, 1, 2), N(65, 2, 3)]
    assert held_share(notes) == 0.25
    assert held_share([N(60, 0, 4.0)]) == 0.0  # longer than 4 s, not as long
    assert math.isnan(held_share([]))
    assert describe(notes, 5.0, None)["held_share"] == 0.25


def test_sounding_at_end():
    notes = [N(60, 0, 5), N(62, 0, 1), N(64, 4.5, 5.0), N(65, 2, 3)]  # two still sound when the 5 s end
    assert sounding_at_end(notes, 5.0) == 0.5
    assert sounding_at_end(notes, 10.0) == 0.0
    assert math.isnan(sounding_at_end([], 5.0))
    assert describe(notes, 5.0, None)["sounding_at_end"] == 0.5


def test_grammar_errors_counts_each_kind():
    on, off = CODEC.note_on_offset, CODEC.note_off_offset
    assert not any(grammar_errors(CODEC, [on + 60, 256, off + 60]).values())
    errs = grammar_errors(CODEC, [off + 61, on + 60, on + 60, CODEC.eos_id, 10_000])
    # the second note-on of 60 is a re-strike: counted, but it is not an error
    assert errs == {"orphan_note_off": 1, "special_token": 1, "out_of_vocab": 1, "restrike": 1}
    # a note the primer leaves sounding may be closed; without that knowledge its note-off is an orphan
    primer_open = np.zeros(128, dtype=bool)
    primer_open[62] = True
    assert grammar_errors(CODEC, [off + 62], primer_open)["orphan_note_off"] == 0
    assert grammar_errors(CODEC, [off + 62])["orphan_note_off"] == 1
    assert grammar_errors(CODEC, [on + 62], primer_open)["restrike"] == 1


def test_split_piece_and_repeat_motif():
    notes = [N(60, 1.0, 2.5), N(62, 2.0, 3.0), N(64, 3.5, 6.0), N(65, 7.0, 8.0)]
    motif, reference, cut = split_piece(notes, motif_seconds=2.0, seconds=3.0)
    assert cut == 3.0
    assert [(n.pitch, n.start, n.end) for n in motif] == [(60, 1.0, 2.5), (62, 2.0, 3.0)]
    assert [(n.pitch, n.start, n.end) for n in reference] == [(64, 0.5, 3.0)]  # clipped to the window
    rep = repeat_motif(motif, seconds=4.5)
    assert [(n.pitch, n.start) for n in rep] == [(60, 0.0), (62, 1.0), (60, 2.0), (62, 3.0), (60, 4.0)]
    assert max(n.end for n in rep) <= 4.5


# ---------------------------------------------------------------------------------------------- intervals


def test_bootstrap_interval_on_known_data():
    rng = np.random.default_rng(5)
    x = rng.normal(3.0, 1.0, size=400)
    ci = bootstrap_interval(x)
    assert ci["n"] == 400 and ci["mean"] == pytest.approx(x.mean())
    assert ci["low"] < ci["mean"] < ci["high"]
    # the standard error of a mean of 400 unit-variance values is 0.05: the 95 % half-width is ~0.098
    assert 0.08 < (ci["high"] - ci["low"]) / 2 < 0.12
    assert bootstrap_interval(x) == ci  # fixed seed: reproducible
    small = bootstrap_interval(x[:25])
    assert small["high"] - small["low"] > 3 * (ci["high"] - ci["low"])  # ~sqrt(400 / 25) = 4x wider
    assert bootstrap_interval([2.0] * 10) == {"mean": 2.0, "low": 2.0, "high": 2.0, "n": 10}
    assert bootstrap_interval([1.0, None, math.nan, 3.0])["n"] == 2  # missing values are left out
    assert bootstrap_interval([None, math.nan]) == {"mean": None, "low": None, "high": None, "n": 0}


def test_ratios_are_averaged_geometrically():
    # twice too many notes on one piece, half too few on the other: right on average
    ci = bootstrap_interval([2.0, 0.5], geometric=True)
    assert ci["mean"] == pytest.approx(1.0)
    assert ci["low"] == pytest.approx(0.5) and ci["high"] == pytest.approx(2.0)
    assert bootstrap_interval([2.0, 0.5])["mean"] == pytest.approx(1.25)  # the arithmetic mean is biased up
    # no note at all counts as 1/100 of the truth's density, not as a piece left out
    assert bootstrap_interval([0.0, 1.0, None], geometric=True)["mean"] == pytest.approx(0.1)


def test_paired_difference_sees_through_spread_between_pieces():
    base = np.linspace(0.0, 10.0, 50)  # pieces differ a lot; b is a a little better on every piece
    report = {"systems": {"a": {"per_piece": {"m": list(base + 0.1)}}, "b": {"per_piece": {"m": list(base)}}}}
    report["systems"]["a"]["per_piece"]["m"][0] = None
    d = paired_difference(report, "m", "a", "b")
    assert d["n"] == 49 and d["mean"] == pytest.approx(0.1) and d["low"] == pytest.approx(0.1)
    unpaired = bootstrap_interval(base + 0.1)
    assert unpaired["high"] - unpaired["low"] > 1.0  # the unpaired intervals overlap entirely


def test_held_out_files_reads_a_prepared_split(tmp_path):
    (tmp_path / "a.mid").write_bytes(b"")
    assert held_out_files(tmp_path) == [tmp_path / "a.mid"]  # a plain folder: its MIDI files
    files = [
        {"path": "/data/x.mid", "sha256": "0", "tokens": 5},
        {"path": "/data/y.mid", "sha256": "1", "tokens": 7},
    ]
    manifest = {"splits": {"train": {"files": []}, "test": {"files": files}}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert held_out_files(tmp_path) == [Path("/data/x.mid"), Path("/data/y.mid")]
    with pytest.raises(EvaluationError, match="val") as err:
        held_out_files(tmp_path, "val")
    assert err.value.code == "no_input"


def test_held_out_files_of_several_splits_and_one_source(tmp_path):
    def f(name, source):
        return {"path": f"/data/{name}.mid", "sha256": name, "tokens": 5, "source": source}

    splits = {
        "train": {"files": [f("t", "pop")]},
        "val": {"files": [f("v1", "pop"), f("v2", "piano")]},
        "test": {"files": [f("x1", "piano"), f("x2", "pop")]},
    }
    (tmp_path / "manifest.json").write_text(json.dumps({"splits": splits}))
    names = [p.stem for p in held_out_files(tmp_path, "test,val", source="pop")]
    assert names == ["x2", "v1"]
    assert [p.stem for p in held_out_files(tmp_path, "test,val")] == ["x1", "x2", "v1", "v2"]
    with pytest.raises(EvaluationError, match="no source 'jazz'") as err:
        held_out_files(tmp_path, "test", source="jazz")
    assert err.value.code == "no_input"
    with pytest.raises(EvaluationError, match="prepared data folder"):
        held_out_files(tmp_path / "nowhere", source="pop")


@pytest.mark.parametrize("name", ["seeds", "batch_size", "trees"])
def test_counts_below_one_are_typed_errors(name):
    with pytest.raises(EvaluationError, match=name) as err:
        EvaluationOptions(**{name: 0})
    assert err.value.code == "invalid_params"


# ---------------------------------------------------------------------------------------------- end to end


def run_small(world, **kw):
    args = dict(motif_seconds=3.0, seconds=2.0, batch_size=2, seeds=2, ngram_data=world / "data")
    return evaluate_continuations(world / "ckpt", world / "pieces", EvaluationOptions(**{**args, **kw}))


def test_evaluate_continuations_end_to_end(world, tmp_path):
    report = run_small(world)
    assert report["pieces"] == 3 and report["skipped"] == {"truncated": 1, "too_short": 1}
    assert report["seeds"] == 2 and report["left_out"] == {} and report["ngram"]["order"] >= 3
    defaults = {f.name: f.default for f in fields(SamplingParams)}
    sampling = ("temperature", "top_k", "top_p", "shift_temperature")
    assert report["sampling"] == {k: defaults[k] for k in sampling}
    rows = report["systems"]
    assert list(rows) == list(SYSTEMS)
    # every figure of every system has an interval around its mean and one value per piece (paired)
    for name, row in rows.items():
        for metric, ci in row["metrics"].items():
            values = [v for v in row["per_piece"][metric] if v is not None]
            assert len(row["per_piece"][metric]) == 3 and ci["n"] == len(values), (name, metric)
            if values:
                # a piece with no note (a tiny random model can wait 2 s) counts at the floor, as documented
                floored = np.maximum(values, GEOMETRIC_FLOOR)
                mean = np.exp(np.mean(np.log(floored))) if metric == "density_ratio" else np.mean(values)
                assert ci["low"] <= ci["mean"] <= ci["high"] and ci["mean"] == pytest.approx(mean)
    for name in ("model", "untrained", "ngram"):  # the grammar holds for every sampled system
        assert rows[name]["metrics"]["grammar_error"]["mean"] == 0.0, name
    assert "grammar_error" not in rows["repeat-motif"]["metrics"]
    # The pieces repeat a 3 s pattern, so the repeated motif and the real music reproduce the pitch classes.
    assert rows["repeat-motif"]["metrics"]["pc_overlap"]["mean"] == pytest.approx(1.0)
    assert rows["real-music"]["pieces"] == 2 and rows["real-music"]["per_piece"]["pc_overlap"][2] is None
    assert rows["real-music"]["metrics"]["ioi_overlap"]["mean"] == pytest.approx(1.0)
    assert rows["real-music"]["metrics"]["density_ratio"]["mean"] == pytest.approx(1.0)
    # the truth's own figures, beside the systems': a steady stream of single notes
    truth = report["reference"]["metrics"]
    assert truth["polyphony_max"]["mean"] == 1.0 and truth["held_share"]["mean"] == 0.0
    assert truth["density"]["mean"] == pytest.approx(4.0)
    # the longest stretch shared with the train split (its novelty index), for the truth and every system
    assert truth["copied_notes"]["n"] == 3 and truth["copied_notes"]["mean"] >= 0
    for name, row in rows.items():
        values = [v for v in row["per_piece"]["copied_notes"] if v is not None]
        assert values and all(v >= 0 for v in values), name
    assert "longest copy" in format_report(report)
    assert len(report["examples"]) == 3 and report["examples"][0]["system"] == "model"
    assert all(-3.0 <= n[1] < 0 for n in report["examples"][0]["motif"])
    assert any(m.name in report["metrics"] for m in METRICS)
    # a piano model's report is as it was: no instrument rows, no pooled instrument cases
    assert not any(m.name in report["metrics"] for m in METRICS if m.instruments)
    assert all("instrument_cases" not in row for row in rows.values())
    assert "instruments" not in format_report(report)
    d = paired_difference(report, "pc_overlap", "repeat-motif", "untrained")
    assert d["n"] == 3 and d["mean"] == pytest.approx(
        1.0 - rows["untrained"]["metrics"]["pc_overlap"]["mean"]
    )

    table = format_report(report)
    assert "repeat-motif" in table and "pitch-class overlap" in table and "truth" in table
    assert "only 3 pieces" in table
    # the threads it decoded with (a few int8 tokens differ with them): in the JSON and the table
    assert report["threads"] == torch.get_num_threads()
    assert f"({report['threads']} torch threads)" in table

    paths = write_report(report, tmp_path / "out")
    assert json.loads(paths["json"].read_text()) == report
    for key in ("metrics", "pianorolls"):
        assert paths[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and paths[key].stat().st_size > 10_000

    # the same seed gives the same numbers; --systems runs just the model, with other sampling settings
    again = run_small(world, systems=["model"])
    assert list(again["systems"]) == ["model"]
    assert again["systems"]["model"]["per_piece"] == rows["model"]["per_piece"]
    cooler = run_small(world, systems=["model"], temperature=0.5, top_k=5)
    assert cooler["sampling"]["temperature"] == 0.5 and cooler["sampling"]["top_k"] == 5
    assert cooler["systems"]["model"]["per_piece"] != rows["model"]["per_piece"]


def test_every_sampled_system_starts_at_the_cut(world):
    """A cut 0.7 s into a silence: every system that samples tokens (the model with and without the grammar,
    the untrained model, the n-gram) reads the primer up to its last event, covers the 0.7 s first, and its
    continuation's first note lands at the cut or after it."""
    notes = [N(60 + i % 5, 0.25 * i, 0.25 * i + 0.2) for i in range(10)]  # the last note-off at 2.45 s
    primer = primer_at_cut(CODEC, notes, cut=3.15)
    assert primer.tail_steps == 70 and not CODEC.is_time_shift(primer.tokens[-1])
    model = load_model(world / "ckpt")
    models = {"model": model, "untrained": model}
    ngram = NGramModel.from_prepared(world / "data", CODEC)
    jobs = [(primer, SamplingParams(seconds=2.0, seed=3, num_samples=3))]
    steps = shift_steps(CODEC)
    for name in ("model", "model-no-grammar", "untrained", "ngram"):
        for notes_out, tokens, _ in system_continuations(name, models, ngram, CODEC, jobs)[0]:
            first_event = int(np.flatnonzero(steps[tokens] == 0)[0])
            assert steps[tokens[:first_event]].sum() >= 70, name
            assert all(n.start >= 0 for n in notes_out), name
            assert steps[tokens].sum() - 70 >= 200 or len(tokens) >= jobs[0][1].token_budget(), name


def test_ngram_is_left_out_without_data_and_the_report_says_why(world):
    report = run_small(world, ngram_data=None, systems=None, limit=1)
    assert "ngram" not in report["systems"] and "prepared" in report["left_out"]["ngram"]
    assert "novelty index" in report["left_out"]["copied_notes"]  # no prepared folder, no index
    assert "copied_notes" not in report["metrics"] and "copied_notes" not in report["reference"]["metrics"]
    assert report["pieces"] == 1
    with pytest.raises(EvaluationError) as err:  # asked for by name: an error instead
        run_small(world, ngram_data=None, systems=["ngram"], limit=1)
    assert err.value.code == "no_ngram_data"
    with pytest.raises(EvaluationError) as err:
        run_small(world, systems=["model", "nope"])
    assert err.value.code == "unknown_system"


def test_cli_writes_report_and_pictures(world, tmp_path, capsys):
    argv = ["evaluate-continuations", "--checkpoint", str(world / "ckpt"), "--input", str(world / "data"),
            "--split", "train", "--motif-seconds", "3", "--seconds", "2", "--seeds", "1", "--limit", "2",
            "--systems", "ngram,repeat-motif", "--out", str(tmp_path / "out"), "--quiet"]  # fmt: skip
    assert main(argv) == 0
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    # audio/ (the examples' WAV files for report.html) only where a synthesizer and soundfont are installed
    assert [n for n in written if n != "audio"] == [
        "metrics.png",
        "pianorolls.png",
        "report.html",
        "report.json",
    ]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    # --input is a prepared folder: the n-gram is fitted on its train split by default
    assert report["ngram"]["data"] == str(world / "data") and list(report["systems"]) == [
        "ngram",
        "repeat-motif",
    ]
    assert report["split"] == "train" and report["pieces"] == 2
    out = capsys.readouterr().out
    assert "report.json" in out and "ngram" in out
    assert main([*argv[:-3], "--systems", "bogus", "--quiet"]) == 2
    assert "[unknown_system]" in capsys.readouterr().err


def test_the_truth_is_read_as_the_codec_renders_a_models_notes(world, tmp_path):
    """A velocity between the codec's bins and an onset off its 10 ms step come back, in the motif, the truth
    and the real music, as the model's notes could be: the classifier compares music, not rounding."""
    import pretty_midi

    from musicrel.evaluation.pieces import load_pieces
    from musicrel.model.checkpoint import load_model

    pm = pretty_midi.PrettyMIDI()
    inst = pretty_midi.Instrument(program=0)
    inst.notes = [pretty_midi.Note(101, 60 + i % 5, 0.2503 * i, 0.2503 * i + 0.2) for i in range(40)]
    pm.instruments.append(inst)
    pm.write(str(tmp_path / "off-grid.mid"))
    model = load_model(world / "ckpt")
    (piece,), _ = load_pieces(model, CODEC, [tmp_path / "off-grid.mid"], 3.0, 2.0, None)
    heard = CODEC.heard(inst.notes)
    assert {n.velocity for n in piece.reference} == {heard[0].velocity} != {101}
    step = CODEC.config.step_ms / 1000
    for notes in (piece.motif, piece.reference, piece.after):
        assert all(abs(n.start / step - round(n.start / step)) < 1e-6 for n in notes)
