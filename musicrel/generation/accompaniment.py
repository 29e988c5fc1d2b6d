"""Accompany a melody: a model trained on a melody interleaved with its accompaniment (`CodecConfig.melody`)
writes the accompaniment while the melody is placed into its stream at the melody's own times.

The melody is never sampled. `MelodyGrammar` keeps the continuation grammar's rules and adds these: a time
shift that would cross the next melody event is cut short to land on it, and at that step the melody's tokens
are the only ones allowed, before anything the model writes there (training put them first at each step), so
the model always knows the melody note sounding now and everything before it; a melody note the model guesses
where none is due becomes waiting (`_wait_instead_of_melody`); and note-ons lean toward the pitch classes of
the melody's next LOOKAHEAD_SECONDS and away from their semitone neighbours (`_hear_ahead`).

`accompany_midi` is the library entry: a MIDI file and which of its tracks is the melody in, one MIDI file per
sample out, holding the melody track unchanged and the accompaniment on a track of its own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator

import numpy as np
import pretty_midi
import torch
from torch import Tensor
from torch.nn.functional import pad as nn_pad

from musicrel.errors import GenerationError
from musicrel.generation.controls import ControlError, gm_program_name
from musicrel.generation.grammar import MAX_HOLD_SECONDS, Grammar
from musicrel.generation.melody import (
    ACCOMPANIMENT_NAME,
    AccompanimentParams,
    AccompanimentResult,
    melody_notes,
    melody_track,
)
from musicrel.generation.sampling import TOKENS_PER_SECOND_CAP, draw_seed
from musicrel.midi.codec import EventCodec, shift_steps
from musicrel.midi.files import DEFAULT_BPM, copy_midi, prevailing_tempo

# The model hears the melody up to now; the grammar lets it hear LOOKAHEAD_SECONDS ahead: note-ons of the
# pitch classes the melody sounds in that window gain TUNE_BIAS nats, their semitone neighbours lose
# CLASH_BIAS. Chosen on 20 validation songs (docs/ACCOMPANIMENT.md): against none, harmony 0.33 -> 0.58 and
# clashes 0.079 -> 0.020; 1 s, or 3 s, or stronger biases, were within the noise of this one.
LOOKAHEAD_SECONDS = 2.0
TUNE_BIAS = 2.0
CLASH_BIAS = 3.0
TAIL_SECONDS = 1.0  # the accompaniment goes on this long after the melody's last note ends


# ---------------------------------------------------------------- the grammar that places it
class MelodyGrammar(Grammar):
    """The continuation grammar, plus the melody: each row's melody tokens are placed at their steps (counted
    from the start of the accompaniment) and never drawn otherwise."""

    def __init__(
        self,
        codec: EventCodec,
        schedules: list[tuple[np.ndarray, np.ndarray]],
        limit_steps,
        max_hold_steps=None,
        device=None,
        controls=None,
    ):
        if codec.melody_on_offset is None:
            raise GenerationError("this model has no melody tokens: it cannot accompany", code="no_melody")
        B = len(schedules)
        prompts = [np.array([codec.bos_id], dtype=np.int64)] * B
        super().__init__(codec, prompts, limit_steps, max_hold_steps, device, controls)
        M = max(len(s) for s, _ in schedules) + 1  # +1: a sentinel "no more melody" at the end of every row
        steps = np.full((B, M), 2**62, dtype=np.int64)
        toks = np.full((B, M), codec.pad_id, dtype=np.int64)
        for r, (s, t) in enumerate(schedules):
            steps[r, : len(s)], toks[r, : len(t)] = s, t
        self.mel_step = torch.as_tensor(steps, device=device)  # (B, M)
        self.mel_tok = torch.as_tensor(toks, device=device)  # (B, M)
        self.mel_next = torch.zeros(B, dtype=torch.long, device=device)  # (B,) next melody event
        counts = [len(s) for s, _ in schedules]
        self.mel_count = torch.as_tensor(counts, dtype=torch.long, device=device)  # (B,) melody events
        self.mel_lo, self.mel_hi = codec.melody_on_offset, codec.melody_off_offset + 128
        spans = [_note_spans(codec, s, t) for s, t in schedules]
        N = max(1, max(len(x) for x in spans))
        span = np.zeros((B, N, 3), dtype=np.int64)
        span[:, :, :2] = -1  # padding: a note that never sounds
        for r, x in enumerate(spans):
            span[r, : len(x)] = x
        self.tune_start, self.tune_end, self.tune_pc = (
            torch.as_tensor(span[:, :, k], device=device) for k in range(3)
        )
        self.lookahead_steps = round(LOOKAHEAD_SECONDS * 1000.0 / codec.config.step_ms)
        self.pitch_pc = torch.arange(128, device=device) % 12

    def _due(self) -> tuple[Tensor, Tensor]:
        """(B,) the next melody event's step and token."""
        i = self.mel_next[:, None]
        return self.mel_step.gather(1, i).squeeze(1), self.mel_tok.gather(1, i).squeeze(1)

    def melody_done(self) -> Tensor:
        """(B,) bool: every melody event placed."""
        return self.mel_next >= self.mel_count

    def finished(self) -> Tensor:
        """(B,) bool: every melody event placed and the accompaniment's time limit reached."""
        return self.melody_done() & super().finished()

    def constrain(self, logits: Tensor) -> Tensor:
        logits = self._wait_instead_of_melody(super().constrain(logits))
        if TUNE_BIAS or CLASH_BIAS:
            logits = self._hear_ahead(logits)
        step, tok = self._due()
        due = step <= self.elapsed
        if bool(due.any()):
            rows = due.nonzero().squeeze(1)
            logits[rows] = float("-inf")
            logits[rows, tok[rows]] = 0.0
        return logits

    def _wait_instead_of_melody(self, logits: Tensor) -> Tensor:
        """Move the probability of the melody tokens to the time shifts (in proportion to theirs).

        The model does not know when the next melody note comes, and in training a melody event cut the time
        shift before it short: after a short shift it expects "a melody note now" with some probability. When
        none is due, that path means "nothing happens yet", so its mass belongs to waiting longer. Masking it
        instead spread it over every token, mostly note-ons: a note wherever the model had guessed a melody
        note (21 notes/s against the real 3.6 on held-out POP909 songs)."""
        probs = logits.float().softmax(dim=-1)  # (B, V)
        melody = probs[:, self.mel_lo : self.mel_hi].sum(dim=1, keepdim=True)  # (B, 1)
        shifts = probs[:, self.shift0 : self.shift0 + self.max_shift]  # (B, max_shift)
        total = shifts.sum(dim=1, keepdim=True)
        probs[:, self.shift0 : self.shift0 + self.max_shift] = torch.where(
            total > 0, shifts * (1 + melody / total.clamp_min(1e-30)), shifts
        )
        probs[:, self.mel_lo : self.mel_hi] = 0.0
        return probs.log()

    def _hear_ahead(self, logits: Tensor) -> Tensor:
        """Move note-on mass toward the pitch classes the melody sounds from now to LOOKAHEAD_SECONDS ahead
        and away from their semitone neighbours; the note-ons keep their total (so density is unchanged)."""
        now = self.elapsed[:, None]
        active = (self.tune_start < now + self.lookahead_steps) & (self.tune_end > now)  # (B, N)
        pcs = (
            torch.zeros(now.size(0), 12, device=logits.device).scatter_add_(1, self.tune_pc, active.float())
            > 0
        )
        near = (pcs.roll(1, dims=1) | pcs.roll(-1, dims=1)) & ~pcs  # (B, 12)
        bias = TUNE_BIAS * pcs.float() - CLASH_BIAS * near.float()  # (B, 12)
        on = slice(self.on0, self.on0 + 128)
        block = logits[:, on]
        steered = block + bias[:, self.pitch_pc]
        keep = block.logsumexp(dim=1) - steered.logsumexp(dim=1)  # (B,)
        logits[:, on] = steered + torch.where(keep.isfinite(), keep, 0.0)[:, None]
        return logits

    def advance(self, tokens: Tensor) -> Tensor:
        step, _ = self._due()
        placed = (tokens >= self.mel_lo) & (tokens < self.mel_hi)
        self.mel_next += placed.long()
        remaining = step - self.elapsed
        cut = (self.steps_per_token[tokens] > remaining) & (remaining > 0)
        tokens = torch.where(cut, self.shift0 + remaining.clamp(1, self.max_shift) - 1, tokens)
        return super().advance(tokens)

    def select(self, rows: Tensor) -> None:
        super().select(rows)
        for name in _MELODY_ROWS:
            setattr(self, name, getattr(self, name)[rows])

    def extend(self, other: Grammar) -> None:
        """Append the rows of `other` (another melody's accompaniment joining the batch): the melody schedules
        and note spans are padded to the longer (a padded event is never due, a padded note never sounds)."""
        if not isinstance(other, MelodyGrammar):
            raise TypeError(f"a MelodyGrammar extends with a MelodyGrammar, not a {type(other).__name__}")
        never = {"mel_step": 2**62, "mel_tok": self.codec.pad_id}  # an event never due
        never |= {"tune_start": -1, "tune_end": -1, "tune_pc": 0}  # a note that never sounds
        for name, value in never.items():
            mine, theirs = getattr(self, name), getattr(other, name)
            width = max(mine.size(1), theirs.size(1))
            mine, theirs = (nn_pad(x, (0, width - x.size(1)), value=value) for x in (mine, theirs))
            setattr(self, name, torch.cat([mine, theirs]))
        for name in ("mel_next", "mel_count"):
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        super().extend(other)


_MELODY_ROWS = ("mel_step", "mel_tok", "mel_next", "mel_count", "tune_start", "tune_end", "tune_pc")


def _note_spans(codec: EventCodec, steps: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """(N, 3) [start step, end step, pitch class] of the melody's notes, from its schedule (whose steps are
    `melody_lead_steps` ahead of when the notes sound)."""
    out, open_at = [], {}
    steps = np.asarray(steps) + codec.melody_lead_steps
    for step, tok in zip(steps.tolist(), tokens.tolist(), strict=True):
        if tok < codec.melody_off_offset:
            open_at[tok - codec.melody_on_offset] = step
        elif (pitch := tok - codec.melody_off_offset) in open_at:
            out.append((open_at.pop(pitch), step, pitch % 12))
    return np.asarray(out, dtype=np.int64).reshape(-1, 3)


# ---------------------------------------------------------------- decoding
def melody_schedule(codec: EventCodec, notes) -> tuple[np.ndarray, np.ndarray]:
    """(steps, tokens) of the melody's events, steps counted from time 0 of its file."""
    steps, toks = codec.melody_events(notes)
    return steps.astype(np.int64), toks.astype(np.int64)


def accompany_notes(model, codec: EventCodec, notes, params: AccompanimentParams, tempo: float = DEFAULT_BPM):
    """The accompaniment of a melody (notes, file time) per sample, as token arrays (file time 0 = step 0),
    with the seed used and the resolved controls. One batch of num_samples rows."""
    from musicrel.generation.decode import run_to_end

    return run_to_end(accompany_notes_steps(model, codec, notes, params, tempo))


def accompaniment_job(
    model, codec: EventCodec, notes, params: AccompanimentParams, tempo: float = DEFAULT_BPM
):
    """The decode job (`decode_job.DecodeJob`) that accompanies a melody (notes, file time): num_samples
    rows that start from bos under a `MelodyGrammar` placing the melody, until the melody is placed and its
    last note has ended TAIL_SECONDS ago. The controls are resolved against the melody (GenerationError, a
    ControlError, when they cannot apply)."""
    from musicrel.generation.decode_job import DecodeJob
    from musicrel.generation.primer import Primer

    seed = params.seed if params.seed is not None else draw_seed()
    B = params.num_samples
    step_ms = codec.config.step_ms
    end = max(n.end for n in notes)
    limit = math.ceil((end + TAIL_SECONDS) * 1000.0 / step_ms)
    schedule = melody_schedule(codec, notes)
    resolved = None
    if params.controls is not None:
        anchor = Primer(np.array([codec.bos_id]), 0.0, 0.0, tempo, 0, [], motif_notes=list(notes))
        resolved = params.controls.resolve(anchor, step_ms)
    grammar = MelodyGrammar(
        codec,
        [schedule] * B,
        [limit] * B,
        [round(MAX_HOLD_SECONDS * 1000.0 / step_ms)] * B,
        device=next(model.parameters()).device,
        controls=None if resolved is None else [resolved] * B,
    )
    return DecodeJob(
        tokens=np.array([codec.bos_id], dtype=np.int64),
        grammar=grammar,
        seed=seed,
        max_new_tokens=int((end + TAIL_SECONDS) * TOKENS_PER_SECOND_CAP) + len(schedule[1]) + 64,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        controls=resolved,
    )


def accompany_notes_steps(
    model, codec: EventCodec, notes, params: AccompanimentParams, tempo: float = DEFAULT_BPM
) -> Generator[None, None, tuple[list[np.ndarray], int, dict | None, list[str]]]:
    """`accompany_notes` one token at a time (it yields after each token but the last): what the server's
    engine runs beside its continuation batch, a step at a time. The rows decode on a `DecodeBatch` of their
    own (the melody's grammar does not share a batch with continuations)."""
    from musicrel.generation.decode_batch import DecodeBatch

    job = accompaniment_job(model, codec, notes, params, tempo)
    batch = DecodeBatch(model, codec, max_rows=job.num_samples)
    batch.admit([job])
    while not (finished := batch.step()):
        yield
    ((_, result),) = finished
    warnings = job.controls.warnings if job.controls is not None else []
    return list(result.tokens), job.seed, result.controls, warnings


# ---------------------------------------------------------------- a model with instruments
def instruments_job(
    model, codec: EventCodec, pm, track: int, params: AccompanimentParams, tempo: float = DEFAULT_BPM
):
    """The decode job that accompanies the melody track `track` of `pm` with a model whose codec has
    instruments (and no melody tokens): num_samples rows from bos under a `placed.PlacedGrammar` that places
    the track's own note events (its instrument, velocities, times: `span.kept_schedule`) while the model
    writes the other instruments around them, until the melody is placed and its last note ended
    TAIL_SECONDS ago. The instruments control says which it may bring in (every one by default: the prompt
    has no motif to keep to), never the melody's own: the model's notes of that instrument go on with the
    tune (a violin's tune under "Violin, Viola, Cello" drew 594 violin notes in 31 s, and 12 viola and 7
    cello notes), so it is left out of what the model may strike (with a warning where it was named) and
    its mass goes to the others; naming it alone is an error."""
    from dataclasses import replace

    from musicrel.generation.decode_job import DecodeJob
    from musicrel.generation.placed import PlacedGrammar
    from musicrel.generation.primer import Primer
    from musicrel.midi.instruments import NUM_INSTRUMENTS, instrument_name, instrument_of

    if params.controls is not None and params.controls.program is not None:
        raise ControlError(
            "program: this model writes each instrument it brings in on a track of its own with its own "
            "program; choose them with instruments, leave program empty",
            code="program_with_instruments",
        )
    notes, limit, schedule = _placed_melody(codec, pm, track)
    step_ms = codec.config.step_ms
    end = max(n.end for n in notes)
    resolved = None
    if params.controls is not None:
        anchor = Primer(np.array([codec.bos_id]), 0.0, 0.0, tempo, 0, [], motif_notes=list(notes))
        resolved = params.controls.resolve(anchor, step_ms)
    tune = instrument_of(pm.instruments[track].program, pm.instruments[track].is_drum)
    chosen = resolved is not None and resolved.instruments is not None  # "any" or a list
    permitted = resolved.instruments.copy() if chosen else np.ones(NUM_INSTRUMENTS, dtype=bool)
    if chosen and resolved.asks_instruments and permitted[tune]:
        if permitted.sum() == 1:
            raise ControlError(
                f"instruments: {instrument_name(tune)} is the melody's own instrument; name the ones that "
                "accompany it",
                code="only_the_melodys_instrument",
            )
        warning = f"instruments: {instrument_name(tune)} plays the melody; the model writes the others"
        others = [name for name in resolved.applied["instruments"] if name != instrument_name(tune)]
        applied = {**resolved.applied, "instruments": others}  # what the model writes
        resolved = replace(resolved, warnings=[*resolved.warnings, warning], applied=applied)
    permitted[tune] = False
    if chosen:
        resolved = replace(resolved, instruments=permitted)
    B = params.num_samples
    grammar = PlacedGrammar(
        codec,
        [np.array([codec.bos_id], dtype=np.int64)] * B,
        [limit] * B,
        [round(MAX_HOLD_SECONDS * 1000.0 / step_ms)] * B,
        next(model.parameters()).device,
        None if resolved is None else [resolved] * B,
        schedule,
        instruments=[permitted] * B,
    )
    return DecodeJob(
        tokens=np.array([codec.bos_id], dtype=np.int64),
        grammar=grammar,
        seed=params.seed if params.seed is not None else draw_seed(),
        max_new_tokens=int((end + TAIL_SECONDS) * TOKENS_PER_SECOND_CAP) + len(schedule[1]) + 64,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        controls=resolved,
    )


def _placed_melody(codec: EventCodec, pm, track: int) -> tuple[list, int, tuple]:
    """The melody's notes (`melody_notes`: its errors), the accompaniment's length in steps, and the track's
    note events placed while it is written (`span.kept_schedule`: the codec's reading of the track)."""
    from musicrel.generation.span import kept_schedule

    notes = melody_notes(pm, track)
    limit = math.ceil((max(n.end for n in notes) + TAIL_SECONDS) * 1000.0 / codec.config.step_ms)
    return notes, limit, kept_schedule(codec, pm, [track], 0, limit)


def accompany_instruments_steps(
    model, codec: EventCodec, pm: pretty_midi.PrettyMIDI, track: int, params: AccompanimentParams
) -> Generator[None, None, AccompanimentResult]:
    """`accompany_steps` for a model with instruments (`instruments_job`): the model's own notes (the placed
    melody taken out: `placed.Heard`) go on tracks of their own, one per instrument it wrote, through
    `midi.tracks` (named by General MIDI name, drums on a drum track); the melody's own instrument is not
    the model's to strike (`instruments_job`), and a note of it would be dropped (the melody track stays
    exact). The answer file: the upload's tempo map, its melody track
    unchanged, then the new tracks."""
    from musicrel.generation.decode_batch import DecodeBatch
    from musicrel.generation.placed import Heard
    from musicrel.midi.tracks import read_tracks

    params = params or AccompanimentParams()
    job = instruments_job(model, codec, pm, track, params, prevailing_tempo(pm))
    began = time.perf_counter()
    batch = DecodeBatch(model, codec, max_rows=job.num_samples)
    batch.admit([job])
    while not (finished := batch.step()):
        yield
    ((_, result),) = finished
    decode_seconds = time.perf_counter() - began
    _, _, schedule = _placed_melody(codec, pm, track)
    melody, _ = read_tracks(pm, [track], [], [], 0.0)
    midis, parts, seconds = [], [], 0.0
    for tokens in result.tokens:
        heard = Heard(codec, schedule)
        own = np.asarray([t for t in np.asarray(tokens).tolist() if heard.mine(t)], dtype=np.int64)
        seconds = max(seconds, float(shift_steps(codec)[own].sum() * codec.config.step_ms / 1000.0))
        written = codec.decode_instrument_notes(own)
        placer = melody.placer()
        by_track: dict[int, list] = {}
        for note, instrument in sorted(zip(written.notes, written.instruments, strict=True), key=_onset):
            index = placer.place(instrument, note.pitch)
            if index:  # 0 is the melody's track: its instrument's notes are not the model's to write
                by_track.setdefault(index, []).append(note)
        out = copy_midi(pm, instruments=[track])
        for index, t in enumerate(placer.tracks[1:], start=1):
            inst = pretty_midi.Instrument(program=t.program, is_drum=t.is_drum, name=t.name)
            inst.notes = by_track.get(index, [])
            out.instruments.append(inst)
        midis.append(out)
        parts.append([n for i in sorted(by_track) for n in by_track[i]])
    warnings = job.controls.warnings if job.controls is not None else []
    return AccompanimentResult(
        midis=midis,
        notes=parts,
        seed=job.seed,
        melody_track=track,
        seconds=seconds,
        decode_seconds=decode_seconds,
        controls=result.controls,
        warnings=warnings,
    )


def _onset(pair) -> float:
    return pair[0].start


def render(pm: pretty_midi.PrettyMIDI, track: int, notes: list, program: int = 0) -> pretty_midi.PrettyMIDI:
    """The answer file: the input's tempo map and signatures, its melody track unchanged, the accompaniment on
    a track of its own."""
    out = copy_midi(pm, instruments=[track])
    inst = pretty_midi.Instrument(program=program, name=ACCOMPANIMENT_NAME)
    inst.notes = list(notes)
    out.instruments.append(inst)
    return out


def accompany_midi(
    model, codec: EventCodec, midi, *, track: int | None = None, params: AccompanimentParams | None = None
) -> AccompanimentResult:
    """Accompany the melody in `midi` (path, bytes or PrettyMIDI; `track`: its instrument index, or None for
    a file with one track of notes). One answer file per sample."""
    from musicrel.generation.decode import run_to_end

    pm = codec.read(midi)
    return run_to_end(accompany_steps(model, codec, pm, melody_track(pm, track), params))


def accompany_steps(
    model,
    codec: EventCodec,
    pm: pretty_midi.PrettyMIDI,
    track: int,
    params: AccompanimentParams | None = None,
) -> Generator[None, None, AccompanimentResult]:
    """`accompany_midi` of a parsed file whose melody track is known, one token at a time (it yields after
    each and returns the result): the server's engine interleaves it with its continuation batch."""
    params = params or AccompanimentParams()
    if codec.instrument_offset is not None:  # a model with instruments: the melody track's notes are placed
        return (yield from accompany_instruments_steps(model, codec, pm, track, params))
    notes = melody_notes(pm, track)
    start = time.perf_counter()
    tokens, seed, applied, warnings = yield from accompany_notes_steps(
        model, codec, notes, params, prevailing_tempo(pm)
    )
    decode_seconds = time.perf_counter() - start
    program = params.controls.program if params.controls and params.controls.program is not None else 0
    parts = [codec.decode_notes(t) for t in tokens]
    if applied is not None and "program" not in applied:
        applied["instrument"] = gm_program_name(program)
    return AccompanimentResult(
        midis=[render(pm, track, p, program) for p in parts],
        notes=parts,
        seed=seed,
        melody_track=track,
        seconds=float(shift_steps(codec)[tokens[0]].sum() * codec.config.step_ms / 1000.0) if tokens else 0.0,
        decode_seconds=decode_seconds,
        controls=applied,
        warnings=warnings,
    )
