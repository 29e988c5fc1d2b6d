"""Does infilling work? `evaluate_infills` (`musicrel evaluate-infills`) cuts gaps of 4-8 s at several places
in held-out pieces (`musicrel.evaluation.gaps`), fills them, and scores every fill against the true gap
(docs/INFILL.md, Evidence).

- The true gap's NLL read with and without the music after it (`musicrel.evaluation.gap_nll`).
- Systems (`SYSTEMS`): the infill model (`infill`); the same checkpoint continuing the music before the gap,
  blind to what follows (`continuation`: the infill recipe trains one model that does both, so the pair
  isolates what the future adds, weights held equal); the stretch before the gap copied into it
  (`copy-before`). Each against the truth with `scoring.score`, and the real-vs-generated classifier with a
  family for the gap's end (`musicrel.evaluation.gap_classifier`).
- Speed: each sample is decoded alone (batch 1) on the CPU: events per second and the real-time factor
  (seconds of gap filled per second of decoding).
- Per source, per piece: a piece's figure is the mean over its gaps (and seeds); intervals are bootstrap
  over pieces.
- With instruments (a codec that has them), a gap is also read by instrument (`gaps.GapParts`,
  `musicrel.evaluation.ensemble`), as evaluate-continuations reads a continuation: do the instruments that
  sound in the 5 s before the gap play in it where the truth has them play (`instrument_continuity`, and its
  cases pooled), do the drums keep the truth's rhythm (`drum_groove`), and the classifier's `instruments`
  family; the other figures read the pitched notes of every instrument merged.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pretty_midi
import torch
from tqdm import tqdm

from musicrel.evaluation import scoring
from musicrel.evaluation.ensemble import Parts, midi_parts, parts_of, pitched, pooled_cases, with_parts
from musicrel.evaluation.gap_classifier import classifier
from musicrel.evaluation.gap_nll import gap_nll
from musicrel.evaluation.gaps import (
    Gap,
    InfillEvaluationError,
    InfillEvaluationOptions,
    InfillPiece,
    load_infill_pieces,
    placing,
)
from musicrel.evaluation.metrics import METRICS as ALL_METRICS
from musicrel.evaluation.metrics import bootstrap_interval, describe, paired_difference
from musicrel.evaluation.pieces import file_sources, held_out_files, piece_primer
from musicrel.generation.decode_batch import generate_batch
from musicrel.generation.infill import check_model, infill, infill_segments
from musicrel.generation.primer import default_max_primer_tokens, primer_at_cut, render_result
from musicrel.generation.sampling import derived_seed
from musicrel.midi.codec import open_pitches
from musicrel.midi.instruments import instrument_of
from musicrel.model.checkpoint import load_codec, load_model

SYSTEMS = ("infill", "continuation", "copy-before")
MODEL_SYSTEMS = ("infill", "continuation")  # systems that write tokens (scored for grammar too)
SYSTEM_NOTES = {
    "infill": "the infill model, hearing the music before and after the gap",
    "continuation": "the same checkpoint continuing the music before the gap, blind to what follows it",
    "copy-before": "the stretch before the gap, as long as the gap, copied into it",
}
EXAMPLES = 3  # gaps drawn as piano rolls (the first of each of the first pieces)
EXAMPLE_CONTEXT = 6.0  # seconds of music before and after a gap in the examples

# A piano model's gap is scored as one stream: no figure per instrument (evaluation.ensemble).
PIANO_METRICS = tuple(m for m in ALL_METRICS if not m.instruments)


def _metrics(codec) -> tuple:
    """The report's figures: every one with instruments, the piano's without."""
    return ALL_METRICS if codec.instrument_offset is not None else PIANO_METRICS


# ----------------------------------------------------------------------------------------------------------
# The systems on one gap


def _relative(notes, start: float, seconds: float) -> list:
    """File-time notes -> from the gap's start, clipped to the gap."""
    return [
        pretty_midi.Note(n.velocity, n.pitch, n.start - start, min(n.end - start, seconds))
        for n in notes
        if start <= n.start < start + seconds and min(n.end - start, seconds) > n.start - start
    ]


def _relative_parts(parts: Parts, start: float, seconds: float) -> Parts:
    """`_relative` of each instrument's notes; instruments left with none dropped."""
    out = {i: _relative(ns, start, seconds) for i, ns in parts.items()}
    return {i: ns for i, ns in out.items() if ns}


def _infill_samples(model, codec, piece: InfillPiece, gap: Gap, options, speed: dict):
    """The infill model's `seeds` fills of the gap, one at a time (batch 1): (notes from the gap's start,
    tokens, the pitches sounding where they start, the tokens before them, the notes by instrument or None)
    each. With instruments the notes are the pitched ones (the drum track's left out, as the truth's are)
    and the parts every instrument's, drums too."""
    past = infill_segments(codec, piece.pm, gap.start, gap.end).past
    sounding = open_pitches(codec, past)
    out = []
    for s in range(options.seeds):
        result = infill(
            model,
            piece.pm,
            gap.start,
            gap.end,
            codec=codec,
            params=options.infill_params(derived_seed(gap.seed, s)),
        )
        _timed(speed, len(result.tokens[0]), gap.seconds, result.decode_seconds)
        notes, parts = result.notes[0], None
        if piece.parts is not None:  # each note's instrument: its track's in the answer
            tracks = result.midis[0].instruments
            played = [instrument_of(tracks[t].program, tracks[t].is_drum) for t in result.note_tracks[0]]
            parts = _relative_parts(parts_of(notes, played), gap.start, gap.seconds)
            notes = pitched(parts)
        else:
            notes = _relative(notes, gap.start, gap.seconds)
        out.append((notes, np.asarray(result.tokens[0]), sounding, past, parts))
    return out


def _continuation_samples(model, codec, piece: InfillPiece, gap: Gap, options, speed: dict):
    """The same model continuing the music before the gap, blind to what follows it: `seeds` continuations
    of the gap's length from its start, one at a time (batch 1), as `_infill_samples`'."""
    first = min(n.start for n in placing(piece.notes, piece.parts))
    past_seconds = gap.start - first + 1.0  # the whole past, as the window holds
    if piece.parts is None:
        primer = primer_at_cut(
            codec, piece.notes, gap.start, past_seconds, max_tokens=default_max_primer_tokens(model)
        )
    else:  # every instrument, each on a track of its own, as evaluate-continuations cuts a piece
        primer = piece_primer(codec, piece.parts, gap.start, past_seconds, model)
    sounding = open_pitches(codec, primer.tokens)
    out = []
    for s in range(options.seeds):
        params = options.sampling(gap.seconds, derived_seed(gap.seed, s))
        [result] = generate_batch(model, codec, [(primer, params)])
        seconds = result.timings.get("prefill", 0.0) + result.timings.get("decode", 0.0)
        _timed(speed, len(result.tokens[0]), gap.seconds, seconds)
        midi = render_result(codec, primer, result)[0]
        tokens = np.asarray(result.tokens[0])
        if piece.parts is None:
            notes = _relative(midi.instruments[0].notes, 0.0, gap.seconds)
            out.append((notes, tokens, sounding, primer.tokens, None))
            continue
        parts = _relative_parts(midi_parts(midi), 0.0, gap.seconds)
        out.append((pitched(parts), tokens, sounding, primer.tokens, parts))
    return out


def _timed(speed: dict, events: int, seconds: float, decode_seconds: float) -> None:
    speed["events"] = speed.get("events", 0) + events
    speed["gap_seconds"] = speed.get("gap_seconds", 0.0) + seconds
    speed["decode_seconds"] = speed.get("decode_seconds", 0.0) + decode_seconds
    speed["samples"] = speed.get("samples", 0) + 1


def _speed(speed: dict) -> dict:
    t = speed.get("decode_seconds", 0.0)
    return {
        "batch": 1,
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "samples": speed.get("samples", 0),
        "events": speed.get("events", 0),
        "gap_seconds": round(speed.get("gap_seconds", 0.0), 3),
        "decode_seconds": round(t, 3),
        "events_per_second": round(speed.get("events", 0) / t, 2) if t else None,
        "real_time_factor": round(speed.get("gap_seconds", 0.0) / t, 3) if t else None,
    }


# ----------------------------------------------------------------------------------------------------------
# The whole evaluation


def evaluate_infills(checkpoint, input_dir, options: InfillEvaluationOptions | None = None, progress=False):
    """Cut gaps in held-out pieces, fill them with the infill model and the baselines, score each against
    the true gap, and read the true gap's NLL with and without the music after it. input_dir: a folder of
    MIDI files or a prepared data folder (its `split`, `source`). Returns the report (docs/INFILL.md,
    Evidence)."""
    options = options or InfillEvaluationOptions()
    input_dir = Path(input_dir)
    model, codec = load_model(checkpoint, weights=options.weights), load_codec(checkpoint)
    check_model(model, codec)
    files = held_out_files(input_dir, options.split, options.source)
    pieces, gaps, skipped = load_infill_pieces(codec, files, options)
    if not gaps:
        raise InfillEvaluationError(f"no usable pieces in {input_dir} (skipped: {skipped})", code="no_input")
    runs: dict[str, list[list[dict]]] = {s: [[] for _ in gaps] for s in SYSTEMS}
    heard: dict[str, list[list]] = {s: [[] for _ in gaps] for s in SYSTEMS}
    # with instruments, each sample's notes by instrument (None without)
    parts: dict[str, list[list]] = {s: [[] for _ in gaps] for s in SYSTEMS}
    speed: dict[str, dict] = {"infill": {}, "continuation": {}}
    nll = []
    bar = tqdm(total=len(gaps), disable=not progress, unit="gap", desc="evaluating infills")
    for i, gap in enumerate(gaps):
        piece = pieces[gap.piece]
        nll.append(gap_nll(model, codec, piece.pm, gap.start, gap.end))
        samples = {
            "infill": _infill_samples(model, codec, piece, gap, options, speed["infill"]),
            "continuation": _continuation_samples(model, codec, piece, gap, options, speed["continuation"]),
            "copy-before": [(gap.copy, None, None, None, gap.parts and gap.parts.copy)],
        }
        for name, out in samples.items():
            for notes, tokens, sounding, before, ensemble in out:
                # with instruments, the tokens before the sample say what sounds and who plays where it starts
                primer = before if codec.instrument_offset is not None else None
                scores = scoring.score(
                    codec, notes, gap.truth, gap.seconds, gap.key, tokens, sounding, primer
                )
                if gap.parts is not None:
                    scores = with_parts(scores, gap.parts.before, gap.parts.truth, ensemble)
                runs[name][i].append(scores)
                heard[name][i].append(notes)
                parts[name][i].append(ensemble)
        bar.update()
    bar.close()
    head = scoring.report_head(checkpoint, options.weights, input_dir, options.split)
    report = _report(codec, input_dir, options, pieces, gaps, skipped, runs, (heard, parts), nll, speed)
    return {**head, **report}


def _per_piece(values: list, gaps: list[Gap], n_pieces: int) -> list:
    """Per piece, the mean of its gaps' finite values (None where it has none)."""
    out = []
    for p in range(n_pieces):
        v = [
            x
            for x, g in zip(values, gaps, strict=True)
            if g.piece == p and x is not None and math.isfinite(x)
        ]
        out.append(scoring.json_value(float(np.mean(v))) if v else None)
    return out


def _section(gaps, n_pieces, runs, nll, metrics, parts) -> dict:
    """One source's figures: the NLL both ways, every system's metrics, the truth's, per piece; with
    instruments (`parts`: each system's samples by instrument), the continuity cases pooled."""
    reads = {k: _per_piece([r["nll"][k] for r in nll], gaps, n_pieces) for k in ("with_future", "past_only")}
    diff = [
        a - b if a is not None and b is not None else None
        for a, b in zip(reads["past_only"], reads["with_future"], strict=True)
    ]
    intervals = {k: bootstrap_interval(v) for k, v in reads.items()}
    geometric = {m.name for m in metrics if m.geometric}
    systems = {}
    for name in SYSTEMS:
        kept = [m.name for m in metrics if not m.index and (name in MODEL_SYSTEMS or not m.tokens)]
        per_gap = [scoring.seed_mean(r) for r in runs[name]]
        values = {m: _per_piece([g[m] for g in per_gap], gaps, n_pieces) for m in kept}
        systems[name] = {
            # a piece with any figure (a drums-only piece has no pitch figure: its drums are scored)
            "pieces": sum(any(v is not None for v in row) for row in zip(*values.values(), strict=True)),
            "gaps": sum(bool(r) for r in runs[name]),
            "metrics": {m: bootstrap_interval(values[m], geometric=m in geometric) for m in kept},
            "per_piece": values,
        }
        if parts is not None:
            systems[name]["instrument_cases"] = pooled_cases(
                (g.parts.before, g.parts.truth, e)
                for g, runs in zip(gaps, parts[name], strict=True)
                for e in runs
            )
    report = {"systems": systems}
    # the infill minus each baseline on the same pieces, for the figures compared with the truth
    systems["infill"]["paired"] = {
        b: {
            m.name: paired_difference(report, m.name, "infill", b)
            for m in metrics
            if m.better in ("higher", "lower") and not m.intrinsic and not m.tokens
        }
        for b in SYSTEMS
        if b != "infill"
    }
    intrinsic = [m.name for m in metrics if m.intrinsic and not m.index]
    return {
        "pieces": n_pieces,
        "gaps": len(gaps),
        "nll": {
            "with_future": intervals["with_future"]["mean"],
            "past_only": intervals["past_only"]["mean"],
            "intervals": intervals,
            # > 0: the true gap is likelier with the music after it in view
            "difference": bootstrap_interval(diff),
            "per_piece": reads,
            "uniform": nll[0]["uniform"] if nll else None,
            "gap_tokens": int(sum(r["gap_tokens"] for r in nll)),
        },
        "systems": systems,
        "reference": {
            "pieces": n_pieces,
            "metrics": {
                m: bootstrap_interval(v)
                for m, v in {
                    m: _per_piece([describe(g.truth, g.seconds, g.key)[m] for g in gaps], gaps, n_pieces)
                    for m in intrinsic
                }.items()
            },
        },
    }


def _report(codec, input_dir, options, pieces, gaps, skipped, runs, samples, nll, speed) -> dict:
    heard, parts = samples
    instruments = codec.instrument_offset is not None
    metrics = _metrics(codec)
    sources = file_sources(input_dir)[0]
    piece_labels = [options.source or sources.get(p.path) or "all" for p in pieces]
    sections = {}
    for source in dict.fromkeys(piece_labels):
        members = [k for k, s in enumerate(piece_labels) if s == source]
        renumber = {k: j for j, k in enumerate(members)}
        idx = [i for i, g in enumerate(gaps) if g.piece in renumber]
        local = [replace(gaps[i], piece=renumber[gaps[i].piece]) for i in idx]
        sections[source] = _section(
            local,
            len(members),
            {s: [runs[s][i] for i in idx] for s in SYSTEMS},
            [nll[i] for i in idx],
            metrics,
            {s: [parts[s][i] for i in idx] for s in SYSTEMS} if instruments else None,
        )
    left_out = {"copied_notes": "evaluate-infills reads no novelty index"}
    two = scoring.classified(
        codec,
        input_dir,
        [p.path for p in pieces],
        lambda compositions: classifier(
            gaps,
            [piece_labels[g.piece] for g in gaps],
            [compositions[g.piece] for g in gaps],
            heard,
            options.seed,
            options.trees,
            parts if instruments else None,
        ),
        left_out,
    )
    sampling = ("temperature", "top_k", "top_p")
    notes_json = scoring.notes_json
    return {
        "gap_seconds": list(options.gap_seconds),
        "cuts": options.cuts,
        **scoring.report_settings(options, options.sampling(1.0, 0), sampling, len(pieces)),
        "files": [p.path for p in pieces],
        "gaps": [{"file": pieces[g.piece].path, "start": g.start, "end": g.end} for g in gaps],
        "skipped": skipped,
        "left_out": left_out,
        "systems": {name: SYSTEM_NOTES[name] for name in SYSTEMS},
        "metrics": scoring.metrics_json(m for m in metrics if not m.index),
        "sources": sections,
        "speed": {name: _speed(s) for name, s in speed.items()},
        **({"two_sample": two} if two else {}),
        "examples": [
            {
                "file": pieces[g.piece].path,
                "start": g.start,
                "end": g.end,
                # times from the gap's start: the music before (negative), the gap, the music after (>= L)
                "before": notes_json([n for n in g.before if n.start >= -EXAMPLE_CONTEXT]),
                "after": notes_json([n for n in g.after if n.start < EXAMPLE_CONTEXT], shift=-g.seconds),
                "truth": notes_json(g.truth),
                "systems": {s: notes_json(heard[s][i][0] if heard[s][i] else []) for s in SYSTEMS},
            }
            for i, g in ((i, gaps[i]) for i in _example_gaps(gaps))
        ],
    }


def _example_gaps(gaps: list[Gap]) -> list[int]:
    """The index of the first gap of each of the first EXAMPLES pieces."""
    firsts: dict[int, int] = {}
    for i, g in enumerate(gaps):
        firsts.setdefault(g.piece, i)
    return list(firsts.values())[:EXAMPLES]
