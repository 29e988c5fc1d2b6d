"""Evaluation per instrument (musicrel.evaluation.ensemble): the continuity and groove figures and the
classifier's `instruments` family on hand-made note lists whose answers are known, then evaluate-continuations
end to end with a tiny model whose codec has instruments (a band with drums, a drums-only piece)."""

from __future__ import annotations

import math

import numpy as np
import pretty_midi
import pytest
import torch

from musicrel.evaluation.continuation_systems import repeat_motif, repeat_parts
from musicrel.evaluation.ensemble import (
    CLASSES,
    HEAD_SECONDS,
    continuity,
    continuity_cases,
    drum_groove,
    drum_kit,
    feature_names,
    features,
    midi_parts,
    pitched,
)
from musicrel.evaluation.metrics import grammar_errors
from musicrel.midi.codec import CodecConfig, EventCodec
from musicrel.midi.instruments import DRUMS
from tests.musicrel.evaluation.conftest import N

BASS, VIOLIN, CELLO, FLUTE, PIANO = 33, 40, 42, 73, 0
BAND = EventCodec(CodecConfig(instruments=True))


def beats(times, pitch=38, length=0.1):
    return [N(pitch, t, t + length) for t in times]


# ---------------------------------------------------------------------------------------------- continuity


def test_continuity_counts_the_motifs_last_instruments_that_the_truth_plays():
    context = {  # times relative to the cut
        VIOLIN: [N(76, -3.0, -1.0)],
        CELLO: [N(36, -8.0, -6.0)],  # silent over the last 5 s: no case
        BASS: [N(40, -6.0, -0.5)],  # struck before the last 5 s, sounding into them: a case
        DRUMS: beats([-1.0]),  # the truth lets the drums rest: no case
    }
    truth = {VIOLIN: [N(77, 0.5, 1.0)], BASS: [N(40, 2.0, 3.0)], FLUTE: [N(80, 0.0, 1.0)]}
    generated = {VIOLIN: [N(74, 0.2, 0.4)], DRUMS: beats([0.0, 0.5])}
    assert continuity_cases(context, truth, generated) == (2, 1)  # violin and bass; the violin kept
    assert continuity(context, truth, generated) == 0.5
    # everything the truth plays, and more: every case kept
    assert continuity(context, truth, {**truth, DRUMS: beats([0.0])}) == 1.0
    # an instrument that waits past the first 10 s is not kept
    late = {VIOLIN: [N(74, HEAD_SECONDS, HEAD_SECONDS + 1)], BASS: [N(40, 9.99, 10.5)]}
    assert continuity_cases(context, truth, late) == (2, 1)
    # no case (the truth plays none of the motif's last instruments): no value, not a perfect score
    assert math.isnan(continuity(context, {FLUTE: [N(80, 0.0, 1.0)]}, generated))


def test_drum_groove_is_the_overlap_of_drum_onset_intervals():
    truth = {DRUMS: beats([0.0, 0.25, 0.5, 0.75, 1.0]), BASS: [N(40, 0.0, 1.0)]}
    assert drum_groove(truth, truth) == 1.0
    # half of the intervals 0.25 s (the truth's), half 0.5 s; a kick and a snare struck together are one onset
    half = {DRUMS: beats([0.0, 0.25, 0.5, 1.0, 1.5]) + beats([0.0], pitch=36)}
    assert drum_groove(half, truth) == pytest.approx(0.5)
    assert drum_groove({BASS: [N(40, 0.0, 1.0)]}, truth) == 0.0  # the drums dropped
    # no groove to keep: no drums, or a single hit, in the truth
    assert math.isnan(drum_groove(half, {BASS: [N(40, 0.0, 1.0)]}))
    assert math.isnan(drum_groove(half, {DRUMS: beats([0.5])}))


def test_drum_kit_is_the_overlap_of_drum_keys():
    truth = {DRUMS: beats([0.0, 0.5], pitch=36) + beats([0.25, 0.75], pitch=38), BASS: [N(40, 0.0, 1.0)]}
    assert drum_kit(truth, truth) == 1.0
    # the same groove on another snare (40 for 38): half the hits on the truth's keys
    other = {DRUMS: beats([0.0, 0.5], pitch=36) + beats([0.25, 0.75], pitch=40)}
    assert drum_kit(other, truth) == pytest.approx(0.5)
    assert drum_kit({BASS: [N(40, 0.0, 1.0)]}, truth) == 0.0  # the drums dropped
    assert math.isnan(drum_kit(other, {BASS: [N(40, 0.0, 1.0)]}))  # no kit to keep


def test_repeat_parts_keeps_every_instrument_on_the_motifs_period():
    motif = {BASS: [N(40, -2.0, -1.5)], DRUMS: beats([-1.5, -1.0], length=0.1)}  # the motif spans 1.1 s
    out = repeat_parts(motif, 3.0)
    assert set(out) == {BASS, DRUMS}
    assert [round(n.start, 3) for n in out[BASS]] == [0.0, 1.1, 2.2]
    assert [round(n.start, 3) for n in out[DRUMS]] == [0.5, 1.0, 1.6, 2.1, 2.7]
    # one instrument alone is the piano's baseline
    assert [n.start for n in repeat_parts({PIANO: motif[BASS]}, 3.0)[PIANO]] == [
        n.start for n in repeat_motif(motif[BASS], 3.0)
    ]


def test_parts_of_a_rendered_file_and_the_pitched_notes():
    pm = pretty_midi.PrettyMIDI()
    for program, drum, pitch in ((VIOLIN, False, 76), (VIOLIN, False, 67), (0, True, 38), (CELLO, False, 36)):
        inst = pretty_midi.Instrument(program=program, is_drum=drum)
        inst.notes = [N(pitch, 0.5, 1.0)] if pitch != 67 else [N(pitch, 0.0, 1.0)]
        pm.instruments.append(inst)
    pm.instruments.append(pretty_midi.Instrument(program=FLUTE))  # a track with no note: no part
    parts = midi_parts(pm)
    assert list(parts) == [VIOLIN, CELLO, DRUMS]  # two violin tracks are one instrument, as the codec reads
    assert [n.pitch for n in parts[VIOLIN]] == [67, 76]
    assert [n.pitch for n in pitched(parts)] == [67, 36, 76]  # by (start, pitch), the drums aside


# -------------------------------------------------------------------------------------------- the classifier


def test_instrument_features_on_a_known_continuation():
    names = feature_names()
    assert all(n.startswith("instruments: ") for n in names)
    context = {VIOLIN: [N(76, -2.0, -1.0)], CELLO: [N(36, -9.0, -8.0)], DRUMS: beats([-0.5])}
    generated = {
        VIOLIN: [N(72, 0.0, 0.5), N(76, 1.0, 1.5)],
        CELLO: [N(40, 0.0, 2.0)],
        FLUTE: [N(84, 0.5, 1.0)],
        DRUMS: beats([0.0, 0.5, 1.0, 1.0]),
    }
    x = dict(zip(names, features(generated, context, 2.0), strict=True))
    assert len(x) == len(names) == 3 + 3 * len(CLASSES) + 2 + 12
    assert x["instruments: how many play"] == 4
    assert x["instruments: motif's kept"] == 1.0  # the violin and the drums sounded in the last 5 s
    assert x["instruments: new"] == 1  # the flute
    # violin and cello are one General MIDI class (Strings): 3 notes in 2 s, mean pitch 62.67
    assert x["instruments: Strings plays"] == 1 and x["instruments: Strings notes/s"] == 1.5
    assert x["instruments: Strings mean pitch"] == pytest.approx((72 + 76 + 40) / 3)
    assert x["instruments: Pipe plays"] == 1 and x["instruments: Pipe mean pitch"] == 84
    assert x["instruments: Guitar plays"] == 0 and math.isnan(x["instruments: Guitar mean pitch"])
    assert x["instruments: drums play"] == 1 and x["instruments: drum onsets/s"] == 1.5  # 3 distinct onsets
    assert x["instruments: drum IOI 0.35-0.5 s"] == 0 and x["instruments: drum IOI 0.5-0.7 s"] == 1.0
    silent = dict(zip(names, features({}, {}, 2.0), strict=True))
    assert silent["instruments: how many play"] == 0 and math.isnan(silent["instruments: motif's kept"])


def _band(rng, drums: bool) -> tuple[dict, dict]:
    """(context, continuation): a bass line and, if `drums`, a steady groove; the bass alike either way."""
    bass = [N(int(rng.integers(36, 48)), t, t + 0.4) for t in np.arange(0.0, 4.0, 0.5)]
    context = {BASS: [N(40, t - 4.0, t - 3.6) for t in np.arange(0.0, 4.0, 0.5)], DRUMS: beats([-0.5, -0.25])}
    continuation = {BASS: bass}
    if drums:
        continuation[DRUMS] = beats(np.arange(0.0, 4.0, 0.25))
    return context, continuation


def test_the_instruments_family_tells_a_continuation_that_drops_the_drums():
    """The pitched notes are alike on both sides; only the drums differ: the classifier with the instruments
    family tells them apart, and names that family; without parts its columns are the piano's."""
    from musicrel.evaluation.twosample import feature_names as all_names
    from musicrel.evaluation.twosample import two_sample
    from tests.musicrel.evaluation.test_twosample import FEW_TREES

    rng = np.random.default_rng(0)
    contexts, truths, systems = [], [], []
    for _ in range(12):
        context, truth = _band(rng, drums=True)
        contexts.append(context)
        truths.append(truth)
        systems.append([_band(rng, drums=False)[1]])
    result = two_sample(
        [pitched(c) for c in contexts],
        [pitched(t) for t in truths],
        {"model": [[pitched(s) for s in runs] for runs in systems]},
        4.0,
        [None] * 12,
        parts={"contexts": contexts, "truths": truths, "systems": {"model": systems}},
        trees=FEW_TREES,
    )
    assert result["features"] == all_names() + feature_names() == all_names(instruments=True)
    model = result["sections"]["all"]["systems"]["model"]
    assert model["auc"]["mean"] > 0.9
    assert model["give_away"][0]["family"] == "instruments" and model["give_away"][0]["auc_alone"] > 0.9
    assert {g["family"]: g["auc_alone"] for g in model["give_away"]}["register"] < 0.8


# ---------------------------------------------------------------------------------------------- the grammar


def test_grammar_errors_read_each_instruments_notes():
    on, off = BAND.note_on_offset, BAND.note_off_offset
    violin, piano = BAND.instrument_offset + VIOLIN, BAND.instrument_offset + PIANO
    primer = np.array([BAND.bos_id, violin, on + 60, piano, on + 64])  # both sounding, the piano current
    # the violin's 60 closed after switching to it: no error; the piano's 60 never sounded: an orphan
    tokens = np.array([violin, off + 60, piano, off + 60, off + 64, on + 64, on + 64])
    counts = grammar_errors(BAND, tokens, primer=primer)
    assert counts == {"orphan_note_off": 1, "special_token": 0, "out_of_vocab": 0, "restrike": 1}
    # without the primer the violin's note-off is an orphan too
    assert grammar_errors(BAND, tokens)["orphan_note_off"] == 3
    # a piano codec reads as before: the sounding pitches given
    piano_codec = EventCodec()
    sounding = np.zeros(128, dtype=bool)
    sounding[60] = True
    plain = np.array([piano_codec.note_off_offset + 60, piano_codec.note_off_offset + 60])
    assert grammar_errors(piano_codec, plain, sounding)["orphan_note_off"] == 1


# ---------------------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def band_world(tmp_path_factory):
    """A tiny random checkpoint with the instruments codec and five pieces: bass + drums (+ a violin in two),
    and a drums-only one."""
    from musicrel.model.checkpoint import save_model
    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import MusicTransformer

    tmp = tmp_path_factory.mktemp("band")
    torch.manual_seed(1)
    cfg = ModelConfig(vocab_size=BAND.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=256)
    save_model(MusicTransformer(cfg), tmp / "ckpt", codec=BAND)
    pieces = tmp / "pieces"
    pieces.mkdir()
    for k in range(5):
        pm = pretty_midi.PrettyMIDI()
        drums = pretty_midi.Instrument(program=0, is_drum=True, name="Drums")
        drums.notes = [N(36 if i % 2 == 0 else 38, 0.25 * i, 0.25 * i + 0.1, 90) for i in range(28)]
        pm.instruments.append(drums)
        if k < 4:
            bass = pretty_midi.Instrument(program=BASS, name="Bass")
            bass.notes = [N(36 + (i * (k + 2)) % 12, 0.5 * i, 0.5 * i + 0.4) for i in range(14)]
            pm.instruments.append(bass)
        if k % 2:
            violin = pretty_midi.Instrument(program=VIOLIN, name="Violin")
            violin.notes = [N(72 + i % 5, 1.0 * i, 1.0 * i + 0.9, 70) for i in range(7)]
            pm.instruments.append(violin)
        pm.write(str(pieces / f"band{k}.mid"))
    return tmp


def test_evaluate_continuations_per_instrument(band_world):
    from musicrel.evaluation.continuations import EvaluationOptions, evaluate_continuations
    from musicrel.evaluation.report import format_report
    from tests.musicrel.evaluation.test_twosample import FEW_TREES

    systems = ["model", "repeat-motif"]
    options = EvaluationOptions(motif_seconds=3.0, seconds=2.0, seeds=2, systems=systems, trees=FEW_TREES)
    report = evaluate_continuations(band_world / "ckpt", band_world / "pieces", options)
    assert report["pieces"] == 5 and report["skipped"] == {}  # the drums-only piece is continued too
    rows = report["systems"]
    for name in ("instrument_continuity", "drum_groove"):
        assert name in report["metrics"] and not report["metrics"][name]["reference"]
    # The repeated motif keeps every instrument (continuity 1) and its groove is the truth's (a steady beat).
    repeat = rows["repeat-motif"]
    assert repeat["metrics"]["instrument_continuity"]["mean"] == 1.0
    assert repeat["metrics"]["drum_groove"]["mean"] == pytest.approx(1.0)
    # bass, drums, and the violin in two pieces: 4 x 2 + 2 + 1 cases, each once (one run of the baseline)
    assert repeat["instrument_cases"] == {"cases": 11, "kept": 11, "share": 1.0}
    model = rows["model"]
    assert model["instrument_cases"]["cases"] == 22  # the same cases, for each of two seeds
    assert 0 <= model["instrument_cases"]["kept"] <= 22
    assert all(v is None or 0 <= v <= 1 for v in model["per_piece"]["instrument_continuity"])
    assert model["metrics"]["grammar_error"]["mean"] == 0.0  # read per instrument, the primer's notes open
    # the drums-only piece: no pitched note in its truth, so no figure compares pitched notes; its drums
    # are scored, and so is what it plays besides them (none: 0 notes/s)
    for name in ("pc_overlap", "ioi_overlap", "range_diff", "density_ratio"):
        assert rows["repeat-motif"]["per_piece"][name][4] is None, name
        assert rows["model"]["per_piece"][name][4] is None, name
    assert rows["repeat-motif"]["per_piece"]["density"][4] == 0.0
    assert rows["repeat-motif"]["per_piece"]["pc_overlap"][0] == pytest.approx(1.0)  # a bass line repeated
    assert rows["repeat-motif"]["per_piece"]["drum_groove"][4] == pytest.approx(1.0)
    # the classifier reads the instruments family
    assert report["two_sample"]["features"][-1].startswith("instruments: ")
    section = report["two_sample"]["sections"]["all"]
    assert {g["family"] for g in section["systems"]["model"]["give_away"]} >= {"instruments", "join"}
    table = format_report(report)
    assert "motif's instruments kept" in table and "repeat-motif 11/11 (100%)" in table
    # the examples carry the drum hits (the pitched rows leave them out): the rolls draw them on a lane
    for ex in report["examples"]:
        drums = ex["drums"]
        assert drums["motif"] and drums["truth"] and set(drums["continuations"]) == {"model", "repeat-motif"}
        assert drums["continuations"]["repeat-motif"]
        assert drums["continuation"] == drums["continuations"]["model"]


def test_evaluate_infills_with_instruments_scores_the_pitched_notes_and_reads_who_plays(tmp_path):
    """A model with instruments and infill tokens (random, tiny): the gaps are cut from and scored on the
    pitched notes of every instrument (no drum hit among them), and neither the infill nor the continuation
    breaks the grammar, read per instrument from the tokens before them (scored as one piano stream they
    broke it at every gap). Each gap is also read by instrument: who keeps playing, the drums' groove (the
    copied bars keep both: a steady band), the continuity cases pooled, and the classifier's `instruments`
    family. A drums-only file has no pitched note: its gap is placed by the drums and scored by them."""
    from musicrel.evaluation.gap_classifier import END_JOIN_NAMES, gap_features
    from musicrel.evaluation.gaps import InfillEvaluationOptions, load_infill_pieces
    from musicrel.evaluation.infill_report import format_infill_report
    from musicrel.evaluation.infills import SYSTEMS, evaluate_infills
    from musicrel.evaluation.twosample import feature_names as two_sample_names
    from musicrel.model.checkpoint import save_model
    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import MusicTransformer
    from tests.musicrel.evaluation.test_twosample import FEW_TREES

    both = EventCodec(CodecConfig(instruments=True, infill=True))
    torch.manual_seed(2)
    cfg = ModelConfig(vocab_size=both.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=256)
    save_model(MusicTransformer(cfg), tmp_path / "ckpt", codec=both)
    pieces = tmp_path / "pieces"
    pieces.mkdir()
    hats = {42, 46}
    for k in range(5):
        pm = pretty_midi.PrettyMIDI()
        drums = pretty_midi.Instrument(program=0, is_drum=True, name="Drums")
        drums.notes = [N(42 if i % 2 else 46, 0.25 * i, 0.25 * i + 0.1, 90) for i in range(56)]
        bass = pretty_midi.Instrument(program=BASS, name="Bass")
        bass.notes = [N(28 + (i * (k + 2)) % 12, 0.5 * i, 0.5 * i + 0.4) for i in range(28)]
        violin = pretty_midi.Instrument(program=VIOLIN, name="Violin")
        violin.notes = [N(60 + (i * (k + 3)) % 12, 1.0 * i, 1.0 * i + 0.9, 70) for i in range(14)]
        pm.instruments += [drums, bass, violin] if k else [drums]  # the first: drums alone
        pm.write(str(pieces / f"band{k}.mid"))
    options = InfillEvaluationOptions(gap_seconds="2,3", cuts=1, seeds=1, seed=0, trees=FEW_TREES)
    files = sorted(pieces.glob("*.mid"))
    read, gaps, skipped = load_infill_pieces(both, files, options)
    assert skipped == {} and len(read) == 5 and len(gaps) == 5
    assert all(DRUMS in p.parts and not {n.pitch for n in p.notes} & hats for p in read)
    assert not read[0].notes and not gaps[0].truth and set(gaps[0].parts.truth) == {DRUMS}  # drums alone
    assert gaps[0].parts.truth[DRUMS] and gaps[0].parts.before[DRUMS] and gaps[0].parts.copy[DRUMS]
    assert all(g.truth and not {n.pitch for n in g.truth} & hats for g in gaps[1:])
    for g in gaps[1:]:  # by instrument: the same cut, the drums kept
        assert set(g.parts.truth) == set(g.parts.before) == set(g.parts.copy) == {BASS, VIOLIN, DRUMS}
        as_tuples = [(n.start, n.end, n.pitch, n.velocity) for n in pitched(g.parts.truth)]
        assert as_tuples == sorted((n.start, n.end, n.pitch, n.velocity) for n in g.truth)
        assert {n.pitch for n in g.parts.truth[DRUMS]} <= hats
        assert all(n.end <= 0 for ns in g.parts.before.values() for n in ns)
        width = len(two_sample_names()) + len(END_JOIN_NAMES)
        assert len(gap_features(g.truth, g)) == width
        assert len(gap_features(g.truth, g, g.parts.truth)) == width + len(feature_names())
    report = evaluate_infills(tmp_path / "ckpt", pieces, options)
    [(_, section)] = report["sources"].items()
    for system in ("infill", "continuation"):
        assert section["systems"][system]["metrics"]["grammar_error"]["mean"] == 0.0, system
    assert {"instrument_continuity", "drum_groove"} <= set(report["metrics"])
    copied = section["systems"]["copy-before"]
    # 4 band gaps x 3 instruments, and the drums alone
    assert copied["instrument_cases"] == {"cases": 13, "kept": 13, "share": 1.0}
    assert copied["metrics"]["drum_groove"]["mean"] == pytest.approx(1.0)
    assert copied["per_piece"]["pc_overlap"][0] is None  # no pitched note to compare
    assert copied["per_piece"]["drum_groove"][0] == pytest.approx(1.0) and copied["pieces"] == 5
    for system in ("infill", "continuation"):
        cases = section["systems"][system]["instrument_cases"]
        assert cases["cases"] == 13 and 0 <= cases["kept"] <= 13, system
        assert all(0 <= v <= 1 for v in section["systems"][system]["per_piece"]["drum_groove"]), system
    assert "drum_groove" in section["systems"]["infill"]["paired"]["copy-before"]
    # the classifier (5 pieces: enough to fold) reads the instruments family after the gap's own
    assert report["two_sample"]["features"][-len(feature_names()) :] == feature_names()
    assert set(report["two_sample"]["sections"]["all"]["systems"]) == set(SYSTEMS)
    pooled = "motif's instruments kept, over all cases (gap x seed x instrument): "
    assert pooled in format_infill_report(report)
