"""Infilling: regenerate the music of [start, end) of a file and keep everything else.

`infill_midi(model, midi, start, end, codec=..., params=...)` reads the file, writes the infill prompt of a
model with infill tokens (`CodecConfig.infill`; the layout is `generation.fim`'s: the music after the gap,
then before it, then the gap), decodes the gap with the continuation grammar through `decode.generate` (the
row's time limit is the gap's length, so the gap ends exactly at `end`) and merges the new notes into a copy
of the file. One file per sample.

The edge rules (what comes back unchanged, docs/INFILL.md):
- a note that starts before `start` is kept whole, as it was, even when it sounds into or across the gap; the
  model's prompt has it sounding (its note-on without its note-off), and a new note of its pitch while it
  sounds is dropped (or cut short where it would run into one).
- a note that starts in [start, end) is regenerated: removed, with its part after `end`. Its note-off after
  `end` is in the prompt's future, as in training, so the model knows a note of that pitch sounds there.
- a note that starts at or after `end` is kept. Drum notes, control changes, tempo and every other event are
  kept (the model writes no drums).
- new notes start in [start, end) and end by `end`. They join the file's instrument when it has one
  instrument with notes (drums aside); else they go to a track of their own, "infill", on the program that
  plays most notes around the gap (`primer.motif_program`).
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field

import numpy as np
import pretty_midi
import torch

from musicrel.errors import InfillError, is_number
from musicrel.generation.fim import FUTURE_SHARE, FimSequence, fim_sequence, split_at
from musicrel.generation.grammar import HOLD_FACTOR, MAX_HOLD_SECONDS, MIN_HOLD_SECONDS, Grammar
from musicrel.generation.primer import motif_program
from musicrel.generation.sampling import TOKENS_PER_SECOND_CAP, SamplingParams, draw_seed, row_seed

MAX_SPAN_SECONDS = 30.0
INFILL_TRACK = "infill"
PROGRAM_WINDOW_SECONDS = 10.0  # the new track's program: the one playing most notes this far around the gap


@dataclass
class InfillParams:
    """How to fill one gap. Validated on construction like SamplingParams (GenerationError)."""

    temperature: float = SamplingParams.temperature
    top_k: int | None = SamplingParams.top_k
    top_p: float = SamplingParams.top_p
    seed: int | None = SamplingParams.seed  # None: drawn and reported
    num_samples: int = SamplingParams.num_samples

    def __post_init__(self) -> None:
        checked = SamplingParams(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            seed=self.seed,
            num_samples=self.num_samples,
        )
        self.top_k, self.seed, self.num_samples = checked.top_k, checked.seed, checked.num_samples
        self.temperature, self.top_p = float(self.temperature), float(self.top_p)


@dataclass
class InfillResult:
    midis: list  # pretty_midi.PrettyMIDI per sample: the input with [start, end) regenerated
    notes: list  # the new pretty_midi.Notes per sample (file time)
    seed: int
    start: float
    end: float
    removed: int  # the input's notes that started in the gap
    prompt_tokens: int
    decode_seconds: float
    warnings: list = field(default_factory=list)


@dataclass
class InfillSegments:
    """A file cut for infilling: its event stream split at the gap's steps, and what rendering needs."""

    pm: pretty_midi.PrettyMIDI
    notes: list  # the codec's notes (drums dropped, tracks merged), file time
    past: np.ndarray
    gap: np.ndarray  # the true gap's tokens (evaluation scores them; infilling replaces them)
    future: np.ndarray
    start_step: int
    end_step: int

    @property
    def gap_steps(self) -> int:
        return self.end_step - self.start_step


def check_span(start, end) -> tuple[float, float]:
    """(start, end) as floats, or InfillError: numbers, 0 <= start < end, at most MAX_SPAN_SECONDS."""
    for name, value in (("start", start), ("end", end)):
        if not is_number(value):
            raise InfillError(
                f"{name} must be a finite number of seconds, got {value!r}", code="invalid_span"
            )
    start, end = float(start), float(end)
    if start < 0 or start >= end:
        raise InfillError(
            f"the span must satisfy 0 <= start < end, got {start:g}-{end:g} s", code="invalid_span"
        )
    if end - start > MAX_SPAN_SECONDS:
        raise InfillError(
            f"the span is {end - start:g} s; at most {MAX_SPAN_SECONDS:g} s can be regenerated at once",
            code="span_too_long",
        )
    return start, end


def check_model(model, codec) -> None:
    if codec.fill_id is None or model.cfg.vocab_size < codec.vocab_size:
        raise InfillError(
            "this model has no infill tokens (CodecConfig.infill); train one with data.infill_rate "
            "(configs/cpu-infill.yaml)",
            code="model_cannot_infill",
        )


def infill_segments(codec, midi, start: float, end: float) -> InfillSegments:
    """Read `midi` (path, bytes or PrettyMIDI) and cut its stream at the span (checked against the music)."""
    start, end = check_span(start, end)
    pm = codec.read(midi)
    notes = codec.to_notes(pm)  # InvalidMidiError no_notes when nothing is left
    first, last = min(n.start for n in notes), max(n.end for n in notes)
    if end <= first or start >= last:
        raise InfillError(
            f"the span {start:g}-{end:g} s is outside the music ({first:.2f}-{last:.2f} s)",
            code="span_outside_music",
        )
    if not any(n.start < start for n in notes):
        raise InfillError(f"no note starts before {start:g} s: nothing to fill from", code="nothing_before")
    if not any(n.start >= end for n in notes):
        raise InfillError(
            f"no note starts at or after {end:g} s: that is a continuation (musicrel generate)",
            code="nothing_after",
        )
    step = codec.config.step_ms / 1000.0
    s_step, e_step = (int(math.floor(t / step + 0.5)) for t in (start, end))
    if e_step <= s_step:
        raise InfillError(f"the span is shorter than one time step ({step:g} s)", code="invalid_span")
    past, gap, future = split_at(codec, codec.encode_notes(notes), [s_step, e_step])
    return InfillSegments(pm, notes, past, gap, future, s_step, e_step)


def infill_prompt(codec, seg: InfillSegments, window: int) -> FimSequence:
    """The infill prompt of `seg` for a model reading `window` tokens: the future up to FUTURE_SHARE of it,
    room kept for the gap (1.5 x the true gap's tokens, within [window/4, window/2]), the past in the rest."""
    reserve = int(min(max(1.5 * len(seg.gap) + 32, window // 4), window // 2))
    return fim_sequence(
        codec,
        seg.past,
        seg.future,
        seg.gap_steps,
        max_tokens=window - reserve,
        future_tokens=int(window * FUTURE_SHARE),
        past_whole=True,
        future_whole=True,
    )


def _hold_steps(codec, notes) -> int:
    longest = max((n.end - n.start for n in notes), default=0.0)
    seconds = min(MAX_HOLD_SECONDS, max(MIN_HOLD_SECONDS, HOLD_FACTOR * longest))
    return round(seconds * 1000.0 / codec.config.step_ms)


@torch.inference_mode()
def _decode_gap(model, codec, seg: InfillSegments, prompt: FimSequence, params: InfillParams, seed: int):
    """Each sample's gap tokens, from `decode.generate` under the continuation grammar."""
    from musicrel.generation.decode import collect_rows, generate

    B = params.num_samples
    device = next(model.parameters()).device
    grammar = Grammar(
        codec,
        [seg.past] * B,  # the grammar's state (sounding notes, recent pitches) is the past's
        [seg.gap_steps] * B,
        [_hold_steps(codec, seg.notes)] * B,
        device=device,
    )
    budget = int(seg.gap_steps * codec.config.step_ms / 1000.0 * TOKENS_PER_SECOND_CAP) + 64
    tokens = torch.as_tensor(prompt.tokens, dtype=torch.long, device=device)[None].expand(B, -1).contiguous()
    generators = [torch.Generator(device=device).manual_seed(row_seed(seed, i)) for i in range(B)]
    gen = generate(
        model,
        tokens,
        budget,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        generators=generators,
        grammar=grammar,
    )
    rows = collect_rows(gen, B, lambda: grammar.elapsed < grammar.limit)
    return [np.asarray(r, dtype=np.int64) for r in rows]


def gap_notes(codec, past: np.ndarray, tokens: np.ndarray, start: float, end: float) -> list:
    """A gap's tokens -> notes in file time: the velocity in force at the gap's start carries over, notes
    start at `start` + their time and end by `end`."""
    past = np.asarray(past, dtype=np.int64)
    velocity = past[
        (past >= codec.velocity_offset) & (past < codec.velocity_offset + codec.config.velocity_bins)
    ]
    out = []
    for n in codec.decode_notes(np.concatenate([velocity[-1:], tokens])):
        s, e = start + n.start, min(start + n.end, end)
        if s < end and e > s:
            out.append(pretty_midi.Note(velocity=n.velocity, pitch=n.pitch, start=s, end=e))
    return out


def _read_instruments(codec, pm) -> list[int]:
    """Indices of the instruments the codec reads (and infilling therefore regenerates): non-drum ones of
    `tracks`."""
    tracks = codec.config.tracks
    chosen = (
        range(len(pm.instruments)) if tracks == "merge" else [i for i in tracks if i < len(pm.instruments)]
    )
    return [i for i in chosen if not pm.instruments[i].is_drum]


def merge(codec, pm, start: float, end: float, new_notes: list) -> tuple[pretty_midi.PrettyMIDI, int]:
    """A copy of `pm` with the notes that start in [start, end) of the instruments read removed and
    `new_notes` added (the edge rules: the module's docstring); and how many notes were removed."""
    out = copy.deepcopy(pm)
    read = _read_instruments(codec, out)
    removed = 0
    for i in read:
        inst = out.instruments[i]
        kept = [n for n in inst.notes if not start <= n.start < end]
        removed += len(inst.notes) - len(kept)
        inst.notes = kept
    sounding: dict[int, list] = {}  # kept notes sounding into the gap, by pitch
    for i in read:
        for n in out.instruments[i].notes:
            if n.start < start < n.end:
                sounding.setdefault(n.pitch, []).append(n)
    fitted = []
    for g in new_notes:
        g = pretty_midi.Note(g.velocity, g.pitch, g.start, g.end)
        for k in sounding.get(g.pitch, []):
            if k.start <= g.start < k.end:
                g = None
                break
            if g.start < k.start < g.end:
                g.end = k.start
        if g is not None and g.end > g.start:
            fitted.append(g)
    with_notes = [i for i in read if pm.instruments[i].notes]
    if len(with_notes) == 1:
        target = out.instruments[with_notes[0]]
    else:
        window = (max(0.0, start - PROGRAM_WINDOW_SECONDS), end + PROGRAM_WINDOW_SECONDS)
        program, _ = motif_program(pm, codec.config.tracks, *window)
        target = pretty_midi.Instrument(program=program, name=INFILL_TRACK)
        out.instruments.append(target)
    target.notes.extend(fitted)
    return out, removed


def infill(model, midi, start, end, *, codec, params: InfillParams | None = None) -> InfillResult:
    """Regenerate [start, end) seconds of `midi` (path, bytes or PrettyMIDI); everything else is kept (the
    edge rules: the module's docstring). InfillError for a bad span or a model without infill tokens,
    InvalidMidiError for unusable MIDI."""
    params = params or InfillParams()
    start, end = check_span(start, end)
    check_model(model, codec)
    seg = infill_segments(codec, midi, start, end)
    window = model.cfg.max_seq_len
    prompt = infill_prompt(codec, seg, window)
    seed = params.seed if params.seed is not None else draw_seed()
    began = time.perf_counter()
    rows = _decode_gap(model, codec, seg, prompt, params, seed)
    decode_seconds = time.perf_counter() - began
    warnings = []
    longest = max((len(r) for r in rows), default=0)
    if len(prompt.tokens) + longest > window:
        warnings.append(
            f"the gap took {longest} tokens; with the {len(prompt.tokens)}-token prompt that passed the "
            f"model's {window}-token window, so it wrote the gap's end without the music after it in view"
        )
    notes = [gap_notes(codec, seg.past, r, start, end) for r in rows]
    midis, removed = [], 0
    for n in notes:
        out, removed = merge(codec, seg.pm, start, end, n)
        midis.append(out)
    return InfillResult(
        midis=midis,
        notes=[sorted(n, key=lambda x: (x.start, x.pitch)) for n in notes],
        seed=seed,
        start=start,
        end=end,
        removed=removed,
        prompt_tokens=len(prompt.tokens),
        decode_seconds=decode_seconds,
        warnings=warnings,
    )


def infill_midi(model, midi, start, end, *, codec, params: InfillParams | None = None) -> list:
    """Regenerate [start, end) seconds of `midi` and keep everything else: one PrettyMIDI per sample
    (`infill` has the details and also returns the seed and the new notes)."""
    return infill(model, midi, start, end, codec=codec, params=params).midis
