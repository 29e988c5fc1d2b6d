"""Does infilling work? `evaluate_infills` (`musicrel evaluate-infills`) cuts gaps of 4-8 s at several places
in held-out pieces, fills them, and scores every fill against the true gap (docs/INFILL.md, Evidence).

- `gap_nll`: the true gap's NLL read by the infill model twice, as an infill (the music after the gap, then
  before it: `generation.fim`'s layout) and as a continuation of the same past alone. A model that uses the
  future scores the true gap lower with it.
- Systems (`SYSTEMS`): the infill model (`infill`); the same checkpoint continuing the music before the gap,
  blind to what follows (`continuation`: the infill recipe trains one model that does both, so the pair
  isolates what the future adds, weights held equal); the stretch before the gap copied into it
  (`copy-before`). Each against the truth with `metrics.compare`, and the real-vs-generated classifier
  (`twosample.classify`) on twosample's features plus a family for the gap's end (`end_join_features`).
- Speed: each sample is decoded alone (batch 1) on the CPU: events per second and the real-time factor
  (seconds of gap filled per second of decoding).
- Per source, per piece: a piece's figure is the mean over its gaps (and seeds); intervals are bootstrap
  over pieces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pretty_midi
import torch
from tqdm import tqdm

from musicrel.data.compositions import CompositionsUnavailable
from musicrel.data.prepared import is_prepared
from musicrel.errors import MusicrelError, is_int, is_number
from musicrel.evaluation import twosample
from musicrel.evaluation.continuations import (
    MIN_PIECES,
    EvaluationError,
    file_sources,
    held_out_files,
    json_value,
    piece_compositions,
    seed_mean,
    window,
)
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
    histogram_overlap,
    paired_difference,
)
from musicrel.evaluation.twosample import (
    FOLDS,
    JOIN_SECONDS,
    TREES,
    TwoSampleUnavailable,
    auc_gain,
    classify,
    features,
)
from musicrel.generation.decode_batch import generate_batch
from musicrel.generation.fim import FUTURE, FUTURE_SHARE, GAP, PAST, fim_sequence
from musicrel.generation.infill import MAX_SPAN_SECONDS, InfillParams, check_model, infill, infill_segments
from musicrel.generation.keys import find_key, pitch_class_histogram
from musicrel.generation.primer import default_max_primer_tokens, primer_at_cut, render_result
from musicrel.generation.sampling import SamplingParams, derived_seed
from musicrel.midi.codec import open_pitches
from musicrel.model.checkpoint import DEFAULT_DECODE_WEIGHTS, check_decode_weights, load_codec, load_model

DEFAULT_CHECKPOINT = "checkpoints/infill"
SYSTEMS = ("infill", "continuation", "copy-before")
MODEL_SYSTEMS = ("infill", "continuation")  # systems that write tokens (scored for grammar too)
SYSTEM_NOTES = {
    "infill": "the infill model, hearing the music before and after the gap",
    "continuation": "the same checkpoint continuing the music before the gap, blind to what follows it",
    "copy-before": "the stretch before the gap, as long as the gap, copied into it",
}
AFTER_SECONDS = 4.0  # the music after the gap that the end's join features read
AFTER_MIN_SECONDS = 1.0  # a gap ends at least this long before the piece's last onset
EXAMPLES = 3  # gaps drawn as piano rolls (the first of each of the first pieces)
EXAMPLE_CONTEXT = 6.0  # seconds of music before and after a gap in the examples
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


@torch.inference_mode()
def _token_nll(model, tokens: np.ndarray, scored: np.ndarray) -> float:
    """Mean negative log-likelihood (nats per token) of tokens[scored] given everything before each."""
    device = next(model.parameters()).device
    x = torch.as_tensor(tokens, dtype=torch.long, device=device)[None]
    logits = model(x[:, :-1])[0].float()  # position j predicts token j + 1
    logp = torch.log_softmax(logits, dim=-1)
    targets = x[0, 1:]
    nll = -logp.gather(1, targets[:, None]).squeeze(1)
    mask = torch.as_tensor(np.asarray(scored[1:], dtype=bool), device=device)
    return float(nll[mask].mean())


def gap_nll(model, codec, midi, start: float, end: float) -> dict:
    """The NLL of the true tokens of [start, end) of `midi` in nats per token, `{"nll": {"with_future",
    "past_only"}, "gap_tokens", "past_tokens", "future_tokens"}`. Both readings hold the same past tokens (the
    end of the past that fits beside the future in the model's window) and score the same gap tokens (the
    gap's first ones when it does not fit whole); the past-only one has no markers: a continuation, as a
    model without infill tokens would read it."""
    check_model(model, codec)
    seg = infill_segments(codec, midi, start, end)
    window = model.cfg.max_seq_len
    gap = seg.gap[: max(1, window // 2)]
    seq = fim_sequence(
        codec,
        seg.past,
        seg.future,
        seg.gap_steps,
        gap,
        max_tokens=window,
        future_tokens=int(window * FUTURE_SHARE),
        past_whole=True,
        future_whole=True,
    )
    past = seq.tokens[seq.roles == PAST]
    lead = [codec.bos_id] if not seq.past_cut else []
    plain = np.concatenate([lead, past, gap]).astype(np.int64)
    plain_scored = np.zeros(len(plain), dtype=bool)
    plain_scored[len(plain) - len(gap) :] = True
    with_future = _token_nll(model, seq.tokens, seq.roles == GAP)
    past_only = _token_nll(model, plain, plain_scored)
    return {
        "nll": {"with_future": with_future, "past_only": past_only},
        "gap_tokens": int(len(gap)),
        "past_tokens": int(len(past)),
        "future_tokens": int((seq.roles == FUTURE).sum()),
        "uniform": math.log(codec.vocab_size),
    }


# ----------------------------------------------------------------------------------------------------------
# evaluate-infills: options, gaps, systems


class InfillEvaluationError(EvaluationError):
    """evaluate-infills settings or inputs that cannot be used (bad gap lengths, cuts, seeds; no pieces)."""

    code = "invalid_evaluation"


def parse_gap_seconds(value) -> tuple[float, float]:
    """(shortest, longest) gap in seconds from "4,8", "6", 6 or (4, 8); InfillEvaluationError
    invalid_gap_seconds unless 0 < shortest <= longest <= MAX_SPAN_SECONDS."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        try:
            numbers = [float(p) for p in parts]
        except ValueError:
            numbers = []
    elif is_number(value):
        numbers = [float(value)]
    else:
        try:
            numbers = [float(v) if is_number(v) else math.nan for v in value]
        except TypeError:
            numbers = []
    if len(numbers) == 1:
        numbers *= 2
    if len(numbers) != 2 or not all(math.isfinite(x) for x in numbers):
        raise InfillEvaluationError(
            f"gap seconds must be one number or two (shortest,longest), got {value!r}",
            code="invalid_gap_seconds",
        )
    lo, hi = numbers
    if not 0 < lo <= hi <= MAX_SPAN_SECONDS:
        raise InfillEvaluationError(
            f"gap seconds must satisfy 0 < shortest <= longest <= {MAX_SPAN_SECONDS:g}, got {lo:g},{hi:g}",
            code="invalid_gap_seconds",
        )
    return lo, hi


@dataclass(frozen=True)
class InfillEvaluationOptions:
    """What `evaluate_infills` runs (the defaults of `musicrel evaluate-infills`).

    gap_seconds: each gap's length is drawn uniformly in [shortest, longest] ("4,8"); cuts: gaps per piece
    (one in each of `cuts` equal stretches of where a gap fits); seeds: samples per gap and system; seed: the
    base seed every gap's place and every sample derive theirs from; split/source: as evaluate-continuations
    reads a prepared folder; temperature/top_k/top_p: the model's sampling (None: SamplingParams'); weights:
    how the model holds its weights while it decodes and reads the gaps' NLL (DECODE_WEIGHTS)."""

    gap_seconds: tuple | str = (4.0, 8.0)
    cuts: int = 3
    seeds: int = 3
    seed: int = 0
    limit: int | None = None
    split: str = "test"
    source: str | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    weights: str = DEFAULT_DECODE_WEIGHTS

    def __post_init__(self) -> None:
        check_decode_weights(self.weights)
        object.__setattr__(self, "gap_seconds", parse_gap_seconds(self.gap_seconds))
        for name in ("cuts", "seeds", "limit"):
            value = getattr(self, name)
            if name == "limit" and value is None:
                continue
            if not is_int(value) or value < 1:
                raise InfillEvaluationError(
                    f"{name} must be an integer >= 1, got {value!r}", code="invalid_params"
                )
        if not is_int(self.seed):
            raise InfillEvaluationError(f"seed must be an integer, got {self.seed!r}", code="invalid_params")

    def sampling(self, seconds: float, seed: int) -> SamplingParams:
        """The continuation's settings for a gap of `seconds` (the infill's are the same numbers)."""
        given = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}
        given = {k: v for k, v in given.items() if v is not None}
        return SamplingParams(seconds=seconds, seed=seed, num_samples=1, **given)

    def infill_params(self, seed: int) -> InfillParams:
        s = self.sampling(1.0, seed)
        return InfillParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=seed, num_samples=1)


@dataclass
class Gap:
    """One gap cut from one piece, its music around it, and its seed."""

    piece: int  # index into the evaluation's pieces
    start: float
    end: float
    seed: int
    before: list  # the notes that start before `start`, clipped there, times relative to it (negative)
    truth: list  # the notes that start in [start, end), from 0, clipped to the gap
    after: list  # the notes that start in [end, end + AFTER_SECONDS), from 0 (the gap's end)
    copy: list  # the copy-before baseline: the notes that start in [start - L, start), moved L later
    key: tuple | None  # the music before's key

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class InfillPiece:
    path: str
    pm: object  # the PrettyMIDI the gaps are cut from
    notes: list  # the codec's notes (file time)


def _moved(notes, offset: float, clip_to: float | None = None) -> list:
    """Notes moved `offset` seconds later (clipped to end by `clip_to`)."""
    out = []
    for n in notes:
        s, e = n.start + offset, n.end + offset
        if clip_to is not None:
            e = min(e, clip_to)
        if e > s:
            out.append(pretty_midi.Note(n.velocity, n.pitch, s, e))
    return out


def copy_before(notes, start: float, seconds: float) -> list:
    """The baseline that copies the `seconds` before the gap into it: the notes that start in
    [start - seconds, start) moved `seconds` later, clipped to end by the gap's end; times from the gap's
    start."""
    stretch = [n for n in notes if start - seconds <= n.start < start]
    return _moved(stretch, seconds - start, clip_to=seconds)


def cut_gaps(notes, piece_seed: int, options: InfillEvaluationOptions, piece: int = 0) -> list[Gap]:
    """The gaps of one piece, a function of its notes and `piece_seed` only. Gap k's length is drawn in
    gap_seconds, its start in the k-th of `cuts` equal stretches of where it fits: after at least its own
    length of music (so the copy baseline copies a whole stretch) and before the last second of onsets
    (something to lead into). Cuts whose gap holds no note are dropped."""
    lo, hi = options.gap_seconds
    onsets = [n.start for n in notes]
    first, last = min(onsets), max(onsets)
    rng = np.random.default_rng(piece_seed)
    gaps = []
    for k in range(options.cuts):
        length = float(rng.uniform(lo, hi))
        u = float(rng.uniform())
        a, b = first + length, last - AFTER_MIN_SECONDS - length
        if b < a:
            continue
        start = round(a + (b - a) * (k + u) / options.cuts, 2)
        end = round(start + length, 2)
        truth = window(notes, start, end - start)
        if not truth:
            continue
        before = [
            pretty_midi.Note(n.velocity, n.pitch, n.start - start, min(n.end, start) - start)
            for n in notes
            if n.start < start
        ]
        after = [
            pretty_midi.Note(n.velocity, n.pitch, n.start - end, n.end - end)
            for n in notes
            if end <= n.start < end + AFTER_SECONDS
        ]
        gaps.append(
            Gap(
                piece=piece,
                start=start,
                end=end,
                seed=derived_seed(piece_seed, k),
                before=before,
                truth=truth,
                after=after,
                copy=copy_before(notes, start, end - start),
                key=find_key(before),
            )
        )
    return gaps


def load_infill_pieces(codec, files, options: InfillEvaluationOptions):
    """(pieces, gaps, skipped counts by code): the first `limit` files with at least one gap. A file's gaps
    depend on its place in `files` and the base seed only (not on --limit)."""
    pieces, gaps, skipped = [], [], {}
    for index, path in enumerate(files):
        if options.limit is not None and len(pieces) >= options.limit:
            break
        try:
            pm = codec.read(path)
            # the truth, the bars copied and the music around the gap as the codec renders the fillings
            notes = codec.heard(codec.to_notes(pm))
        except (MusicrelError, OSError) as exc:
            code = getattr(exc, "code", "unreadable")
            skipped[code] = skipped.get(code, 0) + 1
            continue
        cut = cut_gaps(notes, derived_seed(options.seed, index), options, piece=len(pieces))
        if not cut:
            skipped["too_short"] = skipped.get("too_short", 0) + 1
            continue
        pieces.append(InfillPiece(str(path), pm, notes))
        gaps += cut
    return pieces, gaps, skipped


# ----------------------------------------------------------------------------------------------------------
# The systems on one gap


def _relative(notes, start: float, seconds: float) -> list:
    """File-time notes -> from the gap's start, clipped to the gap."""
    return [
        pretty_midi.Note(n.velocity, n.pitch, n.start - start, min(n.end - start, seconds))
        for n in notes
        if start <= n.start < start + seconds and min(n.end - start, seconds) > n.start - start
    ]


def _infill_samples(model, codec, piece: InfillPiece, gap: Gap, options, speed: dict):
    """The infill model's `seeds` fills of the gap, one at a time (batch 1): (notes from the gap's start,
    tokens) each."""
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
        out.append((_relative(result.notes[0], gap.start, gap.seconds), np.asarray(result.tokens[0])))
    return out


def _continuation_samples(model, codec, piece: InfillPiece, gap: Gap, options, speed: dict):
    """The same model continuing the music before the gap, blind to what follows it: `seeds` continuations
    of the gap's length from its start, one at a time (batch 1)."""
    primer = primer_at_cut(
        codec,
        piece.notes,
        gap.start,
        gap.start - min(n.start for n in piece.notes) + 1.0,  # the whole past, as far as the window holds
        max_tokens=default_max_primer_tokens(model),
    )
    out = []
    for s in range(options.seeds):
        params = options.sampling(gap.seconds, derived_seed(gap.seed, s))
        [result] = generate_batch(model, codec, [(primer, params)])
        seconds = result.timings.get("prefill", 0.0) + result.timings.get("decode", 0.0)
        _timed(speed, len(result.tokens[0]), gap.seconds, seconds)
        notes = render_result(codec, primer, result)[0].instruments[0].notes
        out.append((_relative(notes, 0.0, gap.seconds), np.asarray(result.tokens[0]), primer.tokens))
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


def _scored(codec, gap: Gap, notes, tokens=None, sounding=None) -> dict:
    scores = compare(notes, gap.truth, gap.seconds, gap.key)
    if tokens is not None:
        counts = grammar_errors(codec, tokens, sounding)
        scores["grammar_error"] = float(any(counts[k] for k in GRAMMAR_ERRORS))
        scores["restrikes"] = float(counts["restrike"])
    return scores


# ----------------------------------------------------------------------------------------------------------
# The classifier, with a family for the gap's end


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


def gap_features(notes, gap: Gap) -> np.ndarray:
    """twosample's features of a gap's notes (the music before as the context) and the gap's end's."""
    return np.concatenate(
        [features(notes, gap.before, gap.seconds), end_join_features(notes, gap.after, gap.seconds)]
    )


def classifier(gaps: list[Gap], labels: list[str], comps: list[str], heard: dict, seed: int) -> dict:
    """The real-vs-generated test of every system, per source: `twosample.classify` on a matrix built here
    (a row per gap and sample, twosample's features plus the END_JOIN family); the folds keep a composition's
    gaps together. Each section also has `gain`: per baseline, how much harder the infill is to tell from the
    truth than it (`twosample.auc_gain`, paired by composition; > 0: the infill is harder to tell)."""
    truth_x = np.stack([gap_features(g.truth, g) for g in gaps])
    piece_of = [g.piece for g in gaps]
    sections: dict[str, dict] = {}
    names = twosample.feature_names() + END_JOIN_NAMES
    for source in dict.fromkeys(labels):
        idx = [i for i, s in enumerate(labels) if s == source]
        # the rows are gaps: "pieces" counts the pieces they were cut from
        pieces = len({piece_of[i] for i in idx})
        section: dict = {"pieces": pieces, "gaps": len(idx), "systems": {}, "left_out": {}}
        for name, runs in heard.items():
            samples = [
                np.stack([gap_features(n, gaps[i]) for n in runs[i]]) if runs[i] else np.zeros((0, 0))
                for i in idx
            ]
            cs = [comps[i] for i in idx]
            usable = len({c for c, s in zip(cs, samples, strict=True) if len(s)})
            if usable < TWO_SAMPLE_MIN:
                section["left_out"][name] = (
                    f"{usable} compositions with gaps (< {TWO_SAMPLE_MIN}): too few to fold"
                )
                continue
            section["systems"][name] = classify(truth_x[idx], samples, seed, cs, names)
        systems = section["systems"]
        if "infill" in systems:
            section["gain"] = {
                b: auc_gain(systems[b]["oof"], systems["infill"]["oof"]) for b in systems if b != "infill"
            }
        sections[source] = section
    return {
        "classifier": f"random forest ({TREES} trees), GroupKFold by composition ({FOLDS} folds at most)",
        "confidence": CONFIDENCE,
        "features": names,
        "rows": "gaps (several per piece), folded by composition",
        "sections": sections,
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
    speed: dict[str, dict] = {"infill": {}, "continuation": {}}
    nll = []
    bar = tqdm(total=len(gaps), disable=not progress, unit="gap", desc="evaluating infills")
    for i, gap in enumerate(gaps):
        piece = pieces[gap.piece]
        nll.append(gap_nll(model, codec, piece.pm, gap.start, gap.end))
        seg = infill_segments(codec, piece.pm, gap.start, gap.end)
        sounding = open_pitches(codec, seg.past)
        for notes, tokens in _infill_samples(model, codec, piece, gap, options, speed["infill"]):
            runs["infill"][i].append(_scored(codec, gap, notes, tokens, sounding))
            heard["infill"][i].append(notes)
        for notes, tokens, primer in _continuation_samples(
            model, codec, piece, gap, options, speed["continuation"]
        ):
            runs["continuation"][i].append(_scored(codec, gap, notes, tokens, open_pitches(codec, primer)))
            heard["continuation"][i].append(notes)
        runs["copy-before"][i] = [_scored(codec, gap, gap.copy)]
        heard["copy-before"][i] = [gap.copy]
        bar.update()
    bar.close()
    split = options.split if is_prepared(input_dir) else None
    head = {
        "checkpoint": str(checkpoint),
        "weights": options.weights,
        "input": str(input_dir),
        "split": split,
    }
    return {**head, **_report(codec, input_dir, options, pieces, gaps, skipped, runs, heard, nll, speed)}


def _per_piece(values: list, gaps: list[Gap], n_pieces: int) -> list:
    """Per piece, the mean of its gaps' finite values (None where it has none)."""
    out = []
    for p in range(n_pieces):
        v = [
            x
            for x, g in zip(values, gaps, strict=True)
            if g.piece == p and x is not None and math.isfinite(x)
        ]
        out.append(json_value(float(np.mean(v))) if v else None)
    return out


def _section(gaps, n_pieces, runs, nll) -> dict:
    """One source's figures: the NLL both ways, every system's metrics, the truth's, per piece."""
    reads = {k: _per_piece([r["nll"][k] for r in nll], gaps, n_pieces) for k in ("with_future", "past_only")}
    diff = [
        a - b if a is not None and b is not None else None
        for a, b in zip(reads["past_only"], reads["with_future"], strict=True)
    ]
    intervals = {k: bootstrap_interval(v) for k, v in reads.items()}
    geometric = {m.name for m in METRICS if m.geometric}
    systems = {}
    for name in SYSTEMS:
        kept = [m.name for m in METRICS if not m.index and (name in MODEL_SYSTEMS or not m.tokens)]
        per_gap = [seed_mean(r) for r in runs[name]]
        values = {m: _per_piece([g[m] for g in per_gap], gaps, n_pieces) for m in kept}
        systems[name] = {
            "pieces": sum(v is not None for v in values["pc_overlap"]),
            "gaps": sum(bool(r) for r in runs[name]),
            "metrics": {m: bootstrap_interval(values[m], geometric=m in geometric) for m in kept},
            "per_piece": values,
        }
    report = {"systems": systems}
    # the infill minus each baseline on the same pieces, for the figures compared with the truth
    systems["infill"]["paired"] = {
        b: {
            m.name: paired_difference(report, m.name, "infill", b)
            for m in METRICS
            if m.better in ("higher", "lower") and not m.intrinsic and not m.tokens
        }
        for b in SYSTEMS
        if b != "infill"
    }
    intrinsic = [m.name for m in METRICS if m.intrinsic and not m.index]
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


def _notes_json(notes, shift: float = 0.0) -> list[list]:
    return [[n.pitch, round(n.start + shift, 3), round(n.end + shift, 3), n.velocity] for n in notes]


def _report(codec, input_dir, options, pieces, gaps, skipped, runs, heard, nll, speed) -> dict:
    sources = file_sources(input_dir)[0]
    piece_labels = [options.source or sources.get(p.path) or "all" for p in pieces]
    sections = {}
    for source in dict.fromkeys(piece_labels):
        members = [k for k, s in enumerate(piece_labels) if s == source]
        renumber = {k: j for j, k in enumerate(members)}
        idx = [i for i, g in enumerate(gaps) if g.piece in renumber]
        local = [replace(gaps[i], piece=renumber[gaps[i].piece]) for i in idx]
        sections[source] = _section(
            local, len(members), {s: [runs[s][i] for i in idx] for s in SYSTEMS}, [nll[i] for i in idx]
        )
    left_out = {"copied_notes": "evaluate-infills reads no novelty index"}
    try:
        compositions, grouping = piece_compositions(codec, input_dir, [p.path for p in pieces])
        two = classifier(
            gaps,
            [piece_labels[g.piece] for g in gaps],
            [compositions[g.piece] for g in gaps],
            heard,
            options.seed,
        )
        two["grouping"] = grouping
    except (TwoSampleUnavailable, CompositionsUnavailable) as exc:
        two, left_out["two_sample"] = None, str(exc)
    warnings = []
    if len(pieces) < MIN_PIECES:
        warnings.append(f"only {len(pieces)} pieces (< {MIN_PIECES}): the intervals are wide")
    template = options.sampling(1.0, 0)
    return {
        "source": options.source,
        "gap_seconds": list(options.gap_seconds),
        "cuts": options.cuts,
        "seed": options.seed,
        "seeds": options.seeds,
        "sampling": {"temperature": template.temperature, "top_k": template.top_k, "top_p": template.top_p},
        "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "confidence": CONFIDENCE, "seed": BOOTSTRAP_SEED},
        "pieces": len(pieces),
        "files": [p.path for p in pieces],
        "gaps": [{"file": pieces[g.piece].path, "start": g.start, "end": g.end} for g in gaps],
        "skipped": skipped,
        "left_out": left_out,
        "warnings": warnings,
        "systems": {name: SYSTEM_NOTES[name] for name in SYSTEMS},
        "metrics": {
            m.name: {"label": m.label, "better": m.better, "reference": m.intrinsic}
            for m in METRICS
            if not m.index
        },
        "sources": sections,
        "speed": {name: _speed(s) for name, s in speed.items()},
        **({"two_sample": two} if two else {}),
        "examples": [
            {
                "file": pieces[g.piece].path,
                "start": g.start,
                "end": g.end,
                # times from the gap's start: the music before (negative), the gap, the music after (>= L)
                "before": _notes_json([n for n in g.before if n.start >= -EXAMPLE_CONTEXT]),
                "after": _notes_json([n for n in g.after if n.start < EXAMPLE_CONTEXT], shift=g.seconds),
                "truth": _notes_json(g.truth),
                "systems": {s: _notes_json(heard[s][i][0] if heard[s][i] else []) for s in SYSTEMS},
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
