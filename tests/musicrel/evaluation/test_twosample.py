"""The real-vs-generated classifier (musicrel.evaluation.twosample) on note lists with known answers: a system
drawn like the truth sits near chance, a drone is caught and the features that give it away are named, sources
stay apart, a piece's rows never straddle a split; then inside evaluate-continuations on a two-source
folder."""

from __future__ import annotations

import math
import os
import re
import wave

import numpy as np
import pretty_midi
import pytest
import torch

from musicrel.evaluation.twosample import (
    FAMILIES,
    MIN_PIECES,
    TwoSampleUnavailable,
    _auc,
    auc_gain,
    classify,
    feature_names,
    features,
    format_two_sample,
    two_sample,
)

SECONDS = 4.0
# The forest of the tests that call classify on a few dozen rows: their verdicts (chance, the drone, the
# folds, the pairing) are those of the product's TREES, at a quarter of the fits.
FEW_TREES = 25


def N(pitch, start, end, velocity=80):
    return pretty_midi.Note(velocity, pitch, start, end)


def melody(rng, start: float = 0.0, seconds: float = SECONDS, center: int = 64) -> list:
    """A random walk in C major, eighth notes with some quarters: what every 'piece' here is made of."""
    scale = [0, 2, 4, 5, 7, 9, 11]
    notes, t, step = [], start, int(rng.integers(0, 7))
    while t < start + seconds - 1e-9:
        step += int(rng.choice([-2, -1, 1, 2]))
        pitch = center - 12 + 12 * (step // 7) + scale[step % 7] + 12
        dur = float(rng.choice([0.25, 0.25, 0.5]))
        notes.append(
            N(int(np.clip(pitch, 40, 90)), t, min(t + dur * 0.9, start + seconds), int(rng.integers(60, 100)))
        )
        t += dur
    return notes


def drone(truth: list) -> list:
    """The truth's rhythm on one pitch: what a collapsed sampler plays."""
    return [N(57, n.start, n.end, n.velocity) for n in truth]


def world(pieces: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    contexts = [melody(rng, -SECONDS) for _ in range(pieces)]
    truths = [melody(rng) for _ in range(pieces)]
    return rng, contexts, truths


def test_features_name_every_column_and_survive_no_notes():
    rng, contexts, truths = world(1)
    x = features(truths[0], contexts[0], SECONDS)
    names = feature_names()
    assert x.shape == (len(names),) and np.isfinite(x).all()
    assert {n.split(":")[0] for n in names} == set(FAMILIES)
    empty = features([], contexts[0], SECONDS)
    assert empty.shape == x.shape and empty[names.index("density: notes/s")] == 0.0
    assert math.isnan(empty[names.index("register: mean pitch")])
    # a drone: one pitch for every note, no interval but unison
    d = features(drone(truths[0]), contexts[0], SECONDS)
    assert d[names.index("self-repetition: top pitch share")] == 1.0
    assert d[names.index("interval: 0-1 st")] == 1.0
    # the join: a continuation starting an octave above where the context ended
    up = [N(n.pitch + 12, n.start, n.end) for n in contexts[0] if n.start >= -1.0]
    moved = [N(n.pitch, n.start + 1.0, n.end + 1.0) for n in up]
    assert features(moved, contexts[0], SECONDS)[names.index("join: pitch step at the cut")] == pytest.approx(
        12
    )


def test_a_system_drawn_like_the_truth_is_near_chance_and_a_drone_is_caught():
    rng, contexts, truths = world(40)
    truth_x = np.stack([features(t, c, SECONDS) for t, c in zip(truths, contexts, strict=True)])
    same = [np.stack([features(melody(rng), contexts[i], SECONDS) for _ in range(2)]) for i in range(40)]
    r = classify(truth_x, same, trees=FEW_TREES)
    assert r["pieces"] == 40 and r["samples"] == 80 and r["folds"] == 5
    assert r["accuracy"]["low"] <= 0.5 + 0.05 and r["accuracy"]["mean"] < 0.65
    assert r["accuracy"]["low"] <= r["accuracy"]["mean"] <= r["accuracy"]["high"]
    droned = [np.stack([features(drone(truths[i]), contexts[i], SECONDS)]) for i in range(40)]
    r = classify(truth_x, droned, trees=FEW_TREES)
    assert r["accuracy"]["mean"] > 0.95 and r["auc"]["low"] > 0.9
    # the rhythm is the truth's own: pitch alone gives it away, rhythm alone tells nothing
    alone = {g["family"]: g["auc_alone"] for g in r["give_away"]}
    assert set(alone) == set(FAMILIES)
    assert r["give_away"][0]["family"] in ("pitch class", "interval", "register", "self-repetition")
    assert r["give_away"][0]["auc_alone"] > 0.9 and alone["IOI"] < 0.7 and alone["duration"] < 0.7
    top = r["top_features"][0]
    assert top["name"].split(":")[0] != "IOI" and top["system"] != top["truth"]


def test_auc_gain_pairs_two_runs_by_composition():
    rng, contexts, truths = world(40)
    truth_x = np.stack([features(t, c, SECONDS) for t, c in zip(truths, contexts, strict=True)])
    same = [np.stack([features(melody(rng), contexts[i], SECONDS) for _ in range(2)]) for i in range(40)]
    droned = [np.stack([features(drone(truths[i]), contexts[i], SECONDS)]) for i in range(40)]
    comps = [f"c{i // 2}" for i in range(40)]  # two pieces a composition
    near = classify(truth_x, same, compositions=comps, trees=FEW_TREES)
    far = classify(truth_x, droned, compositions=comps, trees=FEW_TREES)
    # the out-of-fold scores: a row per truth and per sample, named by composition
    oof = far["oof"]
    assert len(oof["p"]) == len(oof["y"]) == len(oof["w"]) == len(oof["composition"]) == 40 + 40
    assert set(oof["composition"]) == set(comps) and sum(oof["y"]) == 40
    assert _auc(np.array(oof["y"]), np.array(oof["p"]), np.array(oof["w"])) == pytest.approx(
        far["auc"]["mean"], abs=1e-3
    )
    # the drone is told apart far better than the system drawn like the truth: a clear gain, either way round
    gain = auc_gain(far["oof"], near["oof"])
    assert gain["n"] == 20 and gain["mean"] > 0.3 and gain["low"] > 0
    assert auc_gain(near["oof"], far["oof"])["high"] < 0
    assert auc_gain(far["oof"], far["oof"]) == {"mean": 0.0, "low": 0.0, "high": 0.0, "n": 20}
    other = dict(oof, composition=[c + "x" for c in oof["composition"]])
    assert auc_gain(far["oof"], other)["n"] == 0  # nothing shared: no figure


def test_sources_are_separate_sections_and_real_music_joins_the_truth():
    rng, contexts, truths = world(16, seed=1)
    sources = ["pop"] * 8 + ["bach"] * 8
    # pop's system drones, bach's plays like the truth: pooled, they would read as one middling figure
    systems = {
        "model": [[drone(truths[i])] if i < 8 else [melody(rng)] for i in range(16)],
        # the stretch after the truth: real music on both sides, joined to what precedes it (the truth)
        "real-music": [[melody(rng)] for _ in range(16)],
        "sparse": [[melody(rng)] if i in (0, 9) else [] for i in range(16)],
    }
    real_ctx = {"real-music": [[N(n.pitch, n.start - SECONDS, n.end - SECONDS) for n in t] for t in truths]}
    result = two_sample(contexts, truths, systems, SECONDS, sources, real_contexts=real_ctx, trees=FEW_TREES)
    assert list(result["sections"]) == ["pop", "bach"]
    pop, bach = result["sections"]["pop"], result["sections"]["bach"]
    assert pop["pieces"] == bach["pieces"] == 8
    assert pop["systems"]["model"]["accuracy"]["mean"] > 0.9
    assert bach["systems"]["model"]["accuracy"]["mean"] < 0.8
    assert "sparse" not in pop["systems"] and pop["left_out"]["sparse"].startswith(
        f"1 compositions with continuations (< {MIN_PIECES})"
    )
    lines = "\n".join(format_two_sample(result))
    assert "pop (8 pieces)" in lines and "bach (8 pieces)" in lines and "left out" in lines
    # unknown sources: one section (a system too sparse to fold: the sections, without a classifier to fit)
    unknown = two_sample(contexts, truths, {"sparse": systems["sparse"]}, SECONDS, [None] * 16)["sections"]
    assert list(unknown) == ["all"] and unknown["all"]["pieces"] == 16
    assert "sparse" in unknown["all"]["left_out"]


def test_weighted_auc_matches_scikit_learn():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(4, 40))
        y = np.r_[0.0, 1.0, rng.integers(0, 2, n - 2)]
        p, w = np.round(rng.random(n), 1), rng.random(n)  # rounded: ties count half
        assert _auc(y, p, w) == pytest.approx(roc_auc_score(y, p, sample_weight=w), abs=1e-12)
    assert math.isnan(_auc(np.zeros(3), np.ones(3), np.ones(3)))


def test_a_piece_never_sits_on_both_sides_of_a_split(monkeypatch):
    """Each piece's system rows copy its truth with a tiny twist. Split by sample, a forest would find a
    piece's twin in training; split by piece it must learn the twist itself. The GroupKFold actually used
    keeps every piece's rows in one fold."""
    from sklearn import model_selection

    seen = []
    real = model_selection.GroupKFold.split

    def spy(self, X, y, groups):
        for train, test in real(self, X, y, groups):
            seen.append((set(groups[train]), set(groups[test])))
            yield train, test

    monkeypatch.setattr(model_selection.GroupKFold, "split", spy)
    rng, contexts, truths = world(10, seed=2)
    truth_x = np.stack([features(t, c, SECONDS) for t, c in zip(truths, contexts, strict=True)])
    samples = [np.stack([truth_x[i] + 0.0, truth_x[i] + 0.0, truth_x[i]]) for i in range(10)]
    r = classify(truth_x, samples, trees=FEW_TREES)
    assert len(seen) == 5 and all(train.isdisjoint(test) for train, test in seen)
    assert set().union(*(test for _, test in seen)) == set(range(10))
    # identical rows on both sides: nothing to learn, whatever the weights
    assert r["auc"]["mean"] == pytest.approx(0.5, abs=0.1)
    # two performances of one composition (pieces 0 and 1) are one group: never on both sides either
    seen.clear()
    comps = ["bwv846", "bwv846", *(f"c{i}" for i in range(2, 10))]
    r = classify(truth_x, samples, compositions=comps, trees=FEW_TREES)
    assert r["compositions"] == 9 and r["pieces"] == 10
    assert (
        all(train.isdisjoint(test) for train, test in seen) and len(set().union(*(t for _, t in seen))) == 9
    )


def test_without_scikit_learn_the_test_is_left_out_with_the_reason(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_sklearn(name, *args, **kw):
        if name == "sklearn" or name.startswith("sklearn."):
            raise ImportError("No module named 'sklearn'")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_sklearn)
    _, contexts, truths = world(4)
    with pytest.raises(TwoSampleUnavailable, match="musicrel\\[eval\\]") as err:
        two_sample(contexts, truths, {"model": [[t] for t in truths]}, SECONDS, [None] * 4)
    assert err.value.code == "two_sample_unavailable"


# ------------------------------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory):
    """A tiny random checkpoint and a prepared folder of two sources (steady eighths; slow chords)."""
    from musicrel.midi.codec import EventCodec
    from musicrel.model.checkpoint import save_model
    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import MusicTransformer
    from training.prepare import prepare

    codec = EventCodec()
    tmp = tmp_path_factory.mktemp("twosample")
    torch.manual_seed(1)
    cfg = ModelConfig(
        vocab_size=codec.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=128
    )
    save_model(MusicTransformer(cfg), tmp / "ckpt", codec=codec)
    rng = np.random.default_rng(0)
    for name, center in (("eighths", 64), ("low", 48)):
        folder = tmp / name
        folder.mkdir()
        for k in range(6):
            pm = pretty_midi.PrettyMIDI()
            inst = pretty_midi.Instrument(program=0)
            inst.notes = melody(rng, 0.0, 8.0, center)
            pm.instruments.append(inst)
            pm.write(str(folder / f"{name}{k}.mid"))
    prepare(
        [f"eighths={tmp / 'eighths'}", f"low={tmp / 'low'}"],
        tmp / "data",
        codec=codec,
        workers=1,
        progress=False,
    )
    return tmp


@pytest.fixture(scope="module")
def report(two_sources):
    from musicrel.evaluation.continuations import EvaluationOptions, evaluate_continuations

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        options = EvaluationOptions(
            motif_seconds=3.0, seconds=2.0, seeds=2, split="train,val,test",
            systems=["untrained", "repeat-motif", "real-music"], trees=FEW_TREES,
        )  # fmt: skip
        return evaluate_continuations(two_sources / "ckpt", two_sources / "data", options)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.long(9)  # with its module's evaluation
def test_evaluate_continuations_reports_the_classifier_per_source(report):
    from musicrel.evaluation.report import format_report

    sections = report["two_sample"]["sections"]
    assert sorted(sections) == ["eighths", "low"] and sum(s["pieces"] for s in sections.values()) == 12
    for source, section in sections.items():
        assert sorted(section["systems"]) == ["real-music", "repeat-motif", "untrained"], source
        untrained = section["systems"]["untrained"]
        assert untrained["samples"] == 2 * untrained["pieces"]  # every seed is a row
        for r in section["systems"].values():
            for stat in ("accuracy", "auc"):
                assert 0 <= r[stat]["low"] <= r[stat]["mean"] <= r[stat]["high"] <= 1
    # random weights play nothing like a melody: the forest tells them apart on either source
    assert all(s["systems"]["untrained"]["accuracy"]["mean"] >= 0.8 for s in sections.values())
    # every system's first continuation rides in the examples, for report.html to play
    assert set(report["examples"][0]["continuations"]) == {"untrained", "repeat-motif", "real-music"}
    table = format_report(report)
    assert "real vs generated" in table and "eighths (6 pieces)" in table and "low (6 pieces)" in table
    # a prepared folder: the folds keep the versions its manifest lists (none among these melodies)
    grouping = report["two_sample"]["grouping"]
    assert (grouping["method"], grouping["files"], grouping["compositions"]) == ("manifest", 12, 12)
    assert "folds by composition: 12 files in 12 compositions (versions from the prepared folder's" in table


# ------------------------------------------------------------------------------------------ report.html


def _require_audio() -> None:
    from musicrel.evaluation.report_html import AudioUnavailable, find_soundfont, synthesize

    try:
        synthesize([[60, 0.0, 0.2, 80]], find_soundfont())
    except AudioUnavailable as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(str(exc))  # CI must render audio, never skip it silently
        pytest.skip(f"{exc} (make audio installs it)")


@pytest.fixture(scope="module")
def written(report, tmp_path_factory):
    from musicrel.evaluation.report import write_report

    _require_audio()
    return write_report(report, tmp_path_factory.mktemp("report"))


def test_report_html_has_rolls_and_audio_that_open_offline(report, written):
    page = written["html"].read_text()
    examples = report["examples"]
    lines = len(examples) * (1 + len(report["systems"]))  # motif + truth, then motif + each system
    assert len(examples) == 4 and page.count('<svg class="roll"') == lines
    sources = re.findall(r'src="([^"]+)"', page)
    assert len([s for s in sources if s.endswith(".wav")]) == lines
    for src in sources:  # every file is beside the page, named relatively: no server, no network
        assert not re.match(r"[a-z]+:", src) and (written["html"].parent / src).is_file(), src
    for wav in (written["html"].parent / "audio").glob("*.wav"):
        with wave.open(str(wav)) as w:  # motif (3 s) + continuation (<= 2 s) and the synth's release
            assert 3.0 <= w.getnframes() / w.getframerate() <= 8.0, wav
            assert np.abs(np.frombuffer(w.readframes(w.getnframes()), np.int16)).max() > 1000, wav
    assert "eighths" in page and "low" in page and "untrained" in page and "metrics.png" in page
    assert "folds by composition: 12 files in 12 compositions" in page


def test_report_html_in_a_real_browser(written):
    from tests.server.conftest import CHROMIUM, CHROMIUM_ARGS, _require_chromium

    _require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(written["html"].as_uri())
            # every player has loaded its file and knows how long it is
            page.wait_for_function(
                "Array.from(document.querySelectorAll('audio'))"
                ".every(a => a.readyState >= 1 && a.duration > 0)",
                timeout=20_000,
            )
            durations = page.eval_on_selector_all("audio", "els => els.map(a => a.duration)")
            assert len(durations) == 16 and all(3.0 <= d <= 8.0 for d in durations)
            rolls = page.locator("svg.roll")
            assert rolls.count() == 16
            for i in range(rolls.count()):
                box = rolls.nth(i).bounding_box()
                assert box and box["width"] > 100 and box["height"] > 50
            notes = page.eval_on_selector_all(
                "svg.roll", "els => els.map(e => e.querySelectorAll('rect').length)"
            )
            assert all(n > 1 for n in notes)  # the background and at least one note
            images = page.eval_on_selector_all("img", "els => els.map(i => i.naturalWidth)")
            assert len(images) == 2 and all(w > 0 for w in images)
            assert errors == []
        finally:
            browser.close()


def test_file_sources_reads_sources_and_versions_of_one_composition(tmp_path):
    import json

    from musicrel.evaluation.pieces import file_sources

    files = [
        {"path": f"/m/{n}.mid", "source": src} for n, src in (("a1", "asap"), ("a2", "asap"), ("p", "pop"))
    ]
    manifest = {
        "splits": {"test": {"files": files[:2]}, "val": {"files": files[2:]}},
        "compositions": {"multi_file": [{"split": "test", "files": ["/m/a1.mid", "/m/a2.mid"]}]},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    sources, compositions = file_sources(tmp_path)
    assert sources == {"/m/a1.mid": "asap", "/m/a2.mid": "asap", "/m/p.mid": "pop"}
    # two performances of one piece share a composition; a piece with no other version is not listed
    assert compositions == {"/m/a1.mid": "/m/a1.mid", "/m/a2.mid": "/m/a1.mid"}
    assert file_sources(tmp_path / "plain") == ({}, {})


# ------------------------------------------------------------------------------ folds by composition


def tune(seed: int, n: int = 100) -> list[int]:
    """A random walk of pitches with wide steps: two seeds give two unrelated tunes."""
    rng = np.random.default_rng(seed)
    return [int(p) for p in 60 + np.cumsum(rng.choice([-5, -3, -2, -1, 1, 2, 3, 4, 7], size=n)) % 24]


def write_tune(path, pitches, transpose=0, beat=0.25, jitter=0.0, seed=0) -> None:
    """One file of the tune: transposed, at another tempo, with onsets jittered and velocities varied (a
    performance) if asked."""
    rng = np.random.default_rng(seed)
    pm = pretty_midi.PrettyMIDI()
    inst = pretty_midi.Instrument(program=0)
    for i, p in enumerate(pitches):
        t = max(0.0, i * beat + (rng.uniform(-jitter, jitter) if jitter else 0.0))
        velocity = int(rng.integers(45, 110)) if jitter else 80
        inst.notes.append(pretty_midi.Note(velocity, p + transpose, t, t + 0.8 * beat))
    pm.instruments.append(inst)
    pm.write(str(path))


VERSIONS = ("a_score.mid", "a_transposed.mid", "a_performed.mid")


@pytest.fixture(scope="module")
def versions_folder(tmp_path_factory):
    """A tiny random checkpoint and a plain folder (no manifest) of 9 files: three versions of one tune (as
    written, a fourth up, slower and performed) and six unrelated tunes."""
    from musicrel.midi.codec import EventCodec
    from musicrel.model.checkpoint import save_model
    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import MusicTransformer

    codec = EventCodec()
    tmp = tmp_path_factory.mktemp("versions")
    torch.manual_seed(1)
    cfg = ModelConfig(
        vocab_size=codec.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=128
    )
    save_model(MusicTransformer(cfg), tmp / "ckpt", codec=codec)
    folder = tmp / "midi"
    folder.mkdir()
    a = tune(1)
    write_tune(folder / VERSIONS[0], a)
    write_tune(folder / VERSIONS[1], a, transpose=5)
    write_tune(folder / VERSIONS[2], a, beat=0.28, jitter=0.03, seed=3)
    for k in range(6):
        write_tune(folder / f"other{k}.mid", tune(10 + k), transpose=k % 3)
    return tmp


def test_a_plain_folder_groups_the_versions_of_a_composition_from_their_notes(versions_folder):
    from musicrel.evaluation.pieces import piece_compositions
    from musicrel.midi.codec import EventCodec

    folder = versions_folder / "midi"
    paths = sorted(str(p) for p in folder.glob("*.mid"))
    comps, grouping = piece_compositions(EventCodec(), folder, paths)
    by_name = {os.path.basename(p): c for p, c in zip(paths, comps, strict=True)}
    assert len({by_name[v] for v in VERSIONS}) == 1  # one composition, named by its first version's path
    assert by_name["a_performed.mid"] in paths
    assert len(set(comps)) == 7 and len({by_name[f"other{k}.mid"] for k in range(6)}) == 6
    assert grouping["method"] == "notes" and grouping["files"] == 9 and grouping["compositions"] == 7
    assert [sorted(os.path.basename(p) for p in m) for m in grouping["multi_file"]] == [sorted(VERSIONS)]


def test_a_prepared_folder_keeps_the_manifests_groups(tmp_path, monkeypatch):
    import json

    from musicrel.evaluation import pieces
    from musicrel.midi.codec import EventCodec

    def not_here(*args, **kw):
        raise AssertionError("a prepared folder's groups come from its manifest")

    monkeypatch.setattr(pieces, "group_versions", not_here)
    files = [{"path": f"/m/{n}.mid", "source": "asap"} for n in ("a1", "a2", "b")]
    manifest = {
        "splits": {"test": {"files": files}},
        "compositions": {"multi_file": [{"split": "test", "files": ["/m/a1.mid", "/m/a2.mid"]}]},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    comps, grouping = pieces.piece_compositions(EventCodec(), tmp_path, [f["path"] for f in files])
    assert comps == ["/m/a1.mid", "/m/a1.mid", "/m/b.mid"]
    assert grouping == {
        "method": "manifest", "files": 3, "compositions": 2, "multi_file": [["/m/a1.mid", "/m/a2.mid"]],
    }  # fmt: skip


def test_versions_of_one_composition_never_fall_into_different_folds(versions_folder, monkeypatch):
    """evaluate-continuations on a plain folder: every fold holds all three versions of the tune or none,
    and the console and report.json say how many files and compositions the folds held."""
    from sklearn import model_selection

    from musicrel.evaluation.continuations import EvaluationOptions, evaluate_continuations
    from musicrel.evaluation.report import format_report

    folds: list[list[np.ndarray]] = []  # per classify call, the test rows of each fold
    real = model_selection.GroupKFold.split

    def spy(self, X, y, groups):
        folds.append([])
        for train, test in real(self, X, y, groups):
            folds[-1].append(test)
            yield train, test

    monkeypatch.setattr(model_selection.GroupKFold, "split", spy)
    options = EvaluationOptions(
        motif_seconds=3.0, seconds=2.0, seeds=1, systems=["repeat-motif", "real-music"], trees=FEW_TREES
    )
    report = evaluate_continuations(versions_folder / "ckpt", versions_folder / "midi", options)
    names = [os.path.basename(f) for f in report["files"]]
    assert sorted(names) == sorted([*VERSIONS, *(f"other{k}.mid" for k in range(6))])
    assert len(folds) == 2  # one cross-validation per system
    for per_system in folds:
        assert len(per_system) == 5
        # classify's first rows are the truths of the pieces, in the report's order (every piece has a sample)
        fold_of = {names[r]: k for k, test in enumerate(per_system) for r in test if r < len(names)}
        assert len(fold_of) == 9 and len({fold_of[v] for v in VERSIONS}) == 1
    grouping = report["two_sample"]["grouping"]
    assert (grouping["method"], grouping["files"], grouping["compositions"]) == ("notes", 9, 7)
    systems = report["two_sample"]["sections"]["all"]["systems"]
    for r in systems.values():
        assert (r["pieces"], r["compositions"], r["folds"]) == (9, 7, 5)
    table = format_report(report)
    assert "folds by composition: 9 files in 7 compositions" in table
    assert "(7 compositions, 5 folds)" in table


def test_without_datasketch_a_plain_folder_leaves_the_classifier_out_with_the_reason(
    versions_folder, monkeypatch
):
    from musicrel.data.compositions import CompositionsUnavailable
    from musicrel.evaluation import continuations, pieces

    def unavailable(sets):
        raise CompositionsUnavailable("datasketch is not installed: pip install 'musicrel[eval]'")

    monkeypatch.setattr(pieces, "group_versions", unavailable)
    options = continuations.EvaluationOptions(
        motif_seconds=3.0, seconds=2.0, seeds=1, systems=["repeat-motif"]
    )
    report = continuations.evaluate_continuations(versions_folder / "ckpt", versions_folder / "midi", options)
    assert "two_sample" not in report and "datasketch" in report["left_out"]["two_sample"]


def test_fewer_compositions_fewer_folds_and_too_few_are_left_out():
    _, contexts, truths = world(8, seed=4)
    truth_x = np.stack([features(t, c, SECONDS) for t, c in zip(truths, contexts, strict=True)])
    samples = [truth_x[i : i + 1] + 0.0 for i in range(8)]
    # 4 compositions of 2 files
    r = classify(truth_x, samples, compositions=[k // 2 for k in range(8)], trees=FEW_TREES)
    assert (r["pieces"], r["compositions"], r["folds"]) == (8, 4, 4)
    systems = {"drone": [[drone(t)] for t in truths]}
    section = two_sample(
        contexts, truths, systems, SECONDS, [None] * 8, compositions=[k // 3 for k in range(8)]
    )
    assert section["sections"]["all"]["left_out"]["drone"] == (
        f"3 compositions with continuations (< {MIN_PIECES}) in 8 files: too few to fold"
    )


def test_a_score_and_its_notes_through_the_codec_read_alike():
    """The features see the music, not the codec's rounding: a score's notes (an eighth of 0.25 s sits on a
    duration bin's edge) read as the codec renders them, and again, give the same features; and a length
    read as the difference of two 10 ms steps (0.25 +- 1e-16) falls in the bin of its exact value."""
    from musicrel.midi.codec import EventCodec

    codec = EventCodec()
    rng = np.random.default_rng(0)
    lengths = [0.25, 0.5, 0.125, 1 / 6, 1.0, 0.375]
    notes, t = [], 0.0
    for _ in range(60):
        d = float(rng.choice(lengths))
        notes.append(pretty_midi.Note(int(rng.integers(30, 120)), int(rng.integers(48, 80)), t, t + d))
        t += d
    heard = codec.heard(notes)
    context = [pretty_midi.Note(80, 60, -1.0, -0.5)]
    assert np.array_equal(features(heard, context, 10.0), features(codec.heard(heard), context, 10.0))
    steps = [pretty_midi.Note(80, 60, k * 0.01, (k + 25) * 0.01) for k in range(100, 200)]
    exact = [pretty_midi.Note(80, 60, 1.0, 1.25)] * len(steps)
    assert {round(n.end - n.start, 20) for n in steps} != {0.25}  # the float noise is there
    assert np.array_equal(features(steps, context, 10.0)[35:49], features(exact, context, 10.0)[35:49])
