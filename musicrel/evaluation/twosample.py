"""Would a listener notice? A classifier two-sample test of each system's continuations against the truth.

For every system of an `evaluate-continuations` report, a random forest (scikit-learn) is asked to tell the
system's continuations from the true continuations of the same motifs. It sees what a musician would name
(`FAMILIES`): pitch-class, interval, IOI, duration and velocity histograms, polyphony, density, register,
self-repetition, and how the continuation joins what came before it; with instruments (a codec that has
them), the pitched notes of every instrument merged, and the `instruments` family beside
(`musicrel.evaluation.ensemble`: which instruments play, each class's density and register, the drums'
onsets). If it cannot do better than chance
(balanced accuracy 50 %, AUC 0.5) the system's continuations are, to these features, indistinguishable.

- Cross-validated by composition (GroupKFold): a piece's truth and all its samples, and every other
  performance of the same composition (the prepared folder's `compositions`; in a plain folder of MIDI, found
  from the notes as `musicrel prepare` finds them), sit on the same side of every split. Split by file, the
  forest learned "bars 10-20 of the Mephisto Waltz are the truth" from one pianist and recognised them in
  another's: real music read 90 % on ASAP performances. `FOLDS` folds, fewer when there are fewer
  compositions; under `MIN_PIECES` compositions the system is left out of the section, with the reason.
- Every seed's sample counts; the truth (one per piece) and the system (one per seed) weigh the same, so
  50 % is chance whatever --seeds is (balanced accuracy; AUC weighted the same way).
- A 95 % percentile-bootstrap interval over compositions (all of a composition's rows resampled together).
- What gives a system away: per feature family, the held-out AUC of a logistic regression that sees that
  family alone (0.5: the family tells nothing; 1: it alone tells every time); and the full forest's most used
  single features with their mean on either side.
- Per source (`sections`): a prepared folder that mixes corpora gets one section per corpus, never pooled.

The real-music system is the sanity check: the `seconds` after the truth, compared with the truth. Its
"context" (what it joins) is the truth itself, the 10 s before it, just as the truth's context is the motif:
compared with the motif it follows 10 s later and its join features alone would give it away. See
docs/EVALUATION.md for the figures this measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from musicrel.errors import MusicrelError
from musicrel.evaluation import ensemble
from musicrel.evaluation.metrics import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    CONFIDENCE,
    DURATION_EDGES,
    IOI_EDGES,
    VELOCITY_EDGES,
    durations,
    histogram,
    histogram_overlap,
    inter_onset_intervals,
    polyphony,
    repetition,
)
from musicrel.generation.keys import find_key, pitch_class_histogram

FOLDS = 5  # GroupKFold splits (fewer when there are fewer pieces)
MIN_PIECES = 4  # fewer compositions with both sides and the test is left out (folds need some to hold out)
TREES = 100
TOP_FEATURES = 5
MISSING = -1000.0  # a feature without a value (a continuation with no notes has no mean pitch)
JOIN_SECONDS = 1.0  # the stretch either side of the cut that "how it joins" compares
# Absolute melodic intervals (semitones) between successive notes: unison, steps, leaps, octave, beyond.
INTERVAL_EDGES = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 128])
FAMILIES = (
    "pitch class",
    "interval",
    "IOI",
    "duration",
    "velocity",
    "polyphony",
    "density",
    "register",
    "self-repetition",
    "join",
)


class TwoSampleUnavailable(MusicrelError):
    """scikit-learn is not installed: the report leaves the classifier out and says so."""

    code = "two_sample_unavailable"


def _bins(edges, unit: str = "") -> list[str]:
    return [
        f"{lo:g}-{hi:g}{unit}" if math.isfinite(hi) else f">={lo:g}{unit}"
        for lo, hi in zip(edges[:-1], edges[1:], strict=True)
    ]


def feature_names(instruments: bool = False) -> list[str]:
    """'family: name' for every column `features` returns, in order; with `instruments`, then the columns of
    the `instruments` family (`ensemble.feature_names`)."""
    names = [f"pitch class: tonic+{k}" for k in range(12)]
    names += [f"interval: {b}" for b in _bins(INTERVAL_EDGES[:-1].tolist() + [math.inf], " st")]
    names += [f"IOI: {b}" for b in _bins(IOI_EDGES, " s")]
    names += [f"duration: {b}" for b in _bins(DURATION_EDGES, " s")]
    names += [f"velocity: {b}" for b in _bins(VELOCITY_EDGES)]
    names += ["velocity: mean", "velocity: spread"]
    names += ["polyphony: mean", "polyphony: max"]
    names += ["density: notes/s", "density: onsets/s", "density: silent share"]
    names += ["register: mean pitch", "register: pitch spread", "register: lowest", "register: highest"]
    names += ["self-repetition: repeated 4-grams", "self-repetition: top pitch share",
              "self-repetition: distinct pitches/note"]  # fmt: skip
    names += ["join: first onset (s)", "join: pitch step at the cut", "join: velocity step at the cut",
              "join: density ratio at the cut (log)", "join: pitch-class overlap with context",
              "join: register shift from context"]  # fmt: skip
    return names + (ensemble.feature_names() if instruments else [])


def _intervals(notes) -> np.ndarray:
    ordered = sorted(notes, key=lambda n: (round(n.start, 2), n.pitch))
    return np.abs(np.diff([n.pitch for n in ordered]))


def _silent_share(notes, seconds: float) -> float:
    """Share of the window in which no note sounds."""
    spans = sorted((max(n.start, 0.0), min(n.end, seconds)) for n in notes if n.end > n.start)
    covered, reach = 0.0, 0.0
    for s, e in spans:
        if e > reach:
            covered += e - max(s, reach)
            reach = e
    return 1.0 - covered / seconds


def features(notes, context, seconds: float, key_notes=None) -> np.ndarray:
    """The columns of `feature_names` for one continuation. notes: the continuation, from time 0 (clipped to
    `seconds`); context: what it follows (the motif), times relative to the cut (negative); key_notes: the
    notes whose key the pitch classes are read in (default: the context)."""
    key = find_key(context if key_notes is None else key_notes)
    tonic = key[0] if key else 0  # pitch classes relative to the context's tonic: "the fifth", not "G"
    pitch = np.array([n.pitch for n in notes], dtype=np.float64)
    velocity = np.array([n.velocity for n in notes], dtype=np.float64)
    nan = math.nan
    cols: list[float] = list(np.roll(pitch_class_histogram(notes), -tonic))
    cols += list(histogram(_intervals(notes), INTERVAL_EDGES))
    cols += list(histogram(inter_onset_intervals(notes), IOI_EDGES))
    cols += list(histogram(durations(notes), DURATION_EDGES))
    cols += list(histogram(velocity, VELOCITY_EDGES))
    cols += [velocity.mean() if len(notes) else nan, velocity.std() if len(notes) else nan]
    cols += list(polyphony(notes))
    onsets = np.unique(np.round([n.start for n in notes], 2))
    cols += [len(notes) / seconds, len(onsets) / seconds, _silent_share(notes, seconds)]
    if len(notes):
        cols += [pitch.mean(), pitch.std(), pitch.min(), pitch.max()]
        counts = np.bincount(pitch.astype(int))
        cols += [repetition(notes), counts.max() / len(notes), len(np.unique(pitch)) / len(notes)]
    else:
        cols += [nan] * 7
    # How it joins: the first second after the cut against the last second before it.
    head = [n for n in notes if n.start < JOIN_SECONDS]
    tail = [n for n in context if n.start >= -JOIN_SECONDS] or context[-1:]
    ctx_pitch = np.array([n.pitch for n in context], dtype=np.float64)

    def step(attr, a, b) -> float:
        return float(np.mean([getattr(n, attr) for n in a]) - np.mean([getattr(n, attr) for n in b]))

    first = min((n.start for n in notes), default=nan)
    cols += [
        first,
        step("pitch", head, tail) if head and tail else nan,
        step("velocity", head, tail) if head and tail else nan,
        math.log((len(head) + 1) / (len([n for n in context if n.start >= -JOIN_SECONDS]) + 1)),
        histogram_overlap(pitch_class_histogram(notes), pitch_class_histogram(context)),
        pitch.mean() - ctx_pitch.mean() if len(notes) and len(context) else nan,
    ]
    return np.asarray(cols, dtype=np.float64)


# ----------------------------------------------------------------------------------------------------------
# The test


def _auc(y: np.ndarray, p: np.ndarray, w: np.ndarray) -> float:
    """Weighted ROC AUC (ties count half): the chance a system row scores above a truth row, each row
    counting its weight. Mann-Whitney on weighted ranks; sklearn's roc_auc_score gives the same figure but
    validates its input for 10 ms a call, and the bootstrap calls it a thousand times."""
    pos, neg = w[y == 1].sum(), w[y == 0].sum()
    if not pos or not neg:
        return math.nan
    order = np.argsort(p, kind="stable")
    p, y, w = p[order], y[order], w[order]
    # the negative weight strictly below each row plus half of the negative weight tied with it
    uniq, start = np.unique(p, return_index=True)
    neg_w = np.where(y == 0, w, 0.0)
    neg_by_value = np.add.reduceat(neg_w, start)
    below = np.concatenate([[0.0], np.cumsum(neg_by_value)[:-1]])
    value = np.searchsorted(uniq, p)
    score = below[value] + neg_by_value[value] / 2
    return float((w * score)[y == 1].sum() / (pos * neg))


def _accuracy(y: np.ndarray, p: np.ndarray, w: np.ndarray) -> float:
    """Balanced accuracy at p = 0.5: the mean of each side's share called right (weights within a side)."""
    right = (p >= 0.5) == (y == 1)
    sides = [np.average(right[y == c], weights=w[y == c]) for c in (0, 1) if (y == c).any()]
    return float(np.mean(sides))


def _interval(stat, groups: np.ndarray, y, p, w, seed: int) -> dict:
    """The statistic on all rows and its percentile-bootstrap interval, resampling pieces (groups)."""
    pieces = np.unique(groups)
    rows = [np.flatnonzero(groups == g) for g in pieces]
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        idx = np.concatenate([rows[i] for i in rng.integers(0, len(pieces), len(pieces))])
        v = stat(y[idx], p[idx], w[idx])
        if math.isfinite(v):
            values.append(v)
    mean = stat(y, p, w)
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(values, [tail, 100 - tail]) if values else (math.nan, math.nan)
    return {
        "mean": round(mean, 4),
        "low": round(float(min(low, mean)), 4),
        "high": round(float(max(high, mean)), 4),
    }


def classify(
    truth: np.ndarray,
    samples: Sequence[np.ndarray],
    seed: int = 0,
    compositions: Sequence | None = None,
    names: Sequence[str] | None = None,
    trees: int = TREES,
) -> dict:
    """The two-sample test of one system on one set of pieces.

    truth: (pieces, features), the true continuation of each piece; samples: per piece, (seeds, features)
    of the system's continuations (an empty array for a piece the system has none of: it is left out);
    compositions: per piece, the composition it is a version of (default: every piece its own); the folds
    and the bootstrap keep a composition's pieces together; names: the columns' "family: feature" names
    (default `feature_names()`; a caller with columns of its own, such as the infill's join at the gap's
    end, names them here and their families are scored alone like FAMILIES); trees: the forest's size (a
    test of the folds and the scores on a few dozen rows needs fewer than TREES).
    Returns {pieces, samples, folds, accuracy, auc (each {mean, low, high}), give_away, top_features}."""
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GroupKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    names = list(names) if names is not None else feature_names()
    families = list(dict.fromkeys(n.split(":")[0] for n in names))
    keep = [i for i, s in enumerate(samples) if len(s)]
    X = np.concatenate([truth[keep]] + [samples[i] for i in keep])
    y = np.concatenate([np.zeros(len(keep)), np.ones(sum(len(samples[i]) for i in keep))])
    ids = (
        np.unique([str(c) for c in compositions], return_inverse=True)[1]
        if compositions is not None
        else None
    )
    piece_group = [int(ids[i]) if ids is not None else i for i in keep]
    groups = np.concatenate(
        [np.asarray(piece_group)]
        + [np.full(len(samples[i]), g) for g, i in zip(piece_group, keep, strict=True)]
    )
    # the truth and the system weigh the same per piece: 1 truth row against 1/seeds of each sample row
    w = np.concatenate([np.ones(len(keep))] + [np.full(len(samples[i]), 1 / len(samples[i])) for i in keep])
    # "No value" (no notes, no interval) as a value no real one takes, so a tree can split it off.
    X = np.where(np.isfinite(X), X, MISSING)
    folds = min(FOLDS, len(np.unique(groups)))
    proba = np.zeros(len(y))
    family_of = np.array([n.split(":")[0] for n in names])
    alone = {f: np.zeros(len(y)) for f in families}  # out-of-fold scores of a model of one family
    importances = np.zeros(X.shape[1])
    for k, (train, test) in enumerate(GroupKFold(n_splits=folds).split(X, y, groups)):
        forest = RandomForestClassifier(
            n_estimators=trees, min_samples_leaf=2, random_state=seed + k, n_jobs=1
        ).fit(X[train], y[train], sample_weight=w[train])
        proba[test] = forest.predict_proba(X[test])[:, 1]
        importances += forest.feature_importances_ / folds
        # What gives it away: how well each family alone tells the sides apart. Shuffling one family out of
        # the whole forest says little when the system differs in many ways (the others still tell). A
        # logistic regression per family: ten forests more per fold cost 10x the time for the same ranking.
        for family in families:
            cols = np.flatnonzero(family_of == family)
            alone_model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500))
            alone_model.fit(X[train][:, cols], y[train], logisticregression__sample_weight=w[train])
            alone[family][test] = alone_model.predict_proba(X[test][:, cols])[:, 1]
    give_away = sorted(
        ({"family": f, "auc_alone": round(_auc(y, p, w), 4)} for f, p in alone.items()),
        key=lambda r: -r["auc_alone"],
    )
    top = np.argsort(-importances)[:TOP_FEATURES]
    system_rows, truth_rows = y == 1, y == 0
    composition_of = np.unique([str(c) for c in compositions])[groups] if ids is not None else groups
    return {
        "pieces": len(keep),
        "compositions": int(len(np.unique(groups))),
        "samples": int(system_rows.sum()),
        "folds": folds,
        "accuracy": _interval(_accuracy, groups, y, proba, w, BOOTSTRAP_SEED),
        "auc": _interval(_auc, groups, y, proba, w, BOOTSTRAP_SEED),
        "give_away": give_away,
        "top_features": [
            {
                "name": names[i],
                "importance": round(float(importances[i]), 4),
                "system": round(float(np.average(X[system_rows, i], weights=w[system_rows])), 4),
                "truth": round(float(X[truth_rows, i].mean()), 4),
            }
            for i in top
        ],
        # Each row's out-of-fold score, for a paired comparison of two runs on the same pieces (auc_gain).
        "oof": {
            "composition": [str(c) for c in composition_of],
            "y": y.astype(int).tolist(),
            "p": np.round(proba, 4).tolist(),
            "w": np.round(w, 6).tolist(),
        },
    }


def auc_gain(base: dict, other: dict, seed: int = BOOTSTRAP_SEED) -> dict:
    """How much less `other` is told from the truth than `base`: AUC(base) - AUC(other) (> 0: `other` is
    harder to tell), with its percentile-bootstrap interval, resampling the compositions both runs held
    (each run's classifier keeps its own out-of-fold scores, `classify`'s "oof"). The pairing removes what
    the pieces themselves contribute to each AUC, as a paired difference of overlaps does.
    Returns {"mean", "low", "high", "n"}: n compositions; None figures when none are shared."""
    runs = []
    for oof in (base, other):
        comp = np.asarray(oof["composition"])
        runs.append((comp, np.asarray(oof["y"]), np.asarray(oof["p"], float), np.asarray(oof["w"], float)))
    shared = sorted(set(runs[0][0]) & set(runs[1][0]))
    if not shared:
        return {"mean": None, "low": None, "high": None, "n": 0}
    rows = [{c: np.flatnonzero(comp == c) for c in shared} for comp, *_ in runs]

    def gain(picked) -> float:
        aucs = []
        for (_, y, p, w), by_comp in zip(runs, rows, strict=True):
            idx = np.concatenate([by_comp[c] for c in picked])
            aucs.append(_auc(y[idx], p[idx], w[idx]))
        return aucs[0] - aucs[1]

    rng = np.random.default_rng(seed)
    draws = (rng.integers(0, len(shared), len(shared)) for _ in range(BOOTSTRAP_RESAMPLES))
    values = [v for v in (gain([shared[i] for i in d]) for d in draws) if math.isfinite(v)]
    mean = gain(shared)
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(values, [tail, 100 - tail]) if values else (math.nan, math.nan)
    return {"mean": mean, "low": float(min(low, mean)), "high": float(max(high, mean)), "n": len(shared)}


def two_sample(
    contexts: Sequence[list],
    truths: Sequence[list],
    systems: dict[str, list[list[list]]],
    seconds: float,
    sources: Sequence[str | None],
    compositions: Sequence | None = None,
    real_contexts: dict[str, Sequence[list]] | None = None,
    seed: int = 0,
    parts: dict | None = None,
    trees: int = TREES,
) -> dict:
    """Every system's test, per source.

    contexts[i]: piece i's motif (times relative to the cut); truths[i]: its true continuation;
    systems[name][i]: the system's continuations of piece i, one note list per seed (empty: none);
    sources[i]: piece i's corpus (None when unknown: one section "all"); compositions[i]: the composition
    piece i is a version of (default: its own); real_contexts[name][i]: the context a system's continuation
    follows when it is not the motif (real music follows the truth); parts: with instruments, the same
    by instrument (`ensemble.Parts`: {"contexts", "truths", "systems", "real_contexts"}, shaped as the
    arguments of those names; the notes above are then the pitched ones), read by the `instruments` family;
    trees: each forest's size (`classify`).
    Returns {"classifier", "features", "sections": {source: {"pieces", "systems", "left_out"}}}. Raises
    TwoSampleUnavailable without scikit-learn."""
    try:
        import sklearn  # noqa: F401
    except ImportError as exc:
        raise TwoSampleUnavailable(
            "scikit-learn is not installed: pip install 'musicrel[eval]' (make test does)"
        ) from exc
    truth_x = np.stack([features(t, c, seconds) for t, c in zip(truths, contexts, strict=True)])
    if parts is not None:
        truth_x = np.hstack([truth_x, _instrument_columns(parts["truths"], parts["contexts"], seconds)])
    # Pitch classes are read in the motif's key for every system, real music too: the piece's key is the
    # motif's. Read in the truth's own key (a later window's estimate is more often a fifth off), real music
    # on POP909 was told apart by tonic+5 and tonic+7 (0.15 vs 0.12, 0.16 vs 0.20).
    real_contexts = real_contexts or {}
    names = feature_names(instruments=parts is not None)
    sections: dict[str, dict] = {}
    labels = ["all" if s is None else s for s in sources]
    for source in dict.fromkeys(labels):
        idx = [i for i, s in enumerate(labels) if s == source]
        section: dict = {"pieces": len(idx), "systems": {}, "left_out": {}}
        for name, runs in systems.items():
            ctx = real_contexts.get(name, contexts)
            samples = [
                np.stack([features(n, ctx[i], seconds, contexts[i]) for n in runs[i]])
                if runs[i]
                else np.zeros((0, 0))
                for i in idx
            ]
            if parts is not None:
                by_part = parts["systems"][name]
                part_ctx = parts.get("real_contexts", {}).get(name, parts["contexts"])
                samples = [
                    np.hstack([s, _instrument_columns(by_part[i], [part_ctx[i]] * len(by_part[i]), seconds)])
                    if len(s)
                    else s
                    for s, i in zip(samples, idx, strict=True)
                ]
            comps = [i if compositions is None else compositions[i] for i in idx]
            usable = len({c for c, s in zip(comps, samples, strict=True) if len(s)})
            if usable < MIN_PIECES:
                files = sum(1 for s in samples if len(s))
                section["left_out"][name] = (
                    f"{usable} compositions with continuations (< {MIN_PIECES}) in {files} files: "
                    "too few to fold"
                )
                continue
            section["systems"][name] = classify(truth_x[idx], samples, seed, comps, names, trees)
        sections[source] = section
    return {
        "classifier": f"random forest ({trees} trees), GroupKFold by composition ({FOLDS} folds at most)",
        "confidence": CONFIDENCE,
        "features": names,
        "sections": sections,
    }


def _instrument_columns(runs, contexts, seconds: float) -> np.ndarray:
    """(len(runs), columns) of the `instruments` family (`ensemble.features`), one row per continuation."""
    return np.stack([ensemble.features(r, c, seconds) for r, c in zip(runs, contexts, strict=True)])


def _pct(ci: dict) -> str:
    return f"{100 * ci['mean']:.0f}% [{100 * ci['low']:.0f},{100 * ci['high']:.0f}]"


def format_grouping(grouping: dict) -> str:
    """What the folds held, one line: the report's `two_sample.grouping` (see
    musicrel.evaluation.continuations.piece_compositions)."""
    how = {
        "manifest": "versions from the prepared folder's manifest",
        "notes": "versions found from the notes",
    }.get(grouping["method"], grouping["method"])
    several = grouping["multi_file"]
    held = "none has several"
    if several:
        held = f"{len(several)} with several: {sum(len(m) for m in several)} files"
    return (
        f"folds by composition: {grouping['files']} files in {grouping['compositions']} compositions "
        f"({how}; {held})"
    )


def format_two_sample(result: dict) -> list[str]:
    """Lines of the console table: what the folds held, then per source, per system, accuracy and AUC with
    intervals, what gives it away."""
    lines = [
        "real vs generated (classifier two-sample test; balanced accuracy, 50% = indistinguishable; "
        "given away by: a feature family's AUC alone):"
    ]
    if "grouping" in result:
        lines.append("  " + format_grouping(result["grouping"]))
    for source, section in result["sections"].items():
        lines.append(f"  {source} ({section['pieces']} pieces):")
        width = max((len(n) for n in section["systems"]), default=0)
        for name, r in section["systems"].items():
            away = ", ".join(f"{g['family']} {g['auc_alone']:.2f}" for g in r["give_away"][:3]) or "-"
            lines.append(
                f"    {name.ljust(width)}  accuracy {_pct(r['accuracy'])}  AUC {r['auc']['mean']:.2f} "
                f"[{r['auc']['low']:.2f},{r['auc']['high']:.2f}]  n={r['pieces']} "
                f"({r['compositions']} compositions, {r['folds']} folds)  given away by: {away}"
            )
        for name, reason in section["left_out"].items():
            lines.append(f"    {name.ljust(width)}  left out: {reason}")
    return lines
