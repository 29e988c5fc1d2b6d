"""How musical are the continuations? Compare them with the true continuation of held-out pieces.

For each piece the first `motif_seconds` are the motif and the next `seconds` the reference (the truth). Every
system continues the motif from the cut, `seeds` times, and each continuation is scored with the statistics
of `musicrel.evaluation.metrics` (`METRICS`); `musicrel.evaluation.report` prints and writes the result.

Systems (`SYSTEMS`): the model; the model without the grammar mask; an untrained model (same config, seeded
random weights); an n-gram model fitted on the training split (`ngram`); the motif repeated; and real
music, the `seconds` that follow the reference, scored against it (the ceiling; pieces long enough only).

Per piece, a system's scores are averaged over its seeds, and every figure gets a bootstrap interval over
pieces. The per-piece values are kept (aligned by piece, None where a system has no value) so two systems can
be compared on the same pieces (`musicrel.evaluation.metrics.paired_difference`).

Over 400 lines: the pieces, the systems' runs over them and the report's fields share one indexing by piece
(`evaluate_continuations` reads as its three parts: `_systems`, `_run`, `_report`); the statistics and the
report's writing live in metrics.py and report.py.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pretty_midi
import torch
from tqdm import tqdm

from musicrel.data.compositions import CompositionsUnavailable, group_versions, shingles
from musicrel.data.prepared import MANIFEST, is_prepared, load_manifest
from musicrel.errors import MusicrelError, is_int
from musicrel.evaluation.metrics import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    CONFIDENCE,
    GRAMMAR_ERRORS,
    METRICS,
    bootstrap_interval,
    compare,
    describe,
    grammar_errors,
)
from musicrel.evaluation.ngram import NGramModel
from musicrel.evaluation.novelty import NoveltyIndex, load_index
from musicrel.evaluation.twosample import TwoSampleUnavailable, two_sample
from musicrel.generation.decode import collect_rows, generate
from musicrel.generation.decode_batch import generate_batch
from musicrel.generation.join import Join
from musicrel.generation.keys import find_key, key_label
from musicrel.generation.primer import default_max_primer_tokens, primer_at_cut, render, render_result
from musicrel.generation.sampling import SamplingParams, derived_seed, row_seed
from musicrel.midi.codec import open_pitches
from musicrel.midi.files import find_midi_files
from musicrel.model.checkpoint import DEFAULT_DECODE_WEIGHTS, check_decode_weights, load_codec, load_model
from musicrel.model.transformer import MusicTransformer

SYSTEMS = ("model", "model-no-grammar", "untrained", "ngram", "repeat-motif", "real-music")
GENERATED = SYSTEMS[:4]  # systems that write token streams (scored for grammar, drawn as piano rolls)
MIN_PIECES = 100  # fewer pieces than this and the report warns that its intervals are wide
EXAMPLES = 4  # pieces drawn as piano rolls


class EvaluationError(MusicrelError, ValueError):
    """Evaluation settings or inputs that cannot be used (no pieces, unknown system, bad numbers)."""

    code = "invalid_evaluation"


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
    primer: object  # musicrel.generation.primer.Primer ending at the cut
    key: tuple[int, str] | None  # the motif's key


def held_out_files(folder: Path, split: str = "test", source: str | None = None) -> list[Path]:
    """The `split` files (a comma list: `test,val`) of a prepared data folder (its manifest.json), those of
    one `source` of a multi-source folder if given; else every MIDI file under folder."""
    manifest = folder / MANIFEST
    if not is_prepared(folder):
        if source is not None:
            raise EvaluationError(f"a source needs a prepared data folder: {folder}", code="no_input")
        return find_midi_files(folder)
    splits = load_manifest(folder).get("splits", {})
    files = []
    for name in split.split(","):
        if name not in splits:
            raise EvaluationError(f"{manifest} has no split {name!r} (has {sorted(splits)})", code="no_input")
        files += splits[name].get("files", [])
    if source is not None:
        known = sorted({f.get("source") for info in splits.values() for f in info.get("files", [])} - {None})
        if source not in known:
            raise EvaluationError(f"{manifest} has no source {source!r} (has {known})", code="no_input")
        files = [f for f in files if f.get("source") == source]
    return [Path(f["path"]) for f in files]


def file_sources(folder: Path) -> tuple[dict[str, str], dict[str, str]]:
    """({file: source}, {file: its composition}) of a prepared folder's manifest; ({}, {}) for a plain folder.
    A composition is named by the first file of its versions (`musicrel.data.compositions`: ASAP has up to 29
    performances of one piece); files with no other version are not listed."""
    if not is_prepared(folder):
        return {}, {}
    info = load_manifest(folder)
    files = [f for split in info.get("splits", {}).values() for f in split.get("files", [])]
    groups = info.get("compositions", {}).get("multi_file", [])
    return (
        {f["path"]: f["source"] for f in files if f.get("source")},
        {path: group["files"][0] for group in groups for path in group["files"]},
    )


def piece_compositions(codec, folder: Path, paths: Sequence[str]) -> tuple[list[str], dict]:
    """Per piece (its path), the composition it is a version of, named by the path of its first version, and
    how they were found: {method, files, compositions, multi_file: [[the paths of one composition], ...]}.

    A prepared folder: the groups of its manifest (`musicrel prepare` found them over the whole corpus). A
    plain folder of MIDI: found here, among these pieces, from their notes as prepare finds them
    (`musicrel.data.compositions`; CompositionsUnavailable without datasketch). Folded by file instead, one
    performance of a piece on the training side taught the classifier the others: on ASAP's Haydn folder (54
    files, 10 pieces, all 10 found) real music read 86 % by file, 56 % by composition."""
    paths = [str(p) for p in paths]
    if is_prepared(folder):
        known = file_sources(folder)[1]
        comps, method = [known.get(p, p) for p in paths], "manifest"
    else:
        sets = []
        for path in paths:
            try:
                sets.append(shingles(codec, codec.encode(path)))
            except (MusicrelError, OSError):  # read before as a piece; an error here: it stays alone
                sets.append(set())
        comps, method = [paths[g] for g in group_versions(sets).group], "notes"
    members: dict[str, list[str]] = {}
    for path, comp in zip(paths, comps, strict=True):
        members.setdefault(comp, []).append(path)
    return comps, {
        "method": method,
        "files": len(paths),
        "compositions": len(members),
        "multi_file": [m for m in members.values() if len(m) > 1],
    }


def load_pieces(model, codec, files, motif_seconds: float, seconds: float, limit: int | None):
    """(pieces, skipped counts by code): the first `limit` files that sound through motif + reference."""
    pieces, skipped = [], {}
    for path in files:
        if limit is not None and len(pieces) >= limit:
            break
        try:
            # the truth (and the real music and the motif) as the codec renders the model's notes
            notes = codec.heard(codec.to_notes(codec.read(path)))
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
    without the grammar: a row stops once its time shifts reach params.seconds after the cut. It starts at
    the cut as every decoder does (`generation.join`: the primer's silence before the cut is covered first),
    so what it reads there is what the model with the grammar reads. The jobs share their settings but for
    the seed. Tokens per job and sample."""
    rows = [(j, s) for j in range(len(jobs)) for s in range(num_samples)]
    params = [jobs[j][1] for j, _ in rows]
    primers = [np.asarray(jobs[j][0].tokens, dtype=np.int64) for j, _ in rows]
    P = max(len(p) for p in primers)
    prompt = torch.full((len(rows), P), codec.pad_id, dtype=torch.long)
    for r, p in enumerate(primers):
        prompt[r, P - len(p) :] = torch.as_tensor(p)
    device = next(model.parameters()).device
    limit = params[0].limit_steps(codec.config.step_ms)
    join = Join(codec, [jobs[j][0].tail_steps for j, _ in rows], device)
    it = generate(
        model,
        prompt.to(device),
        params[0].token_budget(),  # generate stops there: every live row has drawn as many tokens
        left_pad=torch.tensor([P - len(p) for p in primers], device=device),
        temperature=params[0].temperature,
        top_k=params[0].top_k,
        top_p=params[0].top_p,
        shift_temperature=params[0].shift_temperature,
        shifts=slice(codec.time_shift_offset, codec.velocity_offset),
        generators=[
            torch.Generator().manual_seed(row_seed(params[r].seed, s)) for r, (_, s) in enumerate(rows)
        ],
        grammar=join,
    )
    try:
        out = collect_rows(it, len(rows), lambda: join.elapsed < limit)
    finally:
        it.close()
    samples = [[np.zeros(0, dtype=np.int64)] * num_samples for _ in jobs]
    for (j, s), tokens in zip(rows, out, strict=True):
        samples[j][s] = np.asarray(tokens, dtype=np.int64)
    return samples


def _continuations(name: str, models: dict, ngram, codec, jobs) -> list[list[tuple[list, np.ndarray]]]:
    """System `name`'s continuations of the jobs: per job, (notes, tokens) of each sample."""
    if name in ("model", "untrained"):
        results = generate_batch(models[name], codec, jobs)
        return [
            [(m.instruments[0].notes, tk) for m, tk in zip(render_result(codec, p, r), r.tokens, strict=True)]
            for (p, _), r in zip(jobs, results, strict=True)
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
    counts = grammar_errors(codec, tokens, open_pitches(codec, piece.primer.tokens))
    return {
        **compare(_clip(notes, seconds), piece.reference, seconds, piece.key),
        "grammar_error": float(any(counts[k] for k in GRAMMAR_ERRORS)),
        "restrikes": float(counts["restrike"]),
    }


def seed_mean(runs: list[dict[str, float]]) -> dict[str, float]:
    """A piece's score per metric: the mean over its seeds that have a value (NaN if none has)."""
    out = {}
    for m in METRICS:
        values = [r[m.name] for r in runs if m.name in r and not math.isnan(r[m.name])]
        out[m.name] = float(np.mean(values)) if values else math.nan
    return out


def _summary(per_piece: dict[str, list], names) -> dict:
    geometric = {m.name for m in METRICS if m.geometric}
    return {name: bootstrap_interval(per_piece[name], geometric=name in geometric) for name in names}


def json_value(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 6)


def _shift(notes, shift: float) -> list:
    """The notes moved `shift` seconds earlier (a motif in source time -> times relative to its cut)."""
    return [pretty_midi.Note(n.velocity, n.pitch, n.start - shift, n.end - shift) for n in notes]


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
    if ngram_data is None:
        if not is_prepared(input_dir):
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


def _load_novelty(input_dir: Path, ngram_data) -> tuple[NoveltyIndex | None, str | None]:
    """The train split's novelty index of the prepared folder the evaluation names (--ngram-data, else
    --input), or None and why."""
    folder = ngram_data if ngram_data is not None else input_dir
    if not is_prepared(folder):
        return None, "no prepared data folder (--input or --ngram-data) whose novelty index to read"
    try:
        return load_index(folder), None
    except MusicrelError as exc:
        return None, f"{folder}: {exc}"


@dataclass(frozen=True)
class EvaluationOptions:
    """What `evaluate_continuations` runs (the defaults of `musicrel evaluate-continuations`).

    split: the files of a prepared input folder to use (pieces the model never trained on); source: only
    that source's pieces of a multi-source one. temperature/top_k/top_p/shift_temperature: the model's
    sampling (None: SamplingParams' defaults). systems: names from SYSTEMS (None: all). ngram_data: the
    prepared folder whose train split the n-gram is fitted on (None: the input when it is one; else the
    n-gram is left out and the report says why). weights: how the model holds its weights while it decodes
    (DECODE_WEIGHTS; the service's default).
    """

    motif_seconds: float = 10.0
    seconds: float = 10.0
    limit: int | None = None
    seed: int = 0
    seeds: int = 3
    batch_size: int = 8
    split: str = "test"
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    shift_temperature: float | None = None
    systems: Sequence[str] | None = None
    ngram_data: str | Path | None = None
    source: str | None = None
    weights: str = DEFAULT_DECODE_WEIGHTS

    def __post_init__(self) -> None:
        check_decode_weights(self.weights)
        if not (self.motif_seconds > 0 and self.seconds > 0):
            raise EvaluationError("motif_seconds and seconds must be > 0", code="invalid_params")
        for name in ("seeds", "batch_size"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise EvaluationError(f"{name} must be an integer >= 1, got {value!r}", code="invalid_params")

    def sampling(self) -> SamplingParams:
        """The model's sampling for a continuation of `seconds` (its seed and samples are set per piece)."""
        given = {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "shift_temperature": self.shift_temperature,
        }
        return SamplingParams(seconds=self.seconds, **{k: v for k, v in given.items() if v is not None})


@dataclass
class _Systems:
    """The systems one evaluation runs and what they need: the models, the n-gram, the novelty index."""

    names: list[str]
    models: dict
    ngram: NGramModel | None
    ngram_info: dict | None
    novelty: NoveltyIndex | None
    left_out: dict[str, str]  # system or metric -> why it is left out

    def scored(self, scores: dict, notes) -> dict:
        if self.novelty is not None:
            scores["copied_notes"] = float(self.novelty.longest_match(notes).notes)
        return scores


def _systems(model, codec, input_dir: Path, options: EvaluationOptions) -> _Systems:
    names = _parse_systems(options.systems)
    left_out: dict[str, str] = {}
    ngram, ngram_info = None, None
    if "ngram" in names:
        asked = options.systems is not None or options.ngram_data is not None
        ngram, ngram_info = _fit_ngram(codec, input_dir, options.ngram_data, asked=asked)
        if ngram is None:
            left_out["ngram"], ngram_info = ngram_info, None
            names.remove("ngram")
    if not names:
        raise EvaluationError(f"no system left to run ({left_out})", code="unknown_system")
    novelty, why = _load_novelty(input_dir, options.ngram_data)
    if novelty is None:
        left_out["copied_notes"] = why
    models = {"model": model}
    if "untrained" in names:
        with torch.random.fork_rng(devices=[]):  # seeded weights without touching the caller's generator
            torch.manual_seed(options.seed)
            models["untrained"] = MusicTransformer(model.cfg).eval()
    return _Systems(names, models, ngram, ngram_info, novelty, left_out)


def _run(codec, pieces: list[Piece], systems: _Systems, options: EvaluationOptions, progress: bool):
    """Every system on every piece: (runs[system][piece], the scores of each seed; seconds per system; the
    example continuations drawn as piano rolls, by piece). Real music and the repeated motif need one run."""
    names, seconds, scored = systems.names, options.seconds, systems.scored
    template = options.sampling()
    piece_seeds = [derived_seed(options.seed, i) for i in range(len(pieces))]
    runs: dict[str, list[list[dict]]] = {s: [[] for _ in pieces] for s in names}
    # heard[system][piece]: the notes of each seed, for the real-vs-generated classifier and the audio
    heard: dict[str, list[list]] = {s: [[] for _ in pieces] for s in names}
    timings = dict.fromkeys(names, 0.0)
    examples: dict[int, list] = {}
    example_system = next((s for s in GENERATED if s in names), None)
    bar = tqdm(total=len(pieces) * len(names), disable=not progress, unit="piece", desc="evaluating")
    for b in range(0, len(pieces), options.batch_size):
        chunk = range(b, min(b + options.batch_size, len(pieces)))
        jobs = [
            (pieces[i].primer, replace(template, seed=piece_seeds[i], num_samples=options.seeds))
            for i in chunk
        ]
        for name in names:
            t = time.perf_counter()
            if name == "repeat-motif":
                for i in chunk:
                    p = pieces[i]
                    repeated = repeat_motif(p.motif, seconds)
                    runs[name][i] = [scored(compare(repeated, p.reference, seconds, p.key), repeated)]
                    heard[name][i] = [repeated]
            elif name == "real-music":
                for i in chunk:
                    p = pieces[i]
                    after = p.after
                    runs[name][i] = (
                        [] if after is None else [scored(compare(after, p.reference, seconds, p.key), after)]
                    )
                    heard[name][i] = [] if after is None else [after]
            else:
                outputs = _continuations(name, systems.models, systems.ngram, codec, jobs)
                for i, out in zip(chunk, outputs, strict=True):
                    heard[name][i] = [_clip(notes, seconds) for notes, _ in out]
                    runs[name][i] = [
                        scored(_score_tokens(codec, pieces[i], notes, tk, seconds), clipped)
                        for (notes, tk), clipped in zip(out, heard[name][i], strict=True)
                    ]
                    if name == example_system and i < EXAMPLES:
                        examples[i] = _clip(out[0][0], seconds)
            timings[name] += time.perf_counter() - t
            bar.update(len(chunk))
    bar.close()
    return runs, timings, example_system, examples, heard


def evaluate_continuations(
    checkpoint, input_dir, options: EvaluationOptions | None = None, progress: bool = False
) -> dict:
    """Score the checkpoint's continuations of held-out pieces against the truth and the baselines.

    input_dir: a folder of MIDI files, or a prepared data folder (manifest.json of `musicrel prepare`).
    Returns the report (see docs/EVALUATION.md: layout)."""
    options = options or EvaluationOptions()
    input_dir = Path(input_dir)
    model = load_model(checkpoint, weights=options.weights)
    codec = load_codec(checkpoint)
    systems = _systems(model, codec, input_dir, options)
    files = held_out_files(input_dir, options.split, options.source)
    pieces, skipped = load_pieces(model, codec, files, options.motif_seconds, options.seconds, options.limit)
    if not pieces:
        raise EvaluationError(f"no usable pieces in {input_dir} (skipped: {skipped})", code="no_input")
    runs, timings, example_system, examples, heard = _run(codec, pieces, systems, options, progress)
    split = options.split if is_prepared(input_dir) else None
    head = {
        "checkpoint": str(checkpoint),
        "weights": options.weights,
        "input": str(input_dir),
        "split": split,
    }
    ran = (timings, example_system, examples, heard)
    return {**head, **_report(codec, pieces, skipped, systems, options, runs, ran, input_dir)}


def _report(
    codec, pieces, skipped, systems: _Systems, options: EvaluationOptions, runs, ran, input_dir: Path
):
    """The report's figures: per system, each metric's summary and per-piece values; the truth's; the
    real-vs-generated classifier; examples. `ran`: the rest of what `_run` returns."""
    timings, example, examples, heard = ran
    seconds, left_out = options.seconds, systems.left_out
    metrics = [m for m in METRICS if m.name not in left_out]
    metric_names = {m.name for m in metrics}
    report_systems = {}
    for name in systems.names:
        kept = [m.name for m in metrics if name in GENERATED or not m.tokens]
        per_piece = [seed_mean(r) if r else dict.fromkeys(metric_names, math.nan) for r in runs[name]]
        values = {m: [json_value(p[m]) for p in per_piece] for m in kept}
        report_systems[name] = {
            "pieces": sum(bool(r) for r in runs[name]),
            "seconds": round(timings[name], 3),
            "metrics": _summary(values, kept),
            "per_piece": values,
        }
    intrinsic = [m.name for m in metrics if m.intrinsic]
    truth = [systems.scored(describe(p.reference, seconds, p.key), p.reference) for p in pieces]
    truth_values = {m: [json_value(t[m]) for t in truth] for m in intrinsic}

    sources = file_sources(input_dir)[0]
    motifs = [_shift(p.motif, p.primer.end_time) for p in pieces]
    try:
        # performances of one composition share their notes: they stay on one side of every split
        compositions, grouping = piece_compositions(codec, input_dir, [p.path for p in pieces])
        classifier = two_sample(
            motifs,
            [p.reference for p in pieces],
            heard,
            seconds,
            [options.source or sources.get(p.path) for p in pieces],
            compositions,
            # real music follows the truth, `seconds` after the motif: the truth is what it joins
            real_contexts={"real-music": [_shift(p.reference, seconds) for p in pieces]},
            seed=options.seed,
        )
        classifier["grouping"] = grouping
    except (TwoSampleUnavailable, CompositionsUnavailable) as exc:
        classifier, left_out["two_sample"] = None, str(exc)

    warnings = []
    if len(pieces) < MIN_PIECES:
        warnings.append(f"only {len(pieces)} pieces (< {MIN_PIECES}): the intervals are wide")
    template = options.sampling()
    return {
        "source": options.source,
        "motif_seconds": options.motif_seconds,
        "seconds": seconds,
        "seed": options.seed,
        "seeds": options.seeds,
        "sampling": {
            "temperature": template.temperature,
            "top_k": template.top_k,
            "top_p": template.top_p,
            "shift_temperature": template.shift_temperature,
        },
        "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "confidence": CONFIDENCE, "seed": BOOTSTRAP_SEED},
        "pieces": len(pieces),
        "files": [p.path for p in pieces],
        "keys": [None if p.key is None else key_label(p.key) for p in pieces],
        "skipped": skipped,
        "ngram": systems.ngram_info,
        "left_out": left_out,
        "warnings": warnings,
        "metrics": {
            m.name: {"label": m.label, "better": m.better, "reference": m.intrinsic} for m in metrics
        },
        "reference": {
            "pieces": len(pieces),
            "metrics": _summary(truth_values, intrinsic),
            "per_piece": truth_values,
        },
        "systems": report_systems,
        **({"two_sample": classifier} if classifier else {}),
        "examples": [
            {
                "file": pieces[i].path,
                "system": example,
                "motif": _notes_json(pieces[i].motif, shift=pieces[i].primer.end_time),
                "truth": _notes_json(pieces[i].reference),
                "continuation": _notes_json(notes),
                # every system's first continuation, to hear beside the truth (musicrel.report_html)
                "continuations": {
                    n: _notes_json(heard[n][i][0] if heard[n][i] else []) for n in systems.names
                },
            }
            for i, notes in sorted(examples.items())
        ],
    }
