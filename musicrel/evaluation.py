"""How musical are the continuations? Compare them with the true continuation of held-out pieces.

For each piece the first `motif_seconds` are the motif and the next `seconds` the reference (the truth). Every
system continues the motif from the cut, `seeds` times, and each continuation is scored with statistics a
musician would recognise (`METRICS`):

- against the reference: overlap of pitch-class, inter-onset-interval, note-duration and velocity histograms
  (sum of bin-wise minima of two normalised histograms; 1 = same), pitch-range difference, density ratio;
- on its own, and for the reference too so the two can be compared: key agreement with the motif (the
  Krumhansl-Schmuckler key of the motif; the correlation of the continuation's duration-weighted pitch-class
  histogram with that key's profile), notes per second, polyphony (mean notes sounding while any sounds, and
  the most at once), self-repetition (share of n-grams of (pitch interval, IOI bin) seen earlier in the same
  continuation) and the share of notes held longer than `HELD_SECONDS`;
- on the token stream: the share of continuations that break the grammar (an orphan note-off, counting the
  notes the primer leaves sounding; a special token; an id outside the vocabulary) and the re-strikes (a
  note-on of a sounding pitch: legal, reported for information).

Systems (`SYSTEMS`): the model; the model without the grammar mask; an untrained model (same config, seeded
random weights); an n-gram model fitted on the training split (`musicrel.ngram`); the motif repeated; and real
music, the `seconds` that follow the reference, scored against it (the ceiling; pieces long enough only).

Per piece, a system's scores are averaged over its seeds; a figure's 95 % interval is a percentile bootstrap
over pieces with a fixed seed, so a report is reproducible. The density ratio is averaged geometrically (the
mean of its logarithm): an arithmetic mean of ratios reads 1.25 for one piece at 2x and one at 0.5x. The
per-piece values are kept (aligned by piece, None where a system has no value) so two systems can be compared
on the same pieces (`paired_difference`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pretty_midi

from musicrel.errors import MusicrelError

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
MAJOR_PROFILE = np.array([6.35, 2.23, 3.48, 2.33, 4.38, 4.09, 2.52, 5.19, 2.39, 3.66, 2.29, 2.88])
MINOR_PROFILE = np.array([6.33, 2.68, 3.52, 5.38, 2.60, 3.53, 2.54, 4.75, 3.98, 2.69, 3.34, 3.17])
PITCH_NAMES = ("C", "C#", "D", "Eb", "E", "F", "F#", "G", "Ab", "A", "Bb", "B")

SYSTEMS = ("model", "model-no-grammar", "untrained", "ngram", "repeat-motif", "real-music")
GENERATED = SYSTEMS[:4]  # systems that write token streams (scored for grammar, drawn as piano rolls)
MIN_PIECES = 100  # fewer pieces than this and the report warns that its intervals are wide
EXAMPLES = 4  # pieces drawn as piano rolls
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
    Metric("grammar_error", "grammar errors", "lower", tokens=True),
    Metric("restrikes", "re-strikes", "", tokens=True),
)


class EvaluationError(MusicrelError, ValueError):
    """Evaluation settings or inputs that cannot be used (no pieces, unknown system, bad numbers)."""

    code = "invalid_evaluation"


# ----------------------------------------------------------------------------------------------------------
# Statistics of one note list


def pitch_class_histogram(notes, weight: str = "count") -> np.ndarray:
    """(12,) share of notes per pitch class, or of sounding time with weight="duration" (zeros: no notes)."""
    w = [n.end - n.start for n in notes] if weight == "duration" else None
    counts = np.bincount([n.pitch % 12 for n in notes], weights=w, minlength=12).astype(np.float64)
    return counts / counts.sum() if counts.sum() > 0 else counts


def _histogram(values, edges) -> np.ndarray:
    counts = np.histogram(values, bins=edges)[0].astype(np.float64)
    return counts / counts.sum() if counts.sum() else counts


def inter_onset_intervals(notes) -> np.ndarray:
    """Gaps between successive distinct onsets (chord notes share an onset), in seconds."""
    onsets = np.unique(np.round([n.start for n in notes], 2))
    return np.diff(onsets)


def ioi_histogram(notes) -> np.ndarray:
    return _histogram(inter_onset_intervals(notes), IOI_EDGES)


def duration_histogram(notes) -> np.ndarray:
    return _histogram([n.end - n.start for n in notes], DURATION_EDGES)


def velocity_histogram(notes) -> np.ndarray:
    return _histogram([n.velocity for n in notes], VELOCITY_EDGES)


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


def key_profile(key: tuple[int, str]) -> np.ndarray:
    """(12,) Krumhansl-Kessler profile of (tonic pitch class, "major" | "minor"), indexed by pitch class."""
    tonic, mode = key
    return np.roll(MAJOR_PROFILE if mode == "major" else MINOR_PROFILE, tonic)


def _correlation(a: np.ndarray, b: np.ndarray) -> float:
    if np.std(a) == 0 or np.std(b) == 0:
        return math.nan
    return float(np.corrcoef(a, b)[0, 1])


def find_key(notes) -> tuple[int, str] | None:
    """Krumhansl-Schmuckler: the (tonic, mode) whose profile correlates best with the duration-weighted
    pitch-class histogram; None when the notes give no histogram to correlate (none, or all classes equal)."""
    hist = pitch_class_histogram(notes, weight="duration")
    if np.std(hist) == 0:
        return None
    keys = [(tonic, mode) for mode in ("major", "minor") for tonic in range(12)]
    return max(keys, key=lambda k: _correlation(hist, key_profile(k)))


def key_name(key: tuple[int, str] | None) -> str | None:
    return None if key is None else f"{PITCH_NAMES[key[0]]} {key[1]}"


def key_correlation(notes, key: tuple[int, str] | None) -> float:
    """Correlation (-1..1) of the notes' duration-weighted pitch-class histogram with `key`'s profile: how
    well they stay in the key (NaN without a key or notes)."""
    if key is None:
        return math.nan
    return _correlation(pitch_class_histogram(notes, weight="duration"), key_profile(key))


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


def grammar_errors(codec, tokens, sounding: np.ndarray | None = None) -> dict[str, int]:
    """Counts of grammar violations in a generated token stream (`GRAMMAR_ERRORS`: note-offs of pitches not
    sounding, special tokens, ids outside the vocabulary) and, for information, of re-strikes ("restrike": a
    note-on of a sounding pitch, which the codec decodes as close-and-restart: legal). `sounding` (128,) bool:
    the notes open when the stream starts (those the primer leaves sounding at its cut; default none)."""
    sounding = np.zeros(128, dtype=bool) if sounding is None else np.array(sounding, dtype=bool)
    counts = dict.fromkeys((*GRAMMAR_ERRORS, "restrike"), 0)
    specials = {codec.pad_id, codec.bos_id, codec.eos_id}
    for t in np.asarray(tokens, dtype=np.int64).tolist():
        if not 0 <= t < codec.vocab_size:
            counts["out_of_vocab"] += 1
        elif t in specials:
            counts["special_token"] += 1
        elif codec.is_note_on(t):
            p = t - codec.note_on_offset
            counts["restrike"] += int(sounding[p])
            sounding[p] = True
        elif codec.is_note_off(t):
            p = t - codec.note_off_offset
            counts["orphan_note_off"] += int(not sounding[p])
            sounding[p] = False
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
# Pieces and the simple systems


def window(notes, start: float, seconds: float) -> list:
    """The notes that start in [start, start + seconds), moved to time 0 and clipped to the window."""
    return [
        pretty_midi.Note(n.velocity, n.pitch, n.start - start, min(n.end - start, seconds))
        for n in notes
        if start <= n.start < start + seconds
    ]


def split_piece(notes, motif_seconds: float, seconds: float):
    """(motif notes in source time, clipped at the cut; reference notes from time 0; cut time)."""
    t0 = min(n.start for n in notes)
    cut = t0 + motif_seconds
    motif = [pretty_midi.Note(n.velocity, n.pitch, n.start, min(n.end, cut)) for n in notes if n.start < cut]
    return motif, window(notes, cut, seconds), cut


def repeat_motif(motif, seconds: float) -> list:
    """The baseline that plays the motif again and again from time 0 for `seconds`."""
    t0 = min(n.start for n in motif)
    period = max(max(n.end for n in motif) - t0, 0.01)
    out, k = [], 0
    while k * period < seconds:
        for n in motif:
            start = n.start - t0 + k * period
            if start < seconds:
                out.append(
                    pretty_midi.Note(n.velocity, n.pitch, start, min(n.end - t0 + k * period, seconds))
                )
        k += 1
    return out


@dataclass
class Piece:
    path: str
    motif: list  # notes before the cut, clipped at it (source time)
    reference: list  # the truth: notes of [cut, cut + seconds), from time 0
    # notes of [cut + seconds, cut + 2 seconds) from time 0 (real music); None when the piece ends sooner
    after: list | None
    primer: object  # musicrel.primer.Primer ending at the cut
    key: tuple[int, str] | None  # the motif's key


def held_out_files(folder: Path, split: str = "test") -> list[Path]:
    """The `split` files of a prepared data folder (its manifest.json), else every MIDI file under folder."""
    from musicrel.files import find_midi_files

    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return find_midi_files(folder)
    splits = json.loads(manifest.read_text()).get("splits", {})
    if split not in splits:
        raise EvaluationError(f"{manifest} has no split {split!r} (has {sorted(splits)})", code="no_input")
    return [Path(f["path"]) for f in splits[split].get("files", [])]


def load_pieces(model, codec, files, motif_seconds: float, seconds: float, limit: int | None):
    """(pieces, skipped counts by code): the first `limit` files that sound through motif + reference."""
    from musicrel.primer import default_max_primer_tokens, primer_at_cut

    pieces, skipped = [], {}
    for path in files:
        if limit is not None and len(pieces) >= limit:
            break
        try:
            notes = codec.to_notes(codec.read(path))
        except (MusicrelError, OSError) as exc:
            code = getattr(exc, "code", "unreadable")
            skipped[code] = skipped.get(code, 0) + 1
            continue
        motif, reference, cut = split_piece(notes, motif_seconds, seconds)
        end = max(n.end for n in notes)
        # A piece that ends inside the reference window would be scored against a fragment (its density
        # against a whole continuation's, say): only pieces that sound to the window's end count.
        if not reference or end < cut + seconds:
            skipped["too_short"] = skipped.get("too_short", 0) + 1
            continue
        after = window(notes, cut + seconds, seconds) if end >= cut + 2 * seconds else None
        # Notes sounding at the cut stay open and the continuation starts at the cut, as the reference does.
        primer = primer_at_cut(codec, notes, cut, motif_seconds, max_tokens=default_max_primer_tokens(model))
        pieces.append(Piece(str(path), motif, reference, after, primer, find_key(motif)))
    return pieces, skipped


# ----------------------------------------------------------------------------------------------------------
# Sampling the systems


def _sample_unmasked(model, codec, jobs, num_samples: int) -> list[list[np.ndarray]]:
    """The trained model sampled like `generate_batch` samples it (same settings, same per-row seeds) but
    without the grammar: a row stops once its time shifts reach params.seconds. The jobs share their
    settings but for the seed. Tokens per job and sample."""
    import torch

    from musicrel.codec import shift_steps
    from musicrel.generate import generate
    from musicrel.sampling import TOKENS_PER_SECOND_CAP, row_seed

    steps = shift_steps(codec)
    rows = [(j, s) for j in range(len(jobs)) for s in range(num_samples)]
    params = [jobs[j][1] for j, _ in rows]
    primers = [np.asarray(jobs[j][0].tokens, dtype=np.int64) for j, _ in rows]
    P = max(len(p) for p in primers)
    prompt = torch.full((len(rows), P), codec.pad_id, dtype=torch.long)
    for r, p in enumerate(primers):
        prompt[r, P - len(p) :] = torch.as_tensor(p)
    device = next(model.parameters()).device
    limit = math.ceil(params[0].seconds * 1000.0 / codec.config.step_ms - 1e-9)
    max_new = int(params[0].seconds * TOKENS_PER_SECOND_CAP) + 64
    it = generate(
        model,
        prompt.to(device),
        max_new,
        left_pad=torch.tensor([P - len(p) for p in primers], device=device),
        temperature=params[0].temperature,
        top_k=params[0].top_k,
        top_p=params[0].top_p,
        generators=[
            torch.Generator().manual_seed(row_seed(params[r].seed, s)) for r, (_, s) in enumerate(rows)
        ],
    )
    out: list[list[int]] = [[] for _ in rows]
    elapsed = [0] * len(rows)
    live = list(range(len(rows)))  # generate's rows, in order, once finished rows are dropped
    try:
        token = next(it)
        while True:
            for r, t in zip(live, token.tolist(), strict=True):
                out[r].append(t)
                elapsed[r] += int(steps[t])
            keep = [elapsed[r] < limit and len(out[r]) < max_new for r in live]
            if not any(keep):
                break
            live = [r for r, k in zip(live, keep, strict=True) if k]
            token = next(it) if all(keep) else it.send(torch.tensor(keep))
    except StopIteration:
        pass
    finally:
        it.close()
    samples = [[np.zeros(0, dtype=np.int64)] * num_samples for _ in jobs]
    for (j, s), tokens in zip(rows, out, strict=True):
        samples[j][s] = np.asarray(tokens, dtype=np.int64)
    return samples


def _continuations(name: str, models: dict, ngram, codec, jobs) -> list[list[tuple[list, np.ndarray]]]:
    """System `name`'s continuations of the jobs: per job, (notes, tokens) of each sample."""
    from musicrel.batch import generate_batch
    from musicrel.primer import render
    from musicrel.sampling import row_seed

    if name in ("model", "untrained"):
        results = generate_batch(models[name], codec, jobs)
        return [
            [(pm.instruments[0].notes, tk) for pm, tk in zip(r.midis, r.tokens, strict=True)] for r in results
        ]
    n = jobs[0][1].num_samples
    if name == "ngram":
        # the same seed per sample as the models' rows, drawn by the n-gram's own numpy generator
        rows = [(primer, row_seed(params.seed, s)) for primer, params in jobs for s in range(n)]
        flat = ngram.sample(codec, rows, jobs[0][1].seconds)
        streams = [flat[j * n : (j + 1) * n] for j in range(len(jobs))]
    else:
        streams = _sample_unmasked(models["model"], codec, jobs, n)
    return [
        [(render(codec, primer, tk).instruments[0].notes, tk) for tk in samples]
        for (primer, _), samples in zip(jobs, streams, strict=True)
    ]


def _clip(notes, seconds: float) -> list:
    """The notes inside [0, seconds): every system is scored on the same window as the reference."""
    return [
        pretty_midi.Note(n.velocity, n.pitch, n.start, min(n.end, seconds))
        for n in notes
        if n.start < seconds
    ]


def _score_tokens(codec, piece: Piece, notes, tokens, seconds: float) -> dict[str, float]:
    from musicrel.codec import open_pitches

    counts = grammar_errors(codec, tokens, open_pitches(codec, piece.primer.tokens))
    return {
        **compare(_clip(notes, seconds), piece.reference, seconds, piece.key),
        "grammar_error": float(any(counts[k] for k in GRAMMAR_ERRORS)),
        "restrikes": float(counts["restrike"]),
    }


def _seed_mean(runs: list[dict[str, float]]) -> dict[str, float]:
    """A piece's score per metric: the mean over its seeds that have a value (NaN if none has)."""
    out = {}
    for m in METRICS:
        values = [r[m.name] for r in runs if m.name in r and not math.isnan(r[m.name])]
        out[m.name] = float(np.mean(values)) if values else math.nan
    return out


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


def _summary(per_piece: dict[str, list], names) -> dict:
    geometric = {m.name for m in METRICS if m.geometric}
    return {name: bootstrap_interval(per_piece[name], geometric=name in geometric) for name in names}


def paired_difference(report: dict, metric: str, a: str, b: str) -> dict[str, float | int | None]:
    """Mean of (a - b) over the pieces where both systems have a value of `metric`, with its bootstrap
    interval: a comparison on the same pieces, free of the spread between pieces."""
    va = report["systems"][a]["per_piece"][metric]
    vb = report["systems"][b]["per_piece"][metric]
    return bootstrap_interval([x - y for x, y in zip(va, vb, strict=True) if x is not None and y is not None])


def _json_value(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 6)


def _notes_json(notes, shift: float = 0.0) -> list[list]:
    return [[n.pitch, round(n.start - shift, 3), round(n.end - shift, 3), n.velocity] for n in notes]


# ----------------------------------------------------------------------------------------------------------
# The whole evaluation


def _parse_systems(systems) -> list[str]:
    names = list(SYSTEMS) if systems is None else [s.strip() for s in systems if s.strip()]
    unknown = [s for s in names if s not in SYSTEMS]
    if unknown or not names:
        raise EvaluationError(
            f"unknown systems {unknown} (choose from {', '.join(SYSTEMS)})", code="unknown_system"
        )
    return [s for s in SYSTEMS if s in names]


def _fit_ngram(codec, input_dir: Path, ngram_data, asked: bool):
    """(n-gram model or None, its description or the reason it is left out)."""
    from musicrel.ngram import NGramModel

    if ngram_data is None:
        if not (input_dir / "manifest.json").is_file():
            reason = "no prepared data folder to fit it on: --input is not one, and no --ngram-data was given"
            if asked:
                raise EvaluationError(f"ngram: {reason}", code="no_ngram_data")
            return None, reason
        ngram_data = input_dir
    t = time.perf_counter()
    try:
        ngram = NGramModel.from_prepared(ngram_data, codec)
    except MusicrelError as exc:
        if asked:
            raise
        return None, f"{ngram_data}: {exc}"
    return ngram, {
        "data": str(ngram_data),
        "split": "train",
        "order": ngram.order,
        "k": ngram.k,
        "ngrams": int(sum(len(k) for k in ngram.keys)),
        "fit_seconds": round(time.perf_counter() - t, 3),
    }


def evaluate_continuations(
    checkpoint,
    input_dir,
    motif_seconds: float = 10.0,
    seconds: float = 10.0,
    limit: int | None = None,
    seed: int = 0,
    seeds: int = 3,
    batch_size: int = 8,
    progress: bool = False,
    split: str = "test",
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    systems: Sequence[str] | None = None,
    ngram_data=None,
) -> dict:
    """Score the checkpoint's continuations of held-out pieces against the truth and the baselines.

    input_dir: a folder of MIDI files, or a prepared data folder (manifest.json of `musicrel prepare`), whose
    `split` files are used: pieces the model never trained on. temperature/top_k/top_p: the model's sampling
    settings (None: SamplingParams' defaults). systems: names from SYSTEMS (default all). ngram_data: the
    prepared folder whose train split the n-gram is fitted on (default: input_dir when it is one; else the
    n-gram is left out and the report says why). Returns the report (see README: layout)."""
    import torch
    from tqdm import tqdm

    from musicrel.checkpoint import load_codec, load_model
    from musicrel.model import MusicTransformer
    from musicrel.sampling import SamplingParams, row_seed

    if not (motif_seconds > 0 and seconds > 0):
        raise EvaluationError("motif_seconds and seconds must be > 0", code="invalid_params")
    for name, value in (("seeds", seeds), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise EvaluationError(f"{name} must be an integer >= 1, got {value!r}", code="invalid_params")
    names = _parse_systems(systems)
    sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    template = SamplingParams(seconds=seconds, **{k: v for k, v in sampling.items() if v is not None})
    input_dir = Path(input_dir)
    model = load_model(checkpoint)
    codec = load_codec(checkpoint)

    left_out: dict[str, str] = {}
    ngram, ngram_info = None, None
    if "ngram" in names:
        ngram, ngram_info = _fit_ngram(
            codec, input_dir, ngram_data, asked=systems is not None or ngram_data is not None
        )
        if ngram is None:
            left_out["ngram"], ngram_info = ngram_info, None
            names.remove("ngram")
    if not names:
        raise EvaluationError(f"no system left to run ({left_out})", code="unknown_system")

    files = held_out_files(input_dir, split)
    pieces, skipped = load_pieces(model, codec, files, motif_seconds, seconds, limit)
    if not pieces:
        raise EvaluationError(f"no usable pieces in {input_dir} (skipped: {skipped})", code="no_input")
    piece_seeds = [row_seed(seed, i) for i in range(len(pieces))]

    models = {"model": model}
    if "untrained" in names:
        with torch.random.fork_rng(devices=[]):  # seeded weights without touching the caller's generator
            torch.manual_seed(seed)
            models["untrained"] = MusicTransformer(model.cfg).eval()

    # runs[system][piece]: the scores of each seed; real music and the repeated motif need one run.
    runs: dict[str, list[list[dict]]] = {s: [[] for _ in pieces] for s in names}
    timings = dict.fromkeys(names, 0.0)
    examples: dict[int, list] = {}
    example_system = next((s for s in GENERATED if s in names), None)
    bar = tqdm(total=len(pieces) * len(names), disable=not progress, unit="piece", desc="evaluating")
    for b in range(0, len(pieces), batch_size):
        chunk = range(b, min(b + batch_size, len(pieces)))
        jobs = [(pieces[i].primer, replace(template, seed=piece_seeds[i], num_samples=seeds)) for i in chunk]
        for name in names:
            t = time.perf_counter()
            if name == "repeat-motif":
                for i in chunk:
                    p = pieces[i]
                    runs[name][i] = [compare(repeat_motif(p.motif, seconds), p.reference, seconds, p.key)]
            elif name == "real-music":
                for i in chunk:
                    p = pieces[i]
                    runs[name][i] = [] if p.after is None else [compare(p.after, p.reference, seconds, p.key)]
            else:
                outputs = _continuations(name, models, ngram, codec, jobs)
                for i, out in zip(chunk, outputs, strict=True):
                    runs[name][i] = [_score_tokens(codec, pieces[i], notes, tk, seconds) for notes, tk in out]
                    if name == example_system and i < EXAMPLES:
                        examples[i] = _clip(out[0][0], seconds)
            timings[name] += time.perf_counter() - t
            bar.update(len(chunk))
    bar.close()

    metric_names = {m.name for m in METRICS}
    report_systems = {}
    for name in names:
        kept = [m.name for m in METRICS if name in GENERATED or not m.tokens]
        per_piece = [_seed_mean(r) if r else dict.fromkeys(metric_names, math.nan) for r in runs[name]]
        values = {m: [_json_value(p[m]) for p in per_piece] for m in kept}
        report_systems[name] = {
            "pieces": sum(bool(r) for r in runs[name]),
            "seconds": round(timings[name], 3),
            "metrics": _summary(values, kept),
            "per_piece": values,
        }
    intrinsic = [m.name for m in METRICS if m.intrinsic]
    truth = [describe(p.reference, seconds, p.key) for p in pieces]
    truth_values = {m: [_json_value(t[m]) for t in truth] for m in intrinsic}

    warnings = []
    if len(pieces) < MIN_PIECES:
        warnings.append(f"only {len(pieces)} pieces (< {MIN_PIECES}): the intervals are wide")
    return {
        "checkpoint": str(checkpoint),
        "input": str(input_dir),
        "split": split if (input_dir / "manifest.json").is_file() else None,
        "motif_seconds": motif_seconds,
        "seconds": seconds,
        "seed": seed,
        "seeds": seeds,
        "sampling": {"temperature": template.temperature, "top_k": template.top_k, "top_p": template.top_p},
        "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "confidence": CONFIDENCE, "seed": BOOTSTRAP_SEED},
        "pieces": len(pieces),
        "files": [p.path for p in pieces],
        "keys": [key_name(p.key) for p in pieces],
        "skipped": skipped,
        "ngram": ngram_info,
        "left_out": left_out,
        "warnings": warnings,
        "metrics": {
            m.name: {"label": m.label, "better": m.better, "reference": m.intrinsic} for m in METRICS
        },
        "reference": {
            "pieces": len(pieces),
            "metrics": _summary(truth_values, intrinsic),
            "per_piece": truth_values,
        },
        "systems": report_systems,
        "examples": [
            {
                "file": pieces[i].path,
                "system": example_system,
                "motif": _notes_json(pieces[i].motif, shift=pieces[i].primer.end_time),
                "truth": _notes_json(pieces[i].reference),
                "continuation": _notes_json(notes),
            }
            for i, notes in sorted(examples.items())
        ],
    }


# ----------------------------------------------------------------------------------------------------------
# Output


def _cell(summary: dict, name: str) -> str:
    if summary["mean"] is None:
        return "-"
    if name == "grammar_error" or name.endswith(("_share", "repetition")):
        f = lambda x: f"{100 * x:.1f}%"  # noqa: E731
    elif name in ("range_diff", "restrikes", "polyphony_max"):
        f = lambda x: f"{x:.1f}"  # noqa: E731
    else:
        f = lambda x: f"{x:.2f}"  # noqa: E731
    return f"{f(summary['mean'])} [{f(summary['low'])},{f(summary['high'])}]"


def format_table(report: dict) -> str:
    """Metrics as rows, systems (and the truth) as columns: mean [95 % interval]."""
    head = (
        f"{report['pieces']} pieces x {report['seeds']} seeds, motif {report['motif_seconds']:g} s -> "
        f"continuation {report['seconds']:g} s; "
        f"mean [{100 * report['bootstrap']['confidence']:g} % bootstrap interval over pieces]"
    )
    lines = [head]
    if report["skipped"]:
        lines.append(f"skipped: {report['skipped']}")
    for name, reason in report["left_out"].items():
        lines.append(f"left out: {name}: {reason}")
    for warning in report["warnings"]:
        lines.append(f"warning: {warning}")
    arrows = {"higher": " ^", "lower": " v", "one": " ->1", "reference": " ~truth", "": ""}
    rows = [["", *report["systems"], "truth"]]
    rows.append(
        [
            "pieces",
            *(str(s["pieces"]) for s in report["systems"].values()),
            str(report["reference"]["pieces"]),
        ]
    )
    for name, meta in report["metrics"].items():
        truth = report["reference"]["metrics"].get(name)
        rows.append(
            [meta["label"] + arrows[meta["better"]]]
            + [
                _cell(s["metrics"][name], name) if name in s["metrics"] else "-"
                for s in report["systems"].values()
            ]
            + [_cell(truth, name) if truth else "-"]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    table = [
        " ".join(
            [row[0].ljust(widths[0])] + [c.rjust(w + 1) for c, w in zip(row[1:], widths[1:], strict=True)]
        )
        for row in rows
    ]
    table.insert(2, "-" * len(table[1]))
    lines += table
    timing = ", ".join(f"{n} {s['seconds']:.0f} s" for n, s in report["systems"].items())
    lines.append(f"time: {timing}")
    return "\n".join(lines)


def write_report(report: dict, out_dir) -> dict[str, Path]:
    """report.json, metrics.png and pianorolls.png in `out_dir` (created); returns their paths."""
    from musicrel.plots import plot_metrics, plot_pianorolls

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / "report.json",
        "metrics": out_dir / "metrics.png",
        "pianorolls": out_dir / "pianorolls.png",
    }
    paths["json"].write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
    plot_metrics(report, paths["metrics"])
    plot_pianorolls(report, paths["pianorolls"])
    return paths
