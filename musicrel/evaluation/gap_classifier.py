"""evaluate-infills' real-vs-generated test (`classifier`): `twosample.classify` on twosample's features of a
gap (the music before as the context) plus a family for how the gap leads into the music after it
(`end_join_features`, END_JOIN_NAMES), and with instruments the `instruments` family
(`musicrel.evaluation.ensemble`: who plays in the gap, each class's density and register, the drums)."""

from __future__ import annotations

import math

import numpy as np

from musicrel.evaluation import ensemble, twosample
from musicrel.evaluation.gaps import Gap
from musicrel.evaluation.metrics import CONFIDENCE, histogram_overlap
from musicrel.evaluation.twosample import FOLDS, JOIN_SECONDS, TREES, auc_gain, classify, features
from musicrel.generation.keys import pitch_class_histogram

TWO_SAMPLE_MIN = twosample.MIN_PIECES
END_JOIN = "join at the end"
END_JOIN_NAMES = [
    f"{END_JOIN}: {name}"
    for name in (
        "silence before the end (s)",
        "onset gap across the end (s)",
        "pitch step to what follows",
        "velocity step to what follows",
        "density ratio across the end (log)",
        "pitch-class overlap with what follows",
        "register shift to what follows",
    )
]


def end_join_features(notes, after, seconds: float) -> np.ndarray:
    """The columns of END_JOIN_NAMES: how a gap of `seconds` (notes from 0) leads into the music after it
    (`after`, from the gap's end at 0). twosample's own "join" family is the gap's start (against the music
    before)."""
    nan = math.nan
    if not notes or not after:
        return np.full(len(END_JOIN_NAMES), nan)
    tail = [n for n in notes if n.start >= seconds - JOIN_SECONDS] or [max(notes, key=lambda n: n.start)]
    first = min(n.start for n in after)
    head = [n for n in after if n.start < first + JOIN_SECONDS]
    pitch = np.mean([n.pitch for n in notes])

    def mean(attr, group) -> float:
        return float(np.mean([getattr(n, attr) for n in group]))

    return np.array(
        [
            seconds - max(n.end for n in notes),
            seconds - max(n.start for n in notes) + first,
            mean("pitch", head) - mean("pitch", tail),
            mean("velocity", head) - mean("velocity", tail),
            math.log((len([n for n in notes if n.start >= seconds - JOIN_SECONDS]) + 1) / (len(head) + 1)),
            histogram_overlap(pitch_class_histogram(notes), pitch_class_histogram(after)),
            mean("pitch", after) - pitch,
        ],
        dtype=np.float64,
    )


def gap_features(notes, gap: Gap, parts=None) -> np.ndarray:
    """twosample's features of a gap's notes (the music before as the context) and the gap's end's; with
    `parts` (the same notes by instrument, drums too), the `instruments` family's after them."""
    columns = [features(notes, gap.before, gap.seconds), end_join_features(notes, gap.after, gap.seconds)]
    if parts is not None:
        columns.append(ensemble.features(parts, gap.parts.before, gap.seconds))
    return np.concatenate(columns)


def classifier(
    gaps: list[Gap],
    labels: list[str],
    comps: list[str],
    heard: dict,
    seed: int,
    trees: int = TREES,
    parts: dict | None = None,
) -> dict:
    """The real-vs-generated test of every system, per source: `twosample.classify` on a matrix built here
    (a row per gap and sample, twosample's features plus the END_JOIN family, and with `parts` (per system,
    per gap, each sample's notes by instrument) the `instruments` family); the folds keep a composition's
    gaps together. Each section also has `gain`: per baseline, how much harder the infill is to tell from the
    truth than it (`twosample.auc_gain`, paired by composition; > 0: the infill is harder to tell)."""
    truth_x = np.stack([gap_features(g.truth, g, g.parts and g.parts.truth) for g in gaps])
    piece_of = [g.piece for g in gaps]
    sections: dict[str, dict] = {}
    names = twosample.feature_names() + END_JOIN_NAMES + (ensemble.feature_names() if parts else [])
    for source in dict.fromkeys(labels):
        idx = [i for i, s in enumerate(labels) if s == source]
        # the rows are gaps: "pieces" counts the pieces they were cut from
        pieces = len({piece_of[i] for i in idx})
        section: dict = {"pieces": pieces, "gaps": len(idx), "systems": {}, "left_out": {}}
        for name, runs in heard.items():
            by_part = parts[name] if parts else [[None] * len(r) for r in runs]
            samples = [
                np.stack([gap_features(n, gaps[i], e) for n, e in zip(runs[i], by_part[i], strict=True)])
                if runs[i]
                else np.zeros((0, 0))
                for i in idx
            ]
            cs = [comps[i] for i in idx]
            usable = len({c for c, s in zip(cs, samples, strict=True) if len(s)})
            if usable < TWO_SAMPLE_MIN:
                section["left_out"][name] = (
                    f"{usable} compositions with gaps (< {TWO_SAMPLE_MIN}): too few to fold"
                )
                continue
            section["systems"][name] = classify(truth_x[idx], samples, seed, cs, names, trees)
        systems = section["systems"]
        if "infill" in systems:
            section["gain"] = {
                b: auc_gain(systems[b]["oof"], systems["infill"]["oof"]) for b in systems if b != "infill"
            }
        sections[source] = section
    return {
        "classifier": f"random forest ({trees} trees), GroupKFold by composition ({FOLDS} folds at most)",
        "confidence": CONFIDENCE,
        "features": names,
        "rows": "gaps (several per piece), folded by composition",
        "sections": sections,
    }
