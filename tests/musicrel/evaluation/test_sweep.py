from __future__ import annotations

import json

import pytest

from musicrel.cli import main
from musicrel.evaluation.sweep import (
    CLASSIFIER_SCORE,
    OVERLAP_SCORE,
    TABLE_METRICS,
    _defaults,
    choose,
    choose_across,
    format_sweep,
    sweep_sampling,
)


def row(gain, gain_low, ratio, default=False):
    return {
        "setting": {"temperature": gain},
        "is_default": default,
        "gain_over_default": {"mean": gain, "low": gain_low},
        "eligible": 0.8 <= ratio <= 1.25,
    }


def test_choose_needs_a_clear_gain_inside_the_density_band():
    default = row(0.0, 0.0, 1.0, default=True)
    better = row(0.05, 0.01, 1.1)
    too_dense = row(0.20, 0.10, 1.6)  # gains most, but plays 1.6x the notes: not eligible
    assert choose([default, better, too_dense]) == (better, True)
    noisy = row(0.05, -0.01, 1.1)  # better on average, but the paired interval reaches 0
    assert choose([default, noisy]) == (noisy, False)
    # nothing in the band: the best gain, judged the same way
    assert choose([row(0.0, 0.0, 2.0, True), row(0.1, 0.02, 1.5)])[1] is True


def _source(rows: dict) -> dict:
    """A per-source sweep of settings named by temperature: {t: (eligible, gain low, mean, high)}."""
    return {
        "defaults": {"temperature": 1.0},
        "settings": [
            {
                "setting": {"temperature": t},
                "eligible": ok,
                "gain_over_default": {"low": low, "mean": mean, "high": high},
            }
            for t, (ok, low, mean, high) in rows.items()
        ],
    }


def test_choose_across_sources_needs_eligibility_everywhere_and_no_clear_loss():
    base = (True, 0.0, 0.0, 0.0)
    pop = _source({1.0: base, 0.9: (True, 0.01, 0.02, 0.03), 0.7: (True, 0.02, 0.06, 0.08)})
    piano = _source({1.0: base, 0.9: (True, -0.01, 0.0, 0.01), 0.7: (False, 0.0, 0.04, 0.06)})
    choice = choose_across([pop, piano])
    # 0.7 gains most but is not eligible on the piano: 0.9, clear on POP909 and no worse on the piano
    assert choice["recommended"] == {"temperature": 0.9} and choice["best"] == {"temperature": 0.9}
    worse = _source({1.0: base, 0.9: (True, 0.0, 0.01, 0.02), 0.7: (True, -0.03, -0.02, -0.01)})
    choice = choose_across([pop, worse])
    # 0.7 has the best mean gain but loses beyond the noise in one source: the defaults stay
    assert choice["best"] == {"temperature": 0.7} and choice["recommended"] == {"temperature": 1.0}


def test_sweep_compares_every_setting_with_the_defaults_on_the_same_pieces(world, tmp_path, capsys):  # noqa: F811
    sweep = sweep_sampling(
        world / "ckpt",
        world / "pieces",
        temperatures=(0.5, 1.0),
        top_ps=(1.0,),
        seeds=1,
        motif_seconds=3.0,
        seconds=2.0,
    )
    settings = [r["setting"] for r in sweep["settings"]]
    grid = [{"temperature": t, "top_p": 1.0, "top_k": None, "shift_temperature": 1.0} for t in (0.5, 1.0)]
    assert settings[:2] == grid
    assert settings[-1] == _defaults() and sum(r["is_default"] for r in sweep["settings"]) == 1
    base = next(r for r in sweep["settings"] if r["is_default"])
    assert base["gain_over_default"] == {"mean": 0.0, "low": 0.0, "high": 0.0, "n": sweep["pieces"]}
    best, clear = choose(sweep["settings"])
    assert sweep["best"] == best["setting"]
    assert sweep["recommended"] == (best["setting"] if clear else _defaults())
    assert 0.0 <= sweep["truth"]["one_pitch"]["mean"] <= 1.0
    assert "one_pitch" in sweep["settings"][0]["metrics"]
    # two pieces are too few to fold: the overlaps rank the settings, and the sweep says why
    assert sweep["score"] == OVERLAP_SCORE and "too few" in sweep["score_fallback"]
    for r in sweep["settings"]:
        assert r["score"] == r["overlaps"] and "left_out" in r["classifier"]
        assert 0.0 <= r["score"]["mean"] <= 1.0
        assert r["score"]["low"] <= r["score"]["mean"] <= r["score"]["high"]

    # the command: a table, sweep.json and sweep.png
    argv = [
        "sweep-sampling",
        "--checkpoint",
        str(world / "ckpt"),
        "--input",
        str(world / "pieces"),
        "--temperatures",
        "0.7",
        "--top-ps",
        "0.9",
        "--top-ks",
        "none,5",
        "--shift-temperatures",
        "1,1.2",
        "--seeds",
        "1",
        "--out",
        str(tmp_path),
        "--quiet",
        "--motif-seconds",
        "3",
        "--seconds",
        "2",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "recommended:" in out and "(default)" in out
    saved = json.loads((tmp_path / "sweep.json").read_text())
    kinds = [(r["setting"]["top_k"], r["setting"]["shift_temperature"]) for r in saved["settings"]]
    assert kinds[:4] == [(None, 1.0), (None, 1.2), (5, 1.0), (5, 1.2)]
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_cli_refuses_bad_grids(capsys):
    with pytest.raises(SystemExit):
        main(["sweep-sampling", "--checkpoint", "x", "--input", "y", "--top-ks", "0"])
    assert "top-k values are integers >= 1" in capsys.readouterr().err


def test_sweep_cli_sweeps_each_source_and_chooses_across_them(tmp_path, monkeypatch, capsys):
    import musicrel.evaluation.sweep as sweep_module

    base = (True, 0.0, 0.0, 0.0)
    fake = {
        "pop909": _source({1.0: base, 0.9: (True, 0.01, 0.02, 0.03)}),
        "music21": _source({1.0: base, 0.9: (True, -0.01, 0.01, 0.02)}),
    }
    calls, written = [], []

    def sweep_sampling(*args, source, **kwargs):
        calls.append(source)
        return fake[source]

    monkeypatch.setattr(sweep_module, "sweep_sampling", sweep_sampling)
    monkeypatch.setattr(sweep_module, "format_sweep", lambda sweep: "table")
    monkeypatch.setattr(sweep_module, "write_sweep", lambda sweep, out: written.append(out) or {})
    argv = ["sweep-sampling", "--checkpoint", "x", "--input", "y", "--source", "pop909,music21"]
    assert main([*argv, "--out", str(tmp_path), "--quiet"]) == 0
    assert calls == ["pop909", "music21"] and written == [tmp_path / "pop909", tmp_path / "music21"]
    choice = json.loads((tmp_path / "choice.json").read_text())
    assert choice["sources"] == ["pop909", "music21"] and choice["recommended"] == {"temperature": 0.9}
    assert "source pop909" in capsys.readouterr().out


def test_the_classifier_ranks_the_settings_where_it_can_run(monkeypatch):
    """Reports of three settings whose continuations a real classifier sees: the default drones (told apart at
    once), T 0.9 is drawn like the truth, T 0.8 too but outside the density band. The sweep ranks by the
    classifier's AUC, pairs each setting with the defaults by composition, and recommends T 0.9."""
    import numpy as np

    import musicrel.evaluation.sweep as sweep_module
    from musicrel.evaluation.twosample import classify, features
    from tests.musicrel.evaluation.test_twosample import FEW_TREES, SECONDS, drone, melody, world

    rng, contexts, truths = world(40)
    truth_x = np.stack([features(t, c, SECONDS) for t, c in zip(truths, contexts, strict=True)])
    comps = [f"c{i // 2}" for i in range(40)]

    def report(temperature: float, **kwargs) -> dict:
        if temperature == 1.0:
            runs = [np.stack([features(drone(truths[i]), contexts[i], SECONDS)]) for i in range(40)]
        else:
            runs = [np.stack([features(melody(rng), contexts[i], SECONDS)]) for i in range(40)]
        ratio = 2.0 if temperature == 0.8 else 1.0
        stat = {"mean": 0.5, "low": 0.4, "high": 0.6, "n": 40}
        metrics = {m: dict(stat) for m in TABLE_METRICS}
        metrics["density_ratio"] = {"mean": ratio, "low": ratio, "high": ratio, "n": 40}
        metrics["one_pitch"] = {"mean": 0.0, "low": 0.0, "high": 0.0, "n": 40}
        per_piece = {m: [0.5] * 40 for m in sweep_module.SCORE_METRICS}
        section = {
            "systems": {"model": classify(truth_x, runs, compositions=comps, trees=FEW_TREES)},
            "left_out": {},
        }
        return {
            "pieces": 40,
            "systems": {"model": {"metrics": metrics, "per_piece": per_piece}},
            "reference": {"metrics": metrics},
            "two_sample": {"sections": {"pop909": section}},
        }

    def evaluate(checkpoint, input_dir, options):
        return report(options.temperature)

    monkeypatch.setattr(sweep_module, "evaluate_continuations", evaluate)
    sweep = sweep_sampling("ckpt", "pieces", temperatures=(0.8, 0.9), top_ps=(0.95,), source="pop909")
    assert sweep["score"] == CLASSIFIER_SCORE and "score_fallback" not in sweep
    rows = {r["setting"]["temperature"]: r for r in sweep["settings"]}
    assert rows[1.0]["is_default"] and rows[1.0]["score"]["mean"] > 0.9  # the drone: told apart
    assert rows[0.9]["score"] == rows[0.9]["classifier"]["auc"] and rows[0.9]["score"]["mean"] < 0.75
    assert rows[0.9]["gain_over_default"]["low"] > 0 and rows[0.9]["gain_over_default"]["n"] == 20
    assert rows[1.0]["gain_over_default"]["mean"] == 0.0
    assert not rows[0.8]["eligible"]  # as good, but plays twice the notes
    assert sweep["recommended"] == {
        "temperature": 0.9,
        "top_p": 0.95,
        "top_k": None,
        "shift_temperature": 1.0,
    }
    table = format_sweep(sweep)
    assert "accuracy | AUC" in table and "recommended: {'temperature': 0.9" in table
