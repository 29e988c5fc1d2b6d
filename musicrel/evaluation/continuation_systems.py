"""The systems `evaluate-continuations` compares (`SYSTEMS`), and how each continues a batch of motifs
(`system_continuations`): the model, with and without the grammar mask; an untrained model (same config,
seeded random weights); an n-gram fitted on a training split (`ngram`); the motif repeated (`repeat_motif`).
Real music needs no run: it is the piece's own. `load_systems` builds what a run needs (`Systems`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pretty_midi
import torch

from musicrel.data.prepared import is_prepared
from musicrel.errors import MusicrelError
from musicrel.evaluation.ensemble import Parts, midi_parts, pitched
from musicrel.evaluation.ngram import NGramModel
from musicrel.evaluation.novelty import NoveltyIndex, load_index
from musicrel.evaluation.pieces import EvaluationError
from musicrel.generation.decode import collect_rows, generate
from musicrel.generation.decode_batch import generate_batch
from musicrel.generation.join import Join
from musicrel.generation.primer import render, render_result
from musicrel.generation.sampling import row_seed
from musicrel.model.transformer import MusicTransformer

SYSTEMS = ("model", "model-no-grammar", "untrained", "ngram", "repeat-motif", "real-music")
GENERATED = SYSTEMS[:4]  # systems that write token streams (scored for grammar, drawn as piano rolls)


def repeat_motif(motif, seconds: float, span: tuple[float, float] | None = None) -> list:
    """The baseline that plays the motif again and again from time 0 for `seconds`. span: (start, end) of the
    stretch repeated (default the motif's first onset to its last note-off)."""
    t0, end = span if span is not None else (min(n.start for n in motif), max(n.end for n in motif))
    period = max(end - t0, 0.01)
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


def repeat_parts(motif: Parts, seconds: float) -> Parts:
    """`repeat_motif` of every instrument of the motif, all on the whole motif's period: the baseline keeps
    the motif's instruments and their parts' places in it."""
    every = [n for ns in motif.values() for n in ns]
    span = (min(n.start for n in every), max(n.end for n in every))
    return {i: repeat_motif(ns, seconds, span) for i, ns in motif.items()}


def heard_as(codec, pm, tokens) -> tuple[list, np.ndarray, Parts | None]:
    """(the notes the pitch figures read, the tokens, the parts or None) of a continuation rendered from
    `tokens`: with instruments, its tracks by instrument (`ensemble.midi_parts`) and their pitched notes
    merged; else its one track."""
    if codec.instrument_offset is None:
        return (pm.instruments[0].notes if pm.instruments else []), tokens, None
    parts = midi_parts(pm)
    return pitched(parts), tokens, parts


def sample_unmasked(model, codec, jobs, num_samples: int) -> list[list[np.ndarray]]:
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


def system_continuations(name: str, models: dict, ngram, codec, jobs) -> list[list[tuple]]:
    """System `name`'s continuations of the jobs: per job, (notes, tokens, parts) of each sample (`heard_as`:
    the parts None without instruments)."""
    if name in ("model", "untrained"):
        results = generate_batch(models[name], codec, jobs)
        return [
            [heard_as(codec, m, tk) for m, tk in zip(render_result(codec, p, r), r.tokens, strict=True)]
            for (p, _), r in zip(jobs, results, strict=True)
        ]
    n = jobs[0][1].num_samples
    if name == "ngram":
        # the same seed per sample as the models' rows, drawn by the n-gram's own numpy generator
        rows = [(primer, row_seed(params.seed, s)) for primer, params in jobs for s in range(n)]
        flat = ngram.sample(codec, rows, jobs[0][1].seconds)
        streams = [flat[j * n : (j + 1) * n] for j in range(len(jobs))]
    else:
        streams = sample_unmasked(models["model"], codec, jobs, n)
    return [
        [heard_as(codec, render(codec, primer, tk), tk) for tk in samples]
        for (primer, _), samples in zip(jobs, streams, strict=True)
    ]


def parse_systems(systems) -> list[str]:
    """The systems asked for, in SYSTEMS' order (None: all); EvaluationError unknown_system otherwise."""
    names = list(SYSTEMS) if systems is None else [s.strip() for s in systems if s.strip()]
    unknown = [s for s in names if s not in SYSTEMS]
    if unknown or not names:
        raise EvaluationError(
            f"unknown systems {unknown} (choose from {', '.join(SYSTEMS)})", code="unknown_system"
        )
    return [s for s in SYSTEMS if s in names]


def fit_ngram(codec, input_dir: Path, ngram_data, asked: bool):
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


def load_novelty(input_dir: Path, ngram_data) -> tuple[NoveltyIndex | None, str | None]:
    """The train split's novelty index of the prepared folder the evaluation names (--ngram-data, else
    --input), or None and why."""
    folder = ngram_data if ngram_data is not None else input_dir
    if not is_prepared(folder):
        return None, "no prepared data folder (--input or --ngram-data) whose novelty index to read"
    try:
        return load_index(folder), None
    except MusicrelError as exc:
        return None, f"{folder}: {exc}"


@dataclass
class Systems:
    """The systems one evaluation runs and what they need: the models, the n-gram, the novelty index."""

    names: list[str]
    models: dict
    ngram: NGramModel | None
    ngram_info: dict | None
    novelty: NoveltyIndex | None
    left_out: dict[str, str]  # system or metric -> why it is left out

    def scored(self, scores: dict, notes) -> dict:
        """`scores` with the longest stretch of `notes` copied from the training data, where it is known."""
        if self.novelty is not None:
            scores["copied_notes"] = float(self.novelty.longest_match(notes).notes)
        return scores


def load_systems(
    model, codec, input_dir: Path, systems: Sequence[str] | None, ngram_data, seed: int
) -> Systems:
    """The `systems` asked for (None: all that can run; the n-gram is left out, with the reason, when there
    is no training split to fit it on, unless asked for by name or by `ngram_data`)."""
    names = parse_systems(systems)
    left_out: dict[str, str] = {}
    ngram, ngram_info = None, None
    if "ngram" in names:
        asked = systems is not None or ngram_data is not None
        ngram, ngram_info = fit_ngram(codec, input_dir, ngram_data, asked=asked)
        if ngram is None:
            left_out["ngram"], ngram_info = ngram_info, None
            names.remove("ngram")
    if not names:
        raise EvaluationError(f"no system left to run ({left_out})", code="unknown_system")
    novelty, why = load_novelty(input_dir, ngram_data)
    if novelty is None:
        left_out["copied_notes"] = why
    models = {"model": model}
    if "untrained" in names:
        with torch.random.fork_rng(devices=[]):  # seeded weights without touching the caller's generator
            torch.manual_seed(seed)
            models["untrained"] = MusicTransformer(model.cfg).eval()
    return Systems(names, models, ngram, ngram_info, novelty, left_out)
