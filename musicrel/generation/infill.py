"""Infilling: regenerate the music of [start, end) of a file (of its chosen tracks) and keep everything else.

`infill_midi(model, midi, start, end, codec=..., params=...)` reads the file, writes the infill prompt of a
model with infill tokens (`CodecConfig.infill`; the layout is `generation.fim`'s: the music after the gap,
then before it, then the gap), decodes the gap with the continuation grammar on the decode loop
(`decode_batch.DecodeBatch`, the job: `infill_job`; the row's time limit is the gap's length, so the gap ends
exactly at `end`) and merges the new notes into a copy of the file. One file per sample.

The edge rules (what comes back unchanged, docs/INFILL.md):
- a note that starts before `start` is kept whole, as it was, even when it sounds into or across the gap; the
  model's prompt has it sounding (its note-on without its note-off), and a new note of its pitch struck while
  it sounds is dropped (`span.struck_under`; the stream leaves it out too).
- a note of a chosen track (`InfillParams.tracks`, default every track read) that starts in [start, end) is
  regenerated: removed, with its part after `end`. Its note-off after `end` is in the prompt's future, as in
  training, so the model knows a note of that pitch sounds there.
- a note that starts at or after `end`, and every note of a track not chosen, is kept. Drum notes (for a model
  without instruments), control changes, tempo and every other event are kept.
- new notes start in [start, end) and end by `end`, each on a chosen track (`span.route`: the one chosen
  track; else by nearest voice for a model without instruments, by instrument then nearest voice for one
  with them: `midi.tracks`' one rule); a note of an instrument no chosen track plays is dropped.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Generator

import numpy as np

from musicrel.errors import InfillError
from musicrel.generation.controls import MAX_DENSITY, Controls
from musicrel.generation.decode_batch import DecodeBatch
from musicrel.generation.decode_job import DecodeJob
from musicrel.generation.fim import FUTURE_SHARE, FimSequence, fim_sequence
from musicrel.generation.grammar import HOLD_FACTOR, MAX_HOLD_SECONDS, MIN_HOLD_SECONDS, Grammar
from musicrel.generation.placed import Heard, PlacedGrammar
from musicrel.generation.primer import Primer
from musicrel.generation.sampling import TOKENS_PER_SECOND_CAP, draw_seed
from musicrel.generation.span import (  # noqa: F401  (the torch-free half, re-exported)
    MAX_SPAN_SECONDS,
    InfillParams,
    InfillResult,
    InfillSegments,
    bar_span,
    check_bars,
    check_span,
    chosen_tracks,
    gap_notes,
    infill_segments,
    merge,
    past_velocity,
    route,
)
from musicrel.midi.files import prevailing_tempo
from musicrel.midi.tracks import read_tracks

# The controls read the music this far either side of the gap: the key `auto` finds, the rate the density
# loop starts from (as a continuation's read its motif).
CONTROL_CONTEXT_SECONDS = 10.0


def check_model(model, codec) -> None:
    if codec.fill_id is None or model.cfg.vocab_size < codec.vocab_size:
        raise InfillError(
            "this model has no infill tokens (CodecConfig.infill); train one with data.infill_rate "
            "(configs/cpu-infill.yaml)",
            code="model_cannot_infill",
        )


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


def around_gap(codec, seg: InfillSegments) -> Primer:
    """What the controls read for a gap (a Primer as `Controls.resolve` takes one): the notes that start in
    the CONTROL_CONTEXT_SECONDS before and after it, never the gap's own (they are what is replaced), and the
    tempo that prevails over the gap (chords in beats: `midi.files.prevailing_tempo`)."""
    step_s, reach = codec.config.step_ms / 1000.0, CONTROL_CONTEXT_SECONDS
    start, end = seg.start_step * step_s, seg.end_step * step_s
    near = [
        k for k, n in enumerate(seg.notes) if start - reach <= n.start < start or end <= n.start < end + reach
    ]
    around = [seg.notes[k] for k in near]
    # with instruments, which of them are drum hits (`key=auto` reads pitches, not drum sounds)
    instruments = None if seg.instruments is None else [seg.instruments[k] for k in near]
    tempo = prevailing_tempo(seg.pm, start, end)
    bos = np.array([codec.bos_id])
    return Primer(bos, start, start, tempo, 0, around, motif_notes=around, motif_instruments=instruments)


def chosen_instruments(seg: InfillSegments) -> np.ndarray | None:
    """A codec with instruments: (NUM_INSTRUMENTS,) bool, the instruments of the chosen tracks, the ones the
    gap is written with unless the `instruments` control says otherwise. A note of another instrument would
    be dropped (no chosen track takes it) yet counted by the density loop, whose target is the chosen
    tracks' own rate (`chosen_density`): limited to these, what the loop counts is what the file gets."""
    if seg.instruments is None:
        return None
    every, _ = read_tracks(seg.pm, seg.tracks, [], [], 0.0)
    return every.instruments()


def chosen_density(codec, seg: InfillSegments) -> float:
    """The chosen tracks' notes a second around the gap: those that start in the CONTROL_CONTEXT_SECONDS
    before and after it (as far as the file goes), over the seconds that holds."""
    step_s, reach = codec.config.step_ms / 1000.0, CONTROL_CONTEXT_SECONDS
    start, end = seg.start_step * step_s, seg.end_step * step_s
    last = max(n.end for n in seg.notes)
    seconds = (start - max(0.0, start - reach)) + max(0.0, min(last, end + reach) - end)
    notes = [n for t in seg.tracks for n in seg.pm.instruments[t].notes]
    count = sum(start - reach <= n.start < start or end <= n.start < end + reach for n in notes)
    return count / seconds if seconds > 0 else 0.0


def _with_chosen_density(codec, seg: InfillSegments, controls: Controls | None) -> Controls | None:
    """The controls a gap is written with: those asked, and where tracks are kept and no density is asked,
    the density loop holding the chosen tracks' own rate around the gap (`chosen_density`). Hearing the kept
    tracks, a model without instruments would otherwise write a whole texture over them (POP909 song 001,
    30-36 s, tracks=0: 70-85 new notes where the melody had 8; with the loop, 20-21: docs/INFILL.md)."""
    if not len(seg.kept[0]) or (controls is not None and controls.density is not None):
        return controls
    rate = min(chosen_density(codec, seg), MAX_DENSITY)
    if rate <= 0:
        return controls
    return dataclasses.replace(controls or Controls(), density=round(rate, 3))


def infill_job(model, codec, seg: InfillSegments, params: InfillParams) -> DecodeJob:
    """The decode job (`decode_job.DecodeJob`) that writes the gap of `seg`: num_samples rows that read the
    infill prompt (`infill_prompt`: future, past, [FILL]) for the model's window and sample under the
    continuation grammar, its state (sounding notes, recent pitches) the past's and its time limit the gap's
    length, so each row leaves the batch once its gap reaches `end`. Notes are closed for their length after
    1.5 x the longest note around the gap (`_hold_steps`); a drawn seed when params has none. The controls
    are resolved against the music around the gap (`around_gap`: the key `auto` is its key; chords start at
    `start`)."""
    prompt = infill_prompt(codec, seg, model.cfg.max_seq_len)
    B = params.num_samples
    resolved, controls = None, _with_chosen_density(codec, seg, params.controls)
    if controls is not None:
        resolved = controls.resolve(around_gap(codec, seg), codec.config.step_ms)
    rows = (
        codec,
        [seg.past] * B,  # the grammar's state (sounding notes, recent pitches) is the past's
        [seg.gap_steps] * B,
        [_hold_steps(codec, seg.notes)] * B,
    )
    device, controls = next(model.parameters()).device, None if resolved is None else [resolved] * B
    plays = chosen_instruments(seg)
    instruments = None if plays is None else [plays] * B
    if len(seg.kept[0]):  # tracks kept: the model hears their notes in the gap
        grammar = PlacedGrammar(*rows, device, controls, seg.kept, instruments)
    else:
        grammar = Grammar(*rows, device=device, controls=controls, instruments=instruments)
    budget = int(seg.gap_steps * codec.config.step_ms / 1000.0 * TOKENS_PER_SECOND_CAP) + 64
    return DecodeJob(
        tokens=np.asarray(prompt.tokens, dtype=np.int64),
        grammar=grammar,
        seed=params.seed if params.seed is not None else draw_seed(),
        max_new_tokens=budget + len(seg.kept[0]),
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        controls=resolved,
    )


def _gap_steps(
    model, codec, job: DecodeJob, kept: tuple | None = None
) -> Generator[list[list[int]], None, list[np.ndarray]]:
    """Each sample's gap tokens, decoded on a `DecodeBatch` of the job's own, a step per token: it yields each
    sample's tokens so far (the same lists, growing) after every token but the last, and returns them. With
    `kept` (InfillSegments.kept) the kept tracks' note events placed in the gap are left out: what is yielded
    and returned is the model's own (`placed.Heard`)."""
    batch = DecodeBatch(model, codec, max_rows=job.num_samples)
    (job_id,) = batch.admit([job])
    out: list[list[int]] = [[] for _ in range(job.num_samples)]
    read = [0] * job.num_samples  # tokens of each row read so far
    heard = [Heard(codec, kept) for _ in out] if kept is not None and len(kept[0]) else None

    def take(rows) -> None:
        for r, tokens in enumerate(rows):
            new, read[r] = tokens[read[r] :].tolist(), len(tokens)
            out[r].extend(new if heard is None else [t for t in new if heard[r].mine(t)])

    while not (finished := batch.step()):
        take(batch.generated(job_id))
        yield out
    ((_, result),) = finished
    take([np.asarray(t) for t in result.tokens])
    return [np.asarray(t, dtype=np.int64) for t in out]


def infill(model, midi, start, end, *, codec, params: InfillParams | None = None) -> InfillResult:
    """Regenerate [start, end) seconds of `midi` (path, bytes or PrettyMIDI); everything else is kept (the
    edge rules: the module's docstring). InfillError for a bad span or a model without infill tokens,
    InvalidMidiError for unusable MIDI."""
    from musicrel.generation.decode import run_to_end

    return run_to_end(infill_steps(model, midi, start, end, codec=codec, params=params))


def infill_steps(
    model, midi, start, end, *, codec, params: InfillParams | None = None
) -> Generator[list[list[int]], None, InfillResult]:
    """`infill` one token at a time: it checks the span, the model and the file on its first `next` (raising
    their errors there), then yields after each token of the gap each sample's gap tokens so far (lists that
    grow; the server's engine streams them), and returns the InfillResult. The server's engine interleaves it
    with its continuation batch; `infill` and `infill_midi` run it to the end, with the same tokens."""
    params = params or InfillParams()
    start, end = check_span(start, end)
    check_model(model, codec)
    seg = infill_segments(codec, midi, start, end, params.tracks)
    window = model.cfg.max_seq_len
    job = infill_job(model, codec, seg, params)
    prompt_tokens = len(job.tokens)
    began = time.perf_counter()
    rows = yield from _gap_steps(model, codec, job, seg.kept)
    decode_seconds = time.perf_counter() - began
    warnings = list(job.controls.warnings) if job.controls is not None else []
    longest = max((len(r) for r in rows), default=0)
    if prompt_tokens + longest > window:
        warnings.append(
            f"the gap took {longest} tokens; with the {prompt_tokens}-token prompt that passed the "
            f"model's {window}-token window, so it wrote the gap's end without the music after it in view"
        )
    midis, placed, where, removed = [], [], [], 0
    for r in rows:
        notes, instruments = gap_notes(codec, seg.past, r, start, end)
        out, removed, fitted, tracks = merge(codec, seg.pm, start, end, notes, seg.tracks, instruments)
        midis.append(out)
        order = sorted(range(len(fitted)), key=lambda k: (fitted[k].start, fitted[k].pitch, tracks[k]))
        placed.append([fitted[k] for k in order])
        where.append([tracks[k] for k in order])
    return InfillResult(
        midis=midis,
        notes=placed,
        seed=job.seed,
        start=start,
        end=end,
        removed=removed,
        prompt_tokens=prompt_tokens,
        decode_seconds=decode_seconds,
        warnings=warnings,
        tokens=rows,
        controls=job.controls.applied if job.controls is not None else None,
        note_tracks=where,
        tracks=list(seg.tracks),
        source=seg.source,
        original=None if seg.source is None else seg.pm,
    )


def infill_midi(model, midi, start, end, *, codec, params: InfillParams | None = None) -> list:
    """Regenerate [start, end) seconds of `midi` and keep everything else: one PrettyMIDI per sample
    (`infill` has the details and also returns the seed and the new notes)."""
    return infill(model, midi, start, end, codec=codec, params=params).midis
