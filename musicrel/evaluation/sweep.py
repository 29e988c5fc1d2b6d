"""Choose the sampling defaults by measurement: `evaluate-continuations` of the model alone over a grid of
temperature x top-p (x top-k), on the same pieces and seeds for every setting, so settings are compared
piece by piece (paired) rather than through intervals that mostly measure how pieces differ.

The score that ranks settings is the listener's question: how well the real-vs-generated classifier
(`musicrel.evaluation.twosample`) tells the setting's continuations from the true ones, as its ROC AUC (0.5:
it cannot tell; lower is better). Each setting's gain over the defaults is paired: the two classifiers'
out-of-fold scores resampled by the compositions both held (`twosample.auc_gain`). Where the classifier cannot
run (too few compositions to fold, no scikit-learn) the score falls back to a piece's mean of the four
histogram overlaps with the truth (pitch class, IOI, duration, velocity; higher is better), and the sweep
says which score it used and why.

A setting is eligible when its density ratio lies in DENSITY_BAND and it drones (one pitch > half the notes)
no more often than the truth does, give or take DRONE_MARGIN; the recommended one is the eligible setting with
the best score, and it replaces the current default only when its paired gain over the default is above zero
with 95 % confidence: a difference inside the noise keeps the default.

A prepared folder that mixes corpora is swept per source (`sources`): each gets its own table, never
averaged with the others, and `choose_across` picks the one setting the defaults can be.

The table's columns are the model's metrics named in TABLE_METRICS (any of
musicrel.evaluation.metrics.METRICS that evaluate-continuations reports): a new figure of the evaluation
becomes a column by adding its name there.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from musicrel.evaluation.continuations import EvaluationOptions, evaluate_continuations
from musicrel.evaluation.metrics import bootstrap_interval
from musicrel.evaluation.pieces import EvaluationError
from musicrel.evaluation.plots import plot_sweep
from musicrel.evaluation.twosample import auc_gain
from musicrel.generation.sampling import SamplingParams

SCORE_METRICS = ("pc_overlap", "ioi_overlap", "duration_overlap", "velocity_overlap")
TABLE_METRICS = (
    *SCORE_METRICS,
    "density_ratio",
    "density",
    "polyphony_mean",
    "key_corr",
    "repetition",
    "one_pitch",
)
CLASSIFIER_SCORE = "classifier AUC against the truth (0.5: cannot tell; lower is better)"
OVERLAP_SCORE = f"mean of {', '.join(SCORE_METRICS)} per piece (higher is better)"
DENSITY_BAND = (0.8, 1.25)
DRONE_MARGIN = 0.02  # share of continuations
# Down to 0.5: the page offers any temperature, and low ones were where the model droned.
TEMPERATURES = (0.5, 0.7, 0.85, 1.0)
TOP_PS = (0.95, 1.0)
SHIFT_TEMPERATURES = (1.0,)
_PERCENT = ("repetition", "one_pitch")


def _defaults() -> dict:
    d = {f.name: f.default for f in fields(SamplingParams)}
    return {k: d[k] for k in ("temperature", "top_p", "top_k", "shift_temperature")}


def _piece_scores(report: dict) -> list[float | None]:
    per_piece = report["systems"]["model"]["per_piece"]
    scores = []
    for values in zip(*(per_piece[m] for m in SCORE_METRICS), strict=True):
        ok = [v for v in values if v is not None and math.isfinite(v)]
        scores.append(sum(ok) / len(ok) if len(ok) == len(values) else None)
    return scores


def sweep_sampling(
    checkpoint,
    input_dir,
    temperatures: Sequence[float] = TEMPERATURES,
    top_ps: Sequence[float] = TOP_PS,
    top_ks: Sequence[int | None] = (None,),
    shift_temperatures: Sequence[float] = SHIFT_TEMPERATURES,
    split: str = "val",
    limit: int | None = None,
    seeds: int = 2,
    progress: bool = False,
    source: str | None = None,
    **evaluate_kwargs,
) -> dict:
    """Evaluate every (temperature, top_p, top_k, shift_temperature) of the grid plus the current defaults on
    the pieces of `split` (of one `source` of a prepared folder, if given); returns the sweep report: each
    setting's metric summaries and its paired score difference against the defaults."""
    defaults = _defaults()
    grid = [
        {"temperature": float(t), "top_p": float(p), "top_k": k, "shift_temperature": float(s)}
        for t, p, k, s in itertools.product(temperatures, top_ps, top_ks, shift_temperatures)
    ]
    if defaults not in grid:
        grid.append(defaults)
    if len(grid) < 2:
        raise EvaluationError(
            "the sweep needs at least one setting beside the defaults", code="invalid_params"
        )
    rows, scores, oofs, base = [], {}, {}, None
    for i, setting in enumerate(grid):
        if progress:
            print(f"[{i + 1}/{len(grid)}] {setting}", flush=True)
        options = EvaluationOptions(
            split=split,
            limit=limit,
            seeds=seeds,
            systems=["model"],
            source=source,
            **setting,
            **evaluate_kwargs,
        )
        report = evaluate_continuations(checkpoint, input_dir, options)
        metrics = report["systems"]["model"]["metrics"]
        key = json.dumps(setting, sort_keys=True)
        scores[key] = _piece_scores(report)
        classifier, why = _classifier(report)
        oofs[key] = classifier["oof"] if classifier else None
        row = {
            "setting": setting,
            "is_default": setting == defaults,
            "metrics": {m: metrics[m] for m in TABLE_METRICS},
            "overlaps": bootstrap_interval(scores[key]),
            "classifier": _summary(classifier, why),
        }
        rows.append(row)
        if row["is_default"]:
            base = key
        pieces, truth = report["pieces"], report["reference"]["metrics"]
    missing = [r["classifier"]["left_out"] for r in rows if "left_out" in r["classifier"]]
    by_classifier = not missing
    drone_cap = (truth["one_pitch"]["mean"] or 0.0) + DRONE_MARGIN
    for row in rows:
        key = json.dumps(row["setting"], sort_keys=True)
        if by_classifier:
            row["score"] = row["classifier"]["auc"]
            row["gain_over_default"] = auc_gain(oofs[base], oofs[key])
        else:
            row["score"] = row["overlaps"]
            pairs = zip(scores[key], scores[base], strict=True)
            row["gain_over_default"] = bootstrap_interval(
                [a - b for a, b in pairs if a is not None and b is not None]
            )
        ratio = row["metrics"]["density_ratio"]["mean"]
        drone = row["metrics"]["one_pitch"]["mean"]
        row["eligible"] = (
            ratio is not None
            and DENSITY_BAND[0] <= ratio <= DENSITY_BAND[1]
            and (drone is None or drone <= drone_cap)
        )
    best, clear = choose(rows)
    recommended = best["setting"] if clear else defaults
    return {
        "checkpoint": str(checkpoint),
        "input": str(input_dir),
        "split": split,
        "source": source,
        "pieces": pieces,
        "seeds": seeds,
        "score": CLASSIFIER_SCORE if by_classifier else OVERLAP_SCORE,
        **({} if by_classifier else {"score_fallback": f"the classifier left out: {missing[0]}"}),
        "density_band": list(DENSITY_BAND),
        "truth": {m: truth[m] for m in TABLE_METRICS if m in truth},
        "drone_cap": drone_cap,
        "defaults": defaults,
        "best": best["setting"],
        "recommended": recommended,
        "reason": (
            "the best eligible setting beats the defaults piece by piece (95 % paired interval above 0)"
            if clear
            else "no eligible setting beats the defaults beyond the noise (95 % paired interval reaches 0)"
        ),
        "settings": rows,
    }


def _classifier(report: dict) -> tuple[dict | None, str | None]:
    """The model's two-sample test in a one-source report (its only section), or None and why not."""
    two_sample = report.get("two_sample")
    if two_sample is None:
        return None, report.get("left_out", {}).get("two_sample", "no classifier in the report")
    sections = list(two_sample["sections"].values())
    if len(sections) != 1:
        return None, f"{len(sections)} sources in one sweep: sweep each source on its own (--source)"
    found = sections[0]["systems"].get("model")
    return (found, None) if found else (None, sections[0]["left_out"].get("model", "not classified"))


def _summary(classifier: dict | None, why: str | None) -> dict:
    if classifier is None:
        return {"left_out": why}
    return {
        "accuracy": classifier["accuracy"],
        "auc": classifier["auc"],
        "compositions": classifier["compositions"],
        "give_away": classifier["give_away"][:3],
    }


def choose(rows: list[dict]) -> tuple[dict, bool]:
    """The eligible row with the best paired gain over the defaults (any row if none is eligible), and
    whether that gain is above zero with 95 % confidence."""
    eligible = [r for r in rows if r["eligible"]] or rows

    def gain(r: dict) -> float:
        mean = r["gain_over_default"]["mean"]
        return -math.inf if mean is None else mean

    best = max(eligible, key=gain)
    low = best["gain_over_default"]["low"]
    return best, low is not None and low > 0


def choose_across(sweeps: Sequence[dict]) -> dict:
    """One setting for the defaults from per-source sweeps of the same grid: among the settings eligible in
    every source, the one with the best mean paired gain over the defaults (sources weigh the same, whatever
    their piece counts); it replaces the defaults only if its gain is above 0 with 95 % confidence in some
    source and below 0 with 95 % confidence in none."""
    keys = [json.dumps(r["setting"], sort_keys=True) for r in sweeps[0]["settings"]]
    by_source = [{json.dumps(r["setting"], sort_keys=True): r for r in s["settings"]} for s in sweeps]
    eligible = [k for k in keys if all(k in rows and rows[k]["eligible"] for rows in by_source)]
    defaults = sweeps[0]["defaults"]

    def gain(key: str) -> float:
        return sum(rows[key]["gain_over_default"]["mean"] or 0.0 for rows in by_source) / len(by_source)

    if not eligible:
        return {"recommended": defaults, "best": None, "reason": "no setting is eligible in every source"}
    best = max(eligible, key=gain)
    gains = [rows[best]["gain_over_default"] for rows in by_source]
    better = any(g["low"] is not None and g["low"] > 0 for g in gains)
    worse = any(g["high"] is not None and g["high"] < 0 for g in gains)
    clear = better and not worse
    return {
        "recommended": json.loads(best) if clear else defaults,
        "best": json.loads(best),
        "mean_gain": gain(best),
        "reason": (
            "eligible in every source, better beyond the noise in one at least and worse in none"
            if clear
            else "the best setting eligible in every source is not better beyond the noise, or worse in one"
        ),
    }


def format_sweep(sweep: dict) -> str:
    def cell(s: dict | None, pct: bool = False) -> str:
        if s is None or s["mean"] is None:
            return "-"
        return f"{s['mean']:.3f}" if not pct else f"{100 * s['mean']:.1f}%"

    head = [
        "T",
        "top-p",
        "top-k",
        "shift T",
        "accuracy",
        "AUC",
        "overlaps",
        "gain vs default [95 %]",
        *TABLE_METRICS,
    ]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in sweep["settings"]:
        s, g, c = r["setting"], r["gain_over_default"], r["classifier"]
        gain = "-" if g["mean"] is None else f"{g['mean']:+.3f} [{g['low']:+.3f},{g['high']:+.3f}]"
        mark = " (default)" if r["is_default"] else ""
        lines.append(
            " | ".join(
                [
                    f"{s['temperature']:g}{mark}",
                    f"{s['top_p']:g}",
                    "-" if s["top_k"] is None else str(s["top_k"]),
                    f"{s.get('shift_temperature', 1.0):g}",
                    cell(c.get("accuracy"), pct=True),
                    cell(c.get("auc")),
                    cell(r["overlaps"]),
                    gain,
                    *(cell(r["metrics"][m], pct=m in _PERCENT) for m in TABLE_METRICS),
                ]
            )
        )
    truth = sweep["truth"]
    blanks = [""] * 7
    lines.append(
        " | ".join(["truth", *blanks, *(cell(truth.get(m), pct=m in _PERCENT) for m in TABLE_METRICS)])
    )
    where = sweep["input"] + (f" source {sweep['source']}" if sweep.get("source") else "")
    lines.append(
        f"{sweep['pieces']} pieces of {where} ({sweep['split']}) x {sweep['seeds']} seeds; "
        f"score = {sweep['score']}; eligible: density ratio in {sweep['density_band']} and one pitch > half "
        f"the notes in at most {100 * sweep['drone_cap']:.0f}% of continuations (the truth's share + "
        f"{100 * DRONE_MARGIN:g})"
    )
    if "score_fallback" in sweep:
        lines.append(f"overlaps rank the settings: {sweep['score_fallback']}")
    lines.append(f"recommended: {sweep['recommended']} ({sweep['reason']})")
    return "\n".join(lines)


def write_sweep(sweep: dict, out_dir) -> dict[str, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "sweep.json", "plot": out_dir / "sweep.png"}
    paths["json"].write_text(json.dumps(sweep, indent=1, allow_nan=False) + "\n")
    plot_sweep(sweep, paths["plot"])
    return paths
