"""How musical are the continuations? Compare them with the true continuation of held-out pieces.

For each piece the first `motif_seconds` are the motif and the next `seconds` the reference (the truth;
`musicrel.evaluation.pieces`). Every system (`musicrel.evaluation.continuation_systems`) continues the motif
from the cut, `seeds` times, and each continuation is scored with the statistics of
`musicrel.evaluation.metrics` (`METRICS`, through `scoring.score`); `musicrel.evaluation.report` prints and
writes the result.

Per piece, a system's scores are averaged over its seeds, and every figure gets a bootstrap interval over
pieces. The per-piece values are kept (aligned by piece, None where a system has no value) so two systems can
be compared on the same pieces (`musicrel.evaluation.metrics.paired_difference`).

With a codec that has instruments, pieces and continuations are also read by instrument (`Piece`'s parts,
`musicrel.evaluation.ensemble`): the report adds the continuity and drum-groove rows and the classifier its
`instruments` family; the other figures read the pitched notes of every instrument merged.

`evaluate_continuations` reads as its three parts: `load_systems`, `_run`, `_report`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from musicrel.errors import is_int
from musicrel.evaluation.continuation_systems import (
    GENERATED,
    Systems,
    load_systems,
    repeat_motif,
    repeat_parts,
    system_continuations,
)
from musicrel.evaluation.ensemble import pitched, pooled_cases, with_parts
from musicrel.evaluation.metrics import METRICS, compare, describe
from musicrel.evaluation.pieces import (
    EvaluationError,
    Piece,
    file_sources,
    held_out_files,
    load_pieces,
    shift,
)
from musicrel.evaluation.scoring import (
    classified,
    clip,
    json_value,
    metrics_json,
    notes_json,
    report_head,
    report_settings,
    score,
    seed_mean,
    summaries,
)
from musicrel.evaluation.twosample import TREES, two_sample
from musicrel.generation.keys import key_label
from musicrel.generation.sampling import SamplingParams, derived_seed
from musicrel.midi.codec import open_pitches
from musicrel.midi.instruments import DRUMS
from musicrel.model.checkpoint import check_decode_weights, load_codec, load_model
from musicrel.model.weights import DEFAULT_DECODE_WEIGHTS

EXAMPLES = 4  # pieces drawn as piano rolls


@dataclass(frozen=True)
class EvaluationOptions:
    """What `evaluate_continuations` runs (the defaults of `musicrel evaluate-continuations`).

    split: the files of a prepared input folder to use (pieces the model never trained on); source: only
    that source's pieces of a multi-source one. temperature/top_k/top_p/shift_temperature: the model's
    sampling (None: SamplingParams' defaults). systems: names from SYSTEMS (None: all). ngram_data: the
    prepared folder whose train split the n-gram is fitted on (None: the input when it is one; else the
    n-gram is left out and the report says why). weights: how the model holds its weights while it decodes
    (DECODE_WEIGHTS; the service's default). trees: the size of each of the classifier's forests (a test
    on a few pieces fits fewer).
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
    trees: int = TREES

    def __post_init__(self) -> None:
        check_decode_weights(self.weights)
        if not (self.motif_seconds > 0 and self.seconds > 0):
            raise EvaluationError("motif_seconds and seconds must be > 0", code="invalid_params")
        for name in ("seeds", "batch_size", "trees"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise EvaluationError(f"{name} must be an integer >= 1, got {value!r}", code="invalid_params")
        self.sampling()  # its checks (GenerationError invalid_params) before any model loads

    def sampling(self) -> SamplingParams:
        """The model's sampling for a continuation of `seconds` (its seed and samples are set per piece)."""
        given = {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "shift_temperature": self.shift_temperature,
        }
        return SamplingParams(seconds=self.seconds, **{k: v for k, v in given.items() if v is not None})


def _run(codec, pieces: list[Piece], systems: Systems, options: EvaluationOptions, progress: bool):
    """Every system on every piece: (runs[system][piece], the scores of each seed; seconds per system; the
    example continuations drawn as piano rolls, by piece). Real music and the repeated motif need one run."""
    names, seconds, scored = systems.names, options.seconds, systems.scored
    template = options.sampling()
    piece_seeds = [derived_seed(options.seed, i) for i in range(len(pieces))]
    runs: dict[str, list[list[dict]]] = {s: [[] for _ in pieces] for s in names}
    # heard[system][piece]: the notes of each seed, for the real-vs-generated classifier and the audio;
    # parts[system][piece]: with instruments, each seed's notes by instrument (evaluation.ensemble)
    heard: dict[str, list[list]] = {s: [[] for _ in pieces] for s in names}
    parts: dict[str, list[list]] = {s: [[] for _ in pieces] for s in names}
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
            if name in ("repeat-motif", "real-music"):
                for i in chunk:
                    p = pieces[i]
                    notes, ensemble = _played(name, p, seconds)
                    heard[name][i] = [] if notes is None else [notes]
                    parts[name][i] = [] if ensemble is None else [ensemble]
                    runs[name][i] = [
                        scored(_with_parts(compare(n, p.reference, seconds, p.key), p, ensemble), n)
                        for n in heard[name][i]
                    ]
            else:
                outputs = system_continuations(name, systems.models, systems.ngram, codec, jobs)
                for i, out in zip(chunk, outputs, strict=True):
                    p = pieces[i]
                    heard[name][i] = [clip(notes, seconds) for notes, _, _ in out]
                    if p.motif_parts is not None:
                        parts[name][i] = [
                            {k: clip(ns, seconds) for k, ns in ensemble.items()} for _, _, ensemble in out
                        ]
                    # where a note-off is an orphan: the notes the primer leaves sounding (with
                    # instruments, per instrument: grammar_errors reads the primer itself)
                    primer = p.primer.tokens if p.motif_parts is not None else None
                    sounding = open_pitches(codec, p.primer.tokens) if primer is None else None
                    runs[name][i] = [
                        scored(
                            _with_parts(
                                score(codec, notes, p.reference, seconds, p.key, tk, sounding, primer),
                                p,
                                parts[name][i][k] if parts[name][i] else None,
                            ),
                            notes,
                        )
                        for k, ((_, tk, _), notes) in enumerate(zip(out, heard[name][i], strict=True))
                    ]
                    if name == example_system and i < EXAMPLES:
                        examples[i] = heard[name][i][0]
            timings[name] += time.perf_counter() - t
            bar.update(len(chunk))
    bar.close()
    return runs, timings, example_system, examples, heard, parts


def _example_drums(p: Piece, parts: dict, example: str, i: int) -> dict:
    """A model with instruments: an example's drum hits (the rolls draw them on a lane of their own: the
    pitched rows above leave them out), as the motif, the truth and each system's first continuation play
    them; {} for a piano model's report, which stays as it was."""
    if p.motif_parts is None:
        return {}

    def hits(ensemble: list) -> list:
        return notes_json(ensemble[0].get(DRUMS, []) if ensemble else [])

    continuations = {n: hits(runs[i]) for n, runs in parts.items()}
    return {
        "drums": {
            "motif": notes_json(p.motif_parts.get(DRUMS, [])),
            "truth": notes_json((p.reference_parts or {}).get(DRUMS, [])),
            "continuation": continuations.get(example, []),
            "continuations": continuations,
        }
    }


def _played(name: str, p: Piece, seconds: float) -> tuple[list | None, dict | None]:
    """(notes, parts) of the systems that need no run: the motif repeated (every instrument of it, on the
    motif's period), or the real music after the truth (None where the piece ends sooner)."""
    if name == "real-music":
        return p.after, p.after_parts
    if p.motif_parts is None:
        return repeat_motif(p.motif, seconds), None
    ensemble = repeat_parts(p.motif_parts, seconds)
    return pitched(ensemble), ensemble


def _with_parts(scores: dict, p: Piece, ensemble) -> dict:
    """`scores` with the instrument figures of a continuation's parts where the piece has parts (a codec with
    instruments): `ensemble.with_parts`."""
    if p.motif_parts is None:
        return scores
    return with_parts(scores, p.motif_parts, p.reference_parts, ensemble)


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
    systems = load_systems(model, codec, input_dir, options.systems, options.ngram_data, options.seed)
    files = held_out_files(input_dir, options.split, options.source)
    pieces, skipped = load_pieces(model, codec, files, options.motif_seconds, options.seconds, options.limit)
    if not pieces:
        raise EvaluationError(f"no usable pieces in {input_dir} (skipped: {skipped})", code="no_input")
    runs, timings, example_system, examples, heard, parts = _run(codec, pieces, systems, options, progress)
    head = report_head(checkpoint, options.weights, input_dir, options.split)
    ran = (timings, example_system, examples, heard, parts)
    return {**head, **_report(codec, pieces, skipped, systems, options, runs, ran, input_dir)}


def _classifier_parts(pieces, parts, seconds: float) -> dict:
    """What the classifier's `instruments` family reads (`twosample.two_sample`'s `parts`)."""
    return {
        "contexts": [p.motif_parts for p in pieces],
        "truths": [p.reference_parts for p in pieces],
        "systems": parts,
        # real music follows the truth: the truth's instruments are what it continues
        "real_contexts": {
            "real-music": [{i: shift(ns, seconds) for i, ns in p.reference_parts.items()} for p in pieces]
        },
    }


def _report(codec, pieces, skipped, systems: Systems, options: EvaluationOptions, runs, ran, input_dir: Path):
    """The report's figures: per system, each metric's summary and per-piece values; the truth's; the
    real-vs-generated classifier; examples. `ran`: the rest of what `_run` returns."""
    timings, example, examples, heard, parts = ran
    seconds, left_out = options.seconds, systems.left_out
    instruments = codec.instrument_offset is not None
    # a piano model's report is as it was: no instrument rows
    metrics = [m for m in METRICS if m.name not in left_out and (instruments or not m.instruments)]
    metric_names = {m.name for m in metrics}
    report_systems = {}
    for name in systems.names:
        kept = [m.name for m in metrics if name in GENERATED or not m.tokens]
        per_piece = [seed_mean(r) if r else dict.fromkeys(metric_names, math.nan) for r in runs[name]]
        values = {m: [json_value(p[m]) for p in per_piece] for m in kept}
        report_systems[name] = {
            "pieces": sum(bool(r) for r in runs[name]),
            "seconds": round(timings[name], 3),
            "metrics": summaries(values, kept),
            "per_piece": values,
        }
        if instruments:
            report_systems[name]["instrument_cases"] = pooled_cases(
                (p.motif_parts, p.reference_parts, e)
                for p, runs in zip(pieces, parts[name], strict=True)
                for e in runs
            )
    intrinsic = [m.name for m in metrics if m.intrinsic]
    truth = [systems.scored(describe(p.reference, seconds, p.key), p.reference) for p in pieces]
    truth_values = {m: [json_value(t[m]) for t in truth] for m in intrinsic}

    sources = file_sources(input_dir)[0]
    motifs = [shift(p.motif, p.primer.end_time) for p in pieces]
    classifier = classified(
        codec,
        input_dir,
        [p.path for p in pieces],
        lambda compositions: two_sample(
            motifs,
            [p.reference for p in pieces],
            heard,
            seconds,
            [options.source or sources.get(p.path) for p in pieces],
            compositions,
            # real music follows the truth, `seconds` after the motif: the truth is what it joins
            real_contexts={"real-music": [shift(p.reference, seconds) for p in pieces]},
            seed=options.seed,
            trees=options.trees,
            parts=_classifier_parts(pieces, parts, seconds) if instruments else None,
        ),
        left_out,
    )
    sampling = ("temperature", "top_k", "top_p", "shift_temperature")
    return {
        "motif_seconds": options.motif_seconds,
        "seconds": seconds,
        **report_settings(options, options.sampling(), sampling, len(pieces)),
        "files": [p.path for p in pieces],
        "keys": [None if p.key is None else key_label(p.key) for p in pieces],
        "skipped": skipped,
        "ngram": systems.ngram_info,
        "left_out": left_out,
        "metrics": metrics_json(metrics),
        "reference": {
            "pieces": len(pieces),
            "metrics": summaries(truth_values, intrinsic),
            "per_piece": truth_values,
        },
        "systems": report_systems,
        **({"two_sample": classifier} if classifier else {}),
        "examples": [
            {
                "file": pieces[i].path,
                "system": example,
                "motif": notes_json(pieces[i].motif, shift=pieces[i].primer.end_time),
                "truth": notes_json(pieces[i].reference),
                "continuation": notes_json(notes),
                # every system's first continuation, to hear beside the truth (musicrel.report_html)
                "continuations": {
                    n: notes_json(heard[n][i][0] if heard[n][i] else []) for n in systems.names
                },
                **_example_drums(pieces[i], parts, example, i),
            }
            for i, notes in sorted(examples.items())
        ],
    }
