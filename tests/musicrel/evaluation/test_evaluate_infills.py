"""`evaluate_infills` and `musicrel evaluate-infills` on a tiny random-weight infill model over a few
synthetic pieces: the report's fields, the NLL both ways, the systems, the copy baseline, the CLI's files,
and the errors. What the random model writes is noise; the report's shape and the baselines are not."""

from __future__ import annotations

import json
import math

import pretty_midi
import pytest
import torch

from musicrel.cli import main
from musicrel.errors import InfillError, MusicrelError
from musicrel.evaluation.gap_classifier import END_JOIN, END_JOIN_NAMES, end_join_features
from musicrel.evaluation.gaps import InfillEvaluationError, InfillEvaluationOptions, copy_before, cut_gaps
from musicrel.evaluation.infills import SYSTEMS, evaluate_infills
from musicrel.evaluation.twosample import feature_names
from musicrel.midi.codec import EventCodec
from musicrel.model.checkpoint import save_model
from musicrel.model.config import ModelConfig
from musicrel.model.transformer import MusicTransformer
from tests.musicrel.evaluation.test_twosample import FEW_TREES
from tests.musicrel.generation.test_infill import CODEC, infill_model

OPTIONS = {"gap_seconds": "2,3", "cuts": 2, "seeds": 2, "seed": 0, "trees": FEW_TREES}


def N(pitch, start, end, velocity=80):
    return pretty_midi.Note(velocity, pitch, start, end)


def piece(k: int, seconds: float = 12.0) -> pretty_midi.PrettyMIDI:
    """A melody with a chord every second, each piece its own pattern (so each is its own composition)."""
    pm = pretty_midi.PrettyMIDI()
    inst = pretty_midi.Instrument(program=0)
    for i in range(int(seconds * 4)):
        t = 0.25 * i
        inst.notes.append(
            N(60 + (i * (k + 2) + k) % 12 + 12 * (i % 3 == k % 3), t, t + 0.2, 60 + (i * 7) % 40)
        )
        if i % 4 == 0:
            inst.notes.append(N(48 + (i // 4 * (k + 1)) % 7, t, t + 0.9))
    pm.instruments.append(inst)
    return pm


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("infills")
    save_model(infill_model(max_seq_len=256), tmp / "ckpt", codec=CODEC)
    torch.manual_seed(0)
    plain = EventCodec()
    cfg = ModelConfig(
        vocab_size=plain.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=128
    )
    save_model(MusicTransformer(cfg), tmp / "plain", codec=plain)
    pieces = tmp / "pieces"
    pieces.mkdir()
    for k in range(5):
        piece(k).write(str(pieces / f"p{k}.mid"))
    piece(9, seconds=3.0).write(str(pieces / "short.mid"))  # no room for a gap with music either side
    yield tmp
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def report(world):
    return evaluate_infills(world / "ckpt", world / "pieces", InfillEvaluationOptions(**OPTIONS))


def test_copy_before_is_the_stretch_before_moved_into_the_gap():
    notes = [N(60, 1.0, 1.5), N(62, 2.5, 4.5), N(64, 3.9, 4.2), N(65, 4.0, 4.5), N(67, 6.5, 7.0)]
    # the gap [4, 6.5): the 2.5 s before it, [1.5, 4), hold the 62 and the 64
    out = copy_before(notes, 4.0, 2.5)
    assert [(n.pitch, round(n.start, 6), round(n.end, 6)) for n in out] == [(62, 1.0, 2.5), (64, 2.4, 2.5)]
    assert copy_before(notes, 1.0, 0.5) == []


def test_gaps_are_cut_the_same_way_from_the_same_seed_and_fit():
    options = InfillEvaluationOptions(gap_seconds="2,3", cuts=3)
    notes = CODEC.to_notes(piece(1))
    gaps = cut_gaps(notes, 7, options)
    assert [(g.start, g.end) for g in gaps] == [(g.start, g.end) for g in cut_gaps(notes, 7, options)]
    assert [(g.start, g.end) for g in gaps] != [(g.start, g.end) for g in cut_gaps(notes, 8, options)]
    assert len(gaps) == 3
    for g in gaps:
        assert 2.0 <= g.seconds <= 3.0 + 0.011
        assert g.start >= min(n.start for n in notes) + g.seconds - 0.011  # a whole stretch to copy
        assert g.truth and g.after and g.before
        assert all(0 <= n.start < g.seconds and n.end <= g.seconds for n in g.truth)
        assert all(n.start < 0 and n.end <= 0 for n in g.before)
    assert [g.start for g in gaps] == sorted(g.start for g in gaps)  # one per stretch of the piece


def test_end_join_features_read_how_the_gap_leads_on():
    gap = [N(60, 0.0, 0.5), N(64, 1.5, 1.8)]
    after = [N(67, 0.25, 0.5), N(55, 2.0, 2.5)]
    cols = dict(zip(END_JOIN_NAMES, end_join_features(gap, after, 2.0), strict=True))
    assert cols[f"{END_JOIN}: silence before the end (s)"] == pytest.approx(0.2)
    assert cols[f"{END_JOIN}: onset gap across the end (s)"] == pytest.approx(0.75)
    assert cols[f"{END_JOIN}: pitch step to what follows"] == pytest.approx(3.0)  # 67 after 64
    assert all(math.isnan(x) for x in end_join_features([], after, 2.0))


def test_the_report_has_the_nll_both_ways_the_systems_and_the_speed(report):
    assert report["pieces"] == 5 and report["skipped"] == {"too_short": 1}
    assert set(report["systems"]) == set(SYSTEMS) == {"infill", "continuation", "copy-before"}
    assert len(report["gaps"]) == 10 and report["gap_seconds"] == [2.0, 3.0]
    [(source, section)] = report["sources"].items()
    assert source == "all" and section["pieces"] == 5 and section["gaps"] == 10
    nll = section["nll"]
    assert {"with_future", "past_only"} <= set(nll)
    for key in ("with_future", "past_only"):
        assert 0 < nll[key] < 3 * nll["uniform"]
        assert nll["intervals"][key]["low"] <= nll[key] <= nll["intervals"][key]["high"]
        assert len(nll["per_piece"][key]) == 5
    assert nll["difference"]["mean"] == pytest.approx(nll["past_only"] - nll["with_future"], abs=1e-5)
    for name in SYSTEMS:
        s = section["systems"][name]
        assert s["pieces"] == 5 and s["gaps"] == 10
        assert s["metrics"]["pc_overlap"]["mean"] is not None
        assert ("grammar_error" in s["metrics"]) == (name != "copy-before")
    assert set(section["systems"]["infill"]["paired"]) == {"continuation", "copy-before"}
    assert "copied_notes" not in report["metrics"] and "key_corr" in section["reference"]["metrics"]
    assert section["systems"]["infill"]["metrics"]["grammar_error"]["mean"] == 0.0
    for name in ("infill", "continuation"):
        speed = report["speed"][name]
        assert speed["batch"] == 1 and speed["samples"] == 20 and speed["events"] > 0
        assert speed["events_per_second"] > 0 and speed["real_time_factor"] > 0
        assert speed["gap_seconds"] == pytest.approx(2 * sum(g["end"] - g["start"] for g in report["gaps"]))
    json.dumps(report, allow_nan=False)


def test_the_classifier_sees_the_gap_s_end_as_a_family(report):
    two = report["two_sample"]
    assert two["features"] == feature_names() + END_JOIN_NAMES
    section = two["sections"]["all"]
    assert set(section["systems"]) == set(SYSTEMS)
    for result in section["systems"].values():
        assert END_JOIN in {g["family"] for g in result["give_away"]}
        assert 0 <= result["auc"]["mean"] <= 1
    assert set(section["gain"]) == {"continuation", "copy-before"}
    assert feature_names()[-1].startswith("join:")  # twosample's own columns, unchanged after the test


def test_the_copy_baseline_is_what_it_says(report):
    assert len(report["examples"]) == 3
    for ex in report["examples"]:
        notes = CODEC.heard(CODEC.to_notes(CODEC.read(ex["file"])))  # as the codec renders the fillings
        copied = copy_before(notes, ex["start"], ex["end"] - ex["start"])
        assert ex["systems"]["copy-before"] == [
            [n.pitch, round(n.start, 3), round(n.end, 3), n.velocity] for n in copied
        ]
        # it is the music just before the gap, one gap's length later
        length = ex["end"] - ex["start"]
        before = sorted((p, round(s + length, 2)) for p, s, _, _ in ex["before"] if s >= -length - 1e-9)
        assert sorted((p, round(s, 2)) for p, s, _, _ in ex["systems"]["copy-before"]) == before
        assert all(0 <= s < length for _, s, _, _ in ex["truth"])
        assert all(s >= length for _, s, _, _ in ex["after"])


def test_the_command_writes_report_json_and_html(world, tmp_path, capsys):
    out = tmp_path / "report"
    argv = ["evaluate-infills", "--checkpoint", str(world / "ckpt"), "--input", str(world / "pieces")]
    # 3 pieces: too few to fold, so the classifier (tested on the report fixture) is left out: it was 4/5
    # of this test's time
    argv += ["--out", str(out), "--gap-seconds", "2,3", "--cuts", "1", "--seeds", "1", "--limit", "3"]
    assert main([*argv, "--quiet", "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    assert "true gap's NLL" in printed and "copy-before" in printed and "events/s" in printed
    data = json.loads((out / "report.json").read_text())
    assert (
        data["pieces"] == 3
        and data["seeds"] == 1
        and set(data["sources"]["all"]["nll"])
        >= {
            "with_future",
            "past_only",
        }
    )
    assert data["two_sample"]["sections"]["all"]["systems"] == {}  # too few to fold, as said above
    page = (out / "report.html").read_text()
    assert page.count('class="gap"') == 4 * len(data["examples"])  # truth + 3 systems per example
    assert "Would a listener notice?" in page


@pytest.mark.parametrize(
    ("options", "code"),
    [
        ({"gap_seconds": "8,4"}, "invalid_gap_seconds"),
        ({"gap_seconds": "a,b"}, "invalid_gap_seconds"),
        ({"gap_seconds": "4,40"}, "invalid_gap_seconds"),
        ({"gap_seconds": 0}, "invalid_gap_seconds"),
        ({"cuts": 0}, "invalid_params"),
        ({"seeds": True}, "invalid_params"),
        ({"limit": 0}, "invalid_params"),
        ({"trees": 0}, "invalid_params"),
    ],
)
def test_bad_options_are_typed_errors(options, code):
    with pytest.raises(InfillEvaluationError) as err:
        InfillEvaluationOptions(**options)
    assert err.value.code == code and isinstance(err.value, MusicrelError)


def test_models_and_inputs_that_cannot_be_used(world, tmp_path, capsys):
    with pytest.raises(InfillError) as err:
        evaluate_infills(world / "plain", world / "pieces", InfillEvaluationOptions(**OPTIONS))
    assert err.value.code == "model_cannot_infill"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InfillEvaluationError) as err:
        evaluate_infills(world / "ckpt", empty, InfillEvaluationOptions(**OPTIONS))
    assert err.value.code == "no_input"
    argv = ["evaluate-infills", "--checkpoint", str(world / "ckpt"), "--input", str(world / "pieces")]
    assert main([*argv, "--gap-seconds", "9,3", "--quiet"]) == 2
    line = capsys.readouterr().err.strip().splitlines()
    assert line == [line[0]] and "error [invalid_gap_seconds]" in line[0]
    assert (
        main(["evaluate-infills", "--checkpoint", str(tmp_path / "none"), "--input", str(empty), "--quiet"])
        == 2
    )
    assert "error [checkpoint_missing]" in capsys.readouterr().err
