"""Statistics of generated music, each a figure a musician would recognise (`METRICS`), and the bootstrap
intervals that go with them; `continuations` runs the systems and scores their continuations with these.

- against the reference: overlap of pitch-class, inter-onset-interval, note-duration and velocity histograms
  (sum of bin-wise minima of two normalised histograms; 1 = same), pitch-range difference, density ratio;
- on its own, and for the reference too so the two can be compared: key agreement with the motif (the
  Krumhansl-Schmuckler key of the motif; the correlation of the continuation's duration-weighted pitch-class
  histogram with that key's profile), notes per second, polyphony (mean notes sounding while any sounds, and
  the most at once), self-repetition (share of n-grams of (pitch interval, IOI bin) seen earlier in the same
  continuation), the share of notes held longer than `HELD_SECONDS` and whether one pitch has more than half
  of the notes (`one_pitch`: a drone, which every histogram overlap but the pitch class's can miss);
- on the token stream: the share of continuations that break the grammar (an orphan note-off, counting the
  notes the primer leaves sounding; a special token; an id outside the vocabulary) and the re-strikes (a
  note-on of a sounding pitch: legal, reported for information).

A figure's 95 % interval is a percentile bootstrap over pieces with a fixed seed, so a report is
reproducible. The density ratio is averaged geometrically (the mean of its logarithm): an arithmetic mean of
ratios reads 1.25 for one piece at 2x and one at 0.5x.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from musicrel.generation.keys import correlation, key_profile, pitch_class_histogram

# IOI bin edges in seconds: 10 ms grid up to 2 s, log-spaced (what separates a trill from a half note).
IOI_EDGES = np.array([0.0, 0.04, 0.08, 0.12, 0.17, 0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, np.inf])
# Note durations: the same grid, on to the held-note threshold.
DURATION_EDGES = np.array(
    [0.0, 0.04, 0.08, 0.12, 0.17, 0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0, np.inf]
)
VELOCITY_EDGES = np.arange(0, 129, 8)  # 16 bins of 8: finer than a player controls, coarser than MIDI
HELD_SECONDS = 4.0  # a note longer than this is "held" (the grammar closes forgotten notes after 1-8 s)
REPEAT_N = 4  # n-gram length of the self-repetition figure: a motif of four intervals
# Krumhansl & Kessler's (1982) probe-tone profiles, tonic first.
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
GEOMETRIC_FLOOR = 0.01
GRAMMAR_ERRORS = ("orphan_note_off", "special_token", "out_of_vocab")


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    better: str  # "higher", "lower", "one" (closest to 1), "reference" (closest to the truth's value), ""
    intrinsic: bool = False  # a property of the notes alone: also reported for the reference
    tokens: bool = False  # needs a token stream (model and n-gram systems only)
    index: bool = False  # needs the training data's novelty index (evaluation.novelty), not the notes alone
    # needs each note's instrument (a codec with instruments; evaluation.ensemble): a piano report has no row
    instruments: bool = False
    # A ratio is averaged over pieces geometrically: twice too many and half too few notes then weigh the
    # same, and one sparse reference (0.2 notes/s, a ratio of 20) does not outweigh a hundred pieces.
    geometric: bool = False


METRICS = (
    Metric("pc_overlap", "pitch-class overlap", "higher"),
    Metric("ioi_overlap", "IOI overlap", "higher"),
    Metric("duration_overlap", "duration overlap", "higher"),
    Metric("velocity_overlap", "velocity overlap", "higher"),
    Metric("range_diff", "range diff (semitones)", "lower"),
    Metric("density_ratio", "density ratio", "one", geometric=True),
    Metric("key_corr", "key correlation", "reference", intrinsic=True),
    Metric("density", "notes/s", "reference", intrinsic=True),
    Metric("polyphony_mean", "mean polyphony", "reference", intrinsic=True),
    Metric("polyphony_max", "max polyphony", "reference", intrinsic=True),
    Metric("repetition", f"repeated {REPEAT_N}-grams", "reference", intrinsic=True),
    Metric("held_share", f"notes held > {HELD_SECONDS:g} s", "reference", intrinsic=True),
    # Per continuation 0 or 1, so its mean is the share of continuations that drone on one pitch (at
    # temperature 0.5 the shipped model once gave 157 notes all A4); the truth's share is what music does.
    Metric("one_pitch", "one pitch > half the notes", "reference", intrinsic=True),
    # A note still sounding when the window ends: a model that forgets to close notes holds many (a chord
    # hanging to the end), the truth a few (whatever is sounding at an arbitrary instant).
    Metric("sounding_at_end", "notes sounding at the end", "reference", intrinsic=True),
    # The longest stretch (notes) shared with a training piece, transposition-invariant (evaluation.novelty):
    # the truth's figure is what held-out music shares with the training data by chance.
    Metric("copied_notes", "longest copy from train (notes)", "reference", intrinsic=True, index=True),
    # Of the instruments sounding in the motif's last 5 s that the truth plays in its first 10 s, the share
    # the continuation plays there (evaluation.ensemble.continuity); the drums' onset-IOI overlap with the
    # truth's, where the truth has drums (ensemble.drum_groove); the overlap of their drum keys
    # (ensemble.drum_kit: which drum sounds are struck, how often).
    Metric("instrument_continuity", "motif's instruments kept", "higher", instruments=True),
    Metric("drum_groove", "drum IOI overlap", "higher", instruments=True),
    Metric("drum_kit", "drum-key overlap", "higher", instruments=True),
    Metric("grammar_error", "grammar errors", "lower", tokens=True),
    Metric("restrikes", "re-strikes", "", tokens=True),
)


# ----------------------------------------------------------------------------------------------------------
# Statistics of one note list


def histogram(values, edges) -> np.ndarray:
    """The share of `values` in each bin of `edges` (all zeros for no values)."""
    counts = np.histogram(values, bins=edges)[0].astype(np.float64)
    return counts / counts.sum() if counts.sum() else counts


# Times a histogram bins are rounded to the millisecond first: a score's eighth at 120 bpm is 0.25 s, on a
# bin edge, and the same length read as a difference of two 10 ms steps is 0.25 +- 1e-16, either side of it.
TIME_DECIMALS = 3


def inter_onset_intervals(notes) -> np.ndarray:
    """Gaps between successive distinct onsets (chord notes share an onset), in seconds."""
    onsets = np.unique(np.round([n.start for n in notes], 2))
    return np.round(np.diff(onsets), TIME_DECIMALS)


def durations(notes) -> np.ndarray:
    """Each note's length in seconds (rounded as TIME_DECIMALS says)."""
    return np.round(np.array([n.end - n.start for n in notes], dtype=np.float64), TIME_DECIMALS)


def ioi_histogram(notes) -> np.ndarray:
    return histogram(inter_onset_intervals(notes), IOI_EDGES)


def duration_histogram(notes) -> np.ndarray:
    return histogram(durations(notes), DURATION_EDGES)


def velocity_histogram(notes) -> np.ndarray:
    return histogram([n.velocity for n in notes], VELOCITY_EDGES)


def histogram_overlap(p: np.ndarray, q: np.ndarray) -> float:
    """Sum of bin-wise minima of two normalised histograms: 1 when equal, 0 when disjoint. Two empty
    histograms are equal (1); one empty one is not (0)."""
    if not p.sum() and not q.sum():
        return 1.0
    return float(np.minimum(p, q).sum())


def pitch_range(notes) -> int:
    pitches = [n.pitch for n in notes]
    return max(pitches) - min(pitches) if pitches else 0


def note_density(notes, seconds: float) -> float:
    return len(notes) / seconds if seconds > 0 else 0.0


def key_correlation(notes, key: tuple[int, str] | None) -> float:
    """Correlation (-1..1) of the notes' duration-weighted pitch-class histogram with `key`'s profile: how
    well they stay in the key (NaN without a key or notes)."""
    if key is None:
        return math.nan
    return correlation(pitch_class_histogram(notes, weight="duration"), key_profile(key))


def polyphony(notes) -> tuple[float, int]:
    """(mean notes sounding while at least one sounds, weighted by time; the most sounding at once). A note
    that ends when another starts does not overlap it. (NaN, 0) for no notes."""
    spans = [(n.start, n.end) for n in notes if n.end > n.start]
    if not spans:
        return math.nan, 0
    # ends sort before starts at the same time (-1 < +1)
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    times = np.array([t for t, _ in events])
    sounding = np.cumsum([d for _, d in events])  # after each event
    dt = np.diff(times)
    busy = sounding[:-1] > 0
    mean = float((sounding[:-1] * dt)[busy].sum() / dt[busy].sum()) if dt[busy].sum() > 0 else math.nan
    return mean, int(sounding.max())


def repetition(notes, n: int = REPEAT_N) -> float:
    """Share of the n-grams of (pitch interval, IOI bin) between successive notes (ordered by onset, then
    pitch) that already occurred earlier in the same list: 0 = never repeats itself, -> 1 = one loop. NaN
    with fewer than n + 1 notes."""
    notes = sorted(notes, key=lambda x: (round(x.start, 2), x.pitch))
    if len(notes) < n + 1:
        return math.nan
    pitch = np.array([x.pitch for x in notes])
    ioi = np.digitize(np.diff(np.round([x.start for x in notes], 2)), IOI_EDGES[1:-1])
    symbols = list(zip(np.diff(pitch).tolist(), ioi.tolist(), strict=True))
    grams = [tuple(symbols[i : i + n]) for i in range(len(symbols) - n + 1)]
    seen: set = set()
    repeats = 0
    for g in grams:
        repeats += g in seen
        seen.add(g)
    return repeats / len(grams)


def held_share(notes, seconds: float = HELD_SECONDS) -> float:
    """Share of notes longer than `seconds` (NaN for no notes)."""
    if not notes:
        return math.nan
    return float(np.mean([n.end - n.start > seconds for n in notes]))


def one_pitch(notes) -> float:
    """1.0 when the most common pitch has more than half of the notes, else 0.0 (NaN for no notes)."""
    if not notes:
        return math.nan
    return float(2 * np.bincount([n.pitch for n in notes], minlength=128).max() > len(notes))


def sounding_at_end(notes, seconds: float) -> float:
    """Share of notes (clipped to the window) still sounding at its end `seconds` (NaN for no notes)."""
    if not notes:
        return math.nan
    return float(np.mean([n.end >= seconds - 1e-3 for n in notes]))


def grammar_errors(codec, tokens, sounding: np.ndarray | None = None, primer=None) -> dict[str, int]:
    """Counts of grammar violations in a generated token stream (`GRAMMAR_ERRORS`: note-offs of pitches not
    sounding, special tokens, ids outside the vocabulary) and, for information, of re-strikes ("restrike": a
    note-on of a sounding pitch, which the codec decodes as close-and-restart: legal). `sounding` (128,) bool:
    the notes open when the stream starts (those the primer leaves sounding at its cut; default none). With
    instruments a note is an (instrument, pitch), as the codec decodes it: `primer` (the tokens before the
    stream) gives what sounds and the instrument in effect where it starts, and `sounding` is not read."""
    instruments = codec.instrument_offset is not None
    open_notes = np.zeros((codec.num_instruments if instruments else 1, 128), dtype=bool)
    if sounding is not None and primer is None:
        open_notes[0] = np.array(sounding, dtype=bool)
    counts = dict.fromkeys((*GRAMMAR_ERRORS, "restrike"), 0)
    specials = {codec.pad_id, codec.bos_id, codec.eos_id}
    played = 0  # the instrument in effect (0, the piano, before any INSTRUMENT token, as decoding reads it)
    before = [] if primer is None else np.asarray(primer, dtype=np.int64).tolist()
    for k, t in enumerate(before + np.asarray(tokens, dtype=np.int64).tolist()):
        count = k >= len(before)
        if not 0 <= t < codec.vocab_size:
            counts["out_of_vocab"] += count
        elif t in specials:
            counts["special_token"] += count
        elif instruments and codec.is_instrument(t):
            played = t - codec.instrument_offset
        elif codec.is_note_on(t):
            p = t - codec.note_on_offset
            counts["restrike"] += count * int(open_notes[played, p])
            open_notes[played, p] = True
        elif codec.is_note_off(t):
            p = t - codec.note_off_offset
            counts["orphan_note_off"] += count * int(not open_notes[played, p])
            open_notes[played, p] = False
    return counts


def describe(notes, seconds: float, key: tuple[int, str] | None) -> dict[str, float]:
    """The intrinsic figures of one note list (from time 0, `seconds` long); `key`: the motif's."""
    mean_poly, max_poly = polyphony(notes)
    return {
        "key_corr": key_correlation(notes, key),
        "density": note_density(notes, seconds),
        "polyphony_mean": mean_poly,
        "polyphony_max": float(max_poly),
        "repetition": repetition(notes),
        "held_share": held_share(notes),
        "one_pitch": one_pitch(notes),
        "sounding_at_end": sounding_at_end(notes, seconds),
    }


def compare(generated, reference, seconds: float, key: tuple[int, str] | None = None) -> dict[str, float]:
    """Scores of one generated note list against the reference continuation (both from time 0), and its
    intrinsic figures (`describe`)."""
    ref_density = note_density(reference, seconds)
    out = {
        "pc_overlap": histogram_overlap(pitch_class_histogram(generated), pitch_class_histogram(reference)),
        "ioi_overlap": histogram_overlap(ioi_histogram(generated), ioi_histogram(reference)),
        "duration_overlap": histogram_overlap(duration_histogram(generated), duration_histogram(reference)),
        "velocity_overlap": histogram_overlap(velocity_histogram(generated), velocity_histogram(reference)),
        "range_diff": float(abs(pitch_range(generated) - pitch_range(reference))),
        "density_ratio": note_density(generated, seconds) / ref_density if ref_density else math.nan,
    }
    return {**out, **describe(generated, seconds, key)}


# ----------------------------------------------------------------------------------------------------------
# Intervals


def bootstrap_interval(
    values,
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
    geometric: bool = False,
) -> dict[str, float | int | None]:
    """Mean of the finite `values` and its percentile-bootstrap interval (resampling the values with
    replacement, a fixed seed): {"mean", "low", "high", "n"} (None for no values). geometric: the mean
    is exp(mean(log)), and so are the interval's bounds; a value under GEOMETRIC_FLOOR counts as the floor (a
    continuation with no note weighs as 1/100 of the truth's density instead of dropping out)."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if geometric:
        x = np.log(np.maximum(x, GEOMETRIC_FLOOR))
    if not len(x):
        return {"mean": None, "low": None, "high": None, "n": 0}
    means = x[np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    # The percentile interval of a skewed statistic can miss the sample mean by a rounding hair: keep it in.
    mean = float(x.mean())
    low, high = float(min(low, mean)), float(max(high, mean))
    if geometric:
        mean, low, high = math.exp(mean), math.exp(low), math.exp(high)
    return {"mean": mean, "low": low, "high": high, "n": int(len(x))}


def paired_difference(report: dict, metric: str, a: str, b: str) -> dict[str, float | int | None]:
    """Mean of (a - b) over the pieces where both systems have a value of `metric`, with its bootstrap
    interval: a comparison on the same pieces, free of the spread between pieces."""
    va = report["systems"][a]["per_piece"][metric]
    vb = report["systems"][b]["per_piece"][metric]
    return bootstrap_interval([x - y for x, y in zip(va, vb, strict=True) if x is not None and y is not None])
