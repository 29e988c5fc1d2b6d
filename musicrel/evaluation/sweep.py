"""Choose the sampling defaults by measurement: `evaluate-continuations` of the model alone over a grid of
temperature x top-p (x top-k), on the same pieces and seeds for every setting, so settings are compared
piece by piece (paired) rather than through intervals that mostly measure how pieces differ.

The score that ranks settings is a piece's mean of the four histogram overlaps with the truth (pitch class,
IOI, duration, velocity: each in 0..1, higher is better). A setting is eligible when its density ratio lies
in DENSITY_BAND and it drones (one pitch > half the notes) no more often than the truth does, give or take
DRONE_MARGIN; the recommended one is the eligible setting with the best score, and it replaces the current
default only when its paired gain over the default is above zero with 95 % confidence: a difference inside
the noise keeps the default.

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

from musicrel.evaluation.continuations import EvaluationError, EvaluationOptions, evaluate_continuations
from musicrel.evaluation.metrics import bootstrap_interval
from musicrel.evaluation.plots import plot_sweep
from musicrel.generation.sampling import SamplingParams

SCORE_METRICS = ("pc_overlap", "ioi_overlap", "duration_overlap", "velocity_overlap")
TABLE_METRICS = (*SCORE_METRICS, "range_diff", "density_ratio", "key_corr", "repetition", "one_pitch")
DENSITY_BAND = (0.8, 1.25)
DRONE_MARGIN = 0.02  # share of continuations
# Down to 0.5: the page offers any temperature, and low ones were where the model droned.
TEMPERATURES = (0.5, 0.7, 0.85, 1.0)
TOP_PS = (0.95, 1.0)
_PERCENT = ("repetition", "one_pitch")


def _defaults() -> dict:
    d = {f.name: f.default for f in fields(SamplingParams)}
    return {"temperature": d["temperature"], "top_p": d["top_p"], "top_k": d["top_k"]}


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
    split: str = "val",
    limit: int | None = None,
    seeds: int = 2,
    progress: bool = False,
    source: str | None = None,
    **evaluate_kwargs,
) -> dict:
    """Evaluate every (temperature, top_p, top_k) of the grid plus the current defaults on the pieces of
    `split` (of one `source` of a prepared folder, if given); returns the sweep report: each setting's metric
    summaries and its paired score difference against the defaults."""
    defaults = _defaults()
    grid = [
        {"temperature": float(t), "top_p": float(p), "top_k": k}
        for t, p, k in itertools.product(temperatures, top_ps, top_ks)
    ]
    if defaults not in grid:
        grid.append(defaults)
    if len(grid) < 2:
        raise EvaluationError(
            "the sweep needs at least one setting beside the defaults", code="invalid_params"
        )
    rows, scores, base = [], {}, None
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
        row = {
            "setting": setting,
            "is_default": setting == defaults,
            "metrics": {m: metrics[m] for m in TABLE_METRICS},
            "score": bootstrap_interval(scores[key]),
        }
        rows.append(row)
        if row["is_default"]:
            base = key
        pieces, truth = report["pieces"], report["reference"]["metrics"]
    drone_cap = (truth["one_pitch"]["mean"] or 0.0) + DRONE_MARGIN
    for row in rows:
        key = json.dumps(row["setting"], sort_keys=True)
        row["gain_over_default"] = bootstrap_interval(
            [a - b for a, b in zip(scores[key], scores[base], strict=True) if a is not None and b is not None]
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
        "score": f"mean of {', '.join(SCORE_METRICS)} per piece",
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


def choose(rows: list[dict]) -> tuple[dict, bool]:
    """The best-scoring eligible row (any row if none is eligible), and whether its paired gain over the
    defaults is above zero with 95 % confidence."""
    eligible = [r for r in rows if r["eligible"]] or rows
    best = max(eligible, key=lambda r: -math.inf if r["score"]["mean"] is None else r["score"]["mean"])
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
    def cell(s: dict, pct: bool = False) -> str:
        if s["mean"] is None:
            return "-"
        return f"{s['mean']:.3f}" if not pct else f"{100 * s['mean']:.1f}%"

    head = ["T", "top-p", "top-k", "score", "gain vs default [95 %]", *TABLE_METRICS]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in sweep["settings"]:
        s, g = r["setting"], r["gain_over_default"]
        gain = "-" if g["mean"] is None else f"{g['mean']:+.3f} [{g['low']:+.3f},{g['high']:+.3f}]"
        mark = " (default)" if r["is_default"] else ""
        lines.append(
            " | ".join(
                [
                    f"{s['temperature']:g}{mark}",
                    f"{s['top_p']:g}",
                    "-" if s["top_k"] is None else str(s["top_k"]),
                    cell(r["score"]),
                    gain,
                    *(cell(r["metrics"][m], pct=m in _PERCENT) for m in TABLE_METRICS),
                ]
            )
        )
    truth = sweep["truth"]
    lines.append(
        " | ".join(
            [
                "truth",
                "",
                "",
                "",
                "",
                *(cell(truth[m], pct=m in _PERCENT) if m in truth else "" for m in TABLE_METRICS),
            ]
        )
    )
    where = sweep["input"] + (f" source {sweep['source']}" if sweep.get("source") else "")
    lines.append(
        f"{sweep['pieces']} pieces of {where} ({sweep['split']}) x {sweep['seeds']} seeds; "
        f"score = {sweep['score']}; eligible: density ratio in {sweep['density_band']} and one pitch > half "
        f"the notes in at most {100 * sweep['drone_cap']:.0f}% of continuations (the truth's share + "
        f"{100 * DRONE_MARGIN:g})"
    )
    lines.append(f"recommended: {sweep['recommended']} ({sweep['reason']})")
    return "\n".join(lines)


def write_sweep(sweep: dict, out_dir) -> dict[str, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "sweep.json", "plot": out_dir / "sweep.png"}
    paths["json"].write_text(json.dumps(sweep, indent=1, allow_nan=False) + "\n")
    plot_sweep(sweep, paths["plot"])
    return paths
