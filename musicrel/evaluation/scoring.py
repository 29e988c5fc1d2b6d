"""What every evaluation's scoring and report share: a sample scored against the truth (`score`), the
mean over seeds (`seed_mean`), each metric's interval over pieces (`summaries`), notes and numbers as JSON
(`notes_json`, `json_value`), the report's common fields (`report_head`, `report_settings`) and the
real-vs-generated classifier's call with the pieces folded by composition (`classified`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pretty_midi
import torch

from musicrel.data.compositions import CompositionsUnavailable
from musicrel.data.prepared import is_prepared
from musicrel.evaluation.metrics import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    CONFIDENCE,
    GRAMMAR_ERRORS,
    METRICS,
    bootstrap_interval,
    compare,
    grammar_errors,
)
from musicrel.evaluation.pieces import piece_compositions
from musicrel.evaluation.twosample import TwoSampleUnavailable

MIN_PIECES = 100  # fewer pieces than this and the report warns that its intervals are wide


def clip(notes, seconds: float) -> list:
    """The notes inside [0, seconds): every system is scored on the same window as the truth."""
    return [
        pretty_midi.Note(n.velocity, n.pitch, n.start, min(n.end, seconds))
        for n in notes
        if n.start < seconds
    ]


def notes_json(notes, shift: float = 0.0) -> list[list]:
    """[pitch, start, end, velocity] rows, times moved `shift` seconds earlier."""
    return [[n.pitch, round(n.start - shift, 3), round(n.end - shift, 3), n.velocity] for n in notes]


def json_value(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 6)


def score(
    codec, notes, truth, seconds: float, key, tokens=None, sounding=None, primer=None
) -> dict[str, float]:
    """`metrics.compare` of a sample's notes with the truth; with the tokens that wrote them (and the pitches
    sounding where they start, or with instruments the primer's tokens: `metrics.grammar_errors`), whether
    they broke the grammar and how often they restruck a note."""
    scores = compare(notes, truth, seconds, key)
    if tokens is not None:
        counts = grammar_errors(codec, tokens, sounding, primer)
        scores["grammar_error"] = float(any(counts[k] for k in GRAMMAR_ERRORS))
        scores["restrikes"] = float(counts["restrike"])
    return scores


def seed_mean(runs: list[dict[str, float]]) -> dict[str, float]:
    """A piece's score per metric: the mean over its seeds that have a value (NaN if none has)."""
    out = {}
    for m in METRICS:
        values = [r[m.name] for r in runs if m.name in r and not math.isnan(r[m.name])]
        out[m.name] = float(np.mean(values)) if values else math.nan
    return out


def summaries(per_piece: dict[str, list], names) -> dict:
    """Each metric of `names`: its bootstrap interval over pieces (geometric where the metric is a ratio)."""
    geometric = {m.name for m in METRICS if m.geometric}
    return {name: bootstrap_interval(per_piece[name], geometric=name in geometric) for name in names}


def metrics_json(metrics) -> dict:
    """The report's `metrics`: how each is labelled, which way is better, whether the truth has it too."""
    return {m.name: {"label": m.label, "better": m.better, "reference": m.intrinsic} for m in metrics}


def report_head(checkpoint, weights: str, input_dir: Path, split: str) -> dict:
    """What was evaluated: the checkpoint, its weights, the input and (for a prepared folder) its split."""
    return {
        "checkpoint": str(checkpoint),
        "weights": weights,
        "input": str(input_dir),
        "split": split if is_prepared(input_dir) else None,
    }


def report_settings(options, sampling, fields: Sequence[str], pieces: int) -> dict:
    """The report's settings: the source, the seeds, the sampling's `fields` (of `sampling`), the bootstrap,
    the torch threads it decoded with (int8 sums, and so a few sampled tokens, differ with the thread count:
    compare runs at the same threads) and a warning when there are too few pieces for narrow intervals."""
    warnings = []
    if pieces < MIN_PIECES:
        warnings.append(f"only {pieces} pieces (< {MIN_PIECES}): the intervals are wide")
    return {
        "source": options.source,
        "seed": options.seed,
        "seeds": options.seeds,
        "sampling": {name: getattr(sampling, name) for name in fields},
        "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "confidence": CONFIDENCE, "seed": BOOTSTRAP_SEED},
        "pieces": pieces,
        "threads": torch.get_num_threads(),
        "warnings": warnings,
    }


def classified(codec, input_dir: Path, paths: Sequence[str], test: Callable[[list[str]], dict], left_out):
    """The real-vs-generated classifier's result: `test(compositions)` (per piece, the composition it is a
    version of: versions share their notes, so they stay on one side of every split) with the `grouping` it
    was folded by; None with the reason in `left_out` without scikit-learn or datasketch."""
    try:
        compositions, grouping = piece_compositions(codec, input_dir, paths)
        result = test(compositions)
    except (TwoSampleUnavailable, CompositionsUnavailable) as exc:
        left_out["two_sample"] = str(exc)
        return None
    result["grouping"] = grouping
    return result
