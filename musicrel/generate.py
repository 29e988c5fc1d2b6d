"""Continue a MIDI motif with a Music Transformer, the gpt-fast way.

`prefill` runs the primer once into a preallocated KV cache, `decode_one_token` then costs O(L) per token,
`sample` does all logits processing (the model never samples) and `generate` is an iterator of tokens, so a
caller can stream them or stop at any step. Around that: `prepare_primer` (motif -> primer tokens), a token
`Grammar` (no orphan or stuck notes, time never goes backwards, the requested length met to one time step),
`render` (tokens -> MIDI with the motif's tempo and program), `DecodeBatch` (continuous batching: jobs with
their own primers and sampling settings join and leave a running batch between decoding steps, each sample
with its own seeded generator so its output does not depend on what else is in the batch) and
`generate_batch` (a list of jobs run to completion on one DecodeBatch).
"""

from __future__ import annotations

import itertools
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import numpy as np
import pretty_midi
import torch
from torch import Tensor

from musicrel.codec import CodecConfig, EventCodec, open_pitches, shift_steps
from musicrel.errors import GenerationError

MAX_SEED = 2**63 - 1
# Without max_new_tokens a row may emit at most this many tokens per second of music (dense piano passages
# reach ~100 events/s); the cap only matters for a model that stalls time.
TOKENS_PER_SECOND_CAP = 200

# A note the model never closes is closed by the grammar after the motif's longest note times HOLD_FACTOR,
# within these bounds. Measured note lengths (codec.to_notes, sustain pedal applied): 99.9th percentile 8.0 s
# on 400 music21 works and 9.2 s on the real piano/pop files; 99th 2.0 s and 3.7 s.
HOLD_FACTOR = 1.5
MIN_HOLD_SECONDS = 1.0
MAX_HOLD_SECONDS = 8.0


@dataclass
class SamplingParams:
    """How to continue one motif. Validated on construction (GenerationError names the field)."""

    seconds: float = 20.0
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 0.95
    seed: int | None = None  # None: a random seed is drawn by generate_batch and reported
    num_samples: int = 1
    max_new_tokens: int | None = None
    include_primer: bool = False  # render the motif followed by the continuation

    def __post_init__(self) -> None:
        def number(name: str) -> float:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise GenerationError(f"{name} must be a finite number, got {value!r}", code="invalid_params")
            return float(value)

        def integer(name: str, low: int, high: int | None = None, allow_none: bool = False) -> None:
            value = getattr(self, name)
            if value is None and allow_none:
                return
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
                raise GenerationError(
                    f"{name} must be an integer >= {low}, got {value!r}", code="invalid_params"
                )
            if high is not None and value > high:
                raise GenerationError(f"{name} must be <= {high}, got {value!r}", code="invalid_params")
            setattr(self, name, int(value))

        if number("seconds") <= 0:
            raise GenerationError(f"seconds must be > 0, got {self.seconds!r}", code="invalid_params")
        if number("temperature") <= 0:
            raise GenerationError(f"temperature must be > 0, got {self.temperature!r}", code="invalid_params")
        if not 0 < number("top_p") <= 1:
            raise GenerationError(f"top_p must be in (0, 1], got {self.top_p!r}", code="invalid_params")
        integer("top_k", 1, allow_none=True)
        integer("seed", 0, MAX_SEED, allow_none=True)
        integer("num_samples", 1)
        integer("max_new_tokens", 1, allow_none=True)
        if not isinstance(self.include_primer, bool):
            raise GenerationError(
                f"include_primer must be true or false, got {self.include_primer!r}", code="invalid_params"
            )


@dataclass
class Primer:
    """The tokens the model reads before it continues, and what rendering the result needs."""

    tokens: np.ndarray  # events of the primer window from time 0 (led by bos when it holds the whole motif)
    start_time: float  # seconds in the source file where the primer window starts
    end_time: float  # seconds in the source file where the motif ends (last note-off): continuation starts
    tempo: float  # bpm: the motif's first tempo
    program: int  # the motif's first non-drum program
    notes: list  # pretty_midi.Note in the primer window (times in the source file)
    motif_notes: list = field(default_factory=list)  # every note of the motif (times in the source file)


@dataclass
class ContinuationResult:
    midis: list  # pretty_midi.PrettyMIDI per sample
    tokens: list  # np.ndarray of generated tokens per sample
    seed: int
    primer_tokens: int
    new_tokens: int  # all samples together
    seconds: float  # music generated (the longest sample)
    timings: (
        dict  # seconds: prefill (of the admission that took the job in), decode (admitted to done), render
    )
    stopped: bool = False  # should_stop ended this job early


# ----------------------------------------------------------------------------------------------------------
# The decoding loop


def prefill(model, tokens: Tensor, cache, left_pad: Tensor | None = None) -> Tensor:
    """Run the (left-padded) primer into an empty cache; logits of the last position (B, vocab)."""
    cache.reset(left_pad)
    return model(tokens, cache=cache)[:, -1]


def _prefill_distinct(model, tokens: Tensor, cache, left_pad: Tensor) -> Tensor:
    """`prefill`, but rows holding the same primer (every sample of a job) share one forward pass: the
    distinct rows are prefilled into a small cache whose K/V are then copied to every row that holds them.
    Prefill is compute bound, so without this a batch of 8 samples costs 8 primers' worth of compute."""
    rows = torch.cat([tokens, left_pad[:, None]], dim=1)  # (B, P + 1)
    distinct, inverse = torch.unique(rows, dim=0, return_inverse=True)
    if len(distinct) == len(tokens):
        return prefill(model, tokens, cache, left_pad)
    small = model.new_cache(len(distinct), cache.max_len)
    logits = prefill(model, distinct[:, :-1], small, distinct[:, -1])  # (U, vocab)
    P = tokens.size(1)
    cache.reset(left_pad)
    cache.k[:, :, :, :P] = small.k[:, inverse, :, :P]
    cache.v[:, :, :, :P] = small.v[:, inverse, :, :P]
    cache.length = small.length
    return logits[inverse]  # (B, vocab)


def decode_one_token(model, token: Tensor, cache) -> Tensor:
    """token (B,) -> logits for the next position (B, vocab); the cache grows by one."""
    return model(token[:, None], cache=cache)[:, -1]


def sample(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    generators: Sequence[torch.Generator],
) -> Tensor:
    """Draw one token per row: logits (B, V); temperature, top_p (B,) float; top_k (B,) long (V = off);
    one torch.Generator per row, so a row's draws never depend on the other rows. Returns (B,) long."""
    B, V = logits.shape
    logits = logits.float() / temperature[:, None]
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)  # (B, V)
    rank = torch.arange(V, device=logits.device)
    keep = rank[None] < top_k[:, None]  # top-k is a prefix of the sorted order
    probs = sorted_logits.masked_fill(~keep, float("-inf")).softmax(dim=-1)  # (B, V)
    # Nucleus: keep the smallest prefix whose mass reaches top_p (the most likely token always stays).
    keep &= (probs.cumsum(dim=-1) - probs) < top_p[:, None]
    cdf = (probs * keep).cumsum(dim=-1)  # (B, V)
    # Inverse-CDF sampling with one uniform per row from that row's own generator.
    u = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in generators])
    u = u.to(cdf.device, torch.float32) * cdf[:, -1]
    index = (cdf <= u[:, None]).sum(dim=-1)
    # Rounding may put u at the very top: fall back to the last token that has probability.
    last = ((probs * keep) > 0).sum(dim=-1) - 1
    index = torch.minimum(index, last)
    return order.gather(1, index[:, None]).squeeze(1)


class Grammar:
    """Token rules a generated stream obeys, enforced by masking logits; they keep every stream valid while
    taking from the model only what the codec cannot represent.

    - note-off only for a pitch that is sounding; an orphan note-off is repaired into a note-off of the
      nearest sounding pitch rather than masked away (`_repair_orphans`). A note-on of a pitch that is
      sounding is a re-strike: legal music, which the codec decodes as "close, then strike again", so it
      stays possible (forbidding it kept the old note open and pushed the model elsewhere: notes piled up).
    - no note is held by accident: a note the model leaves open for `max_hold` steps is closed then (the time
      shift that would cross that moment is shortened to land on it, and the next token is its note-off, fed
      to the model like any other), so a note sounds as long as the model says, up to a length learned from
      the data (see `max_hold_seconds`), and never until the end of the file.
    - specials (pad/bos/eos) never; time only moves forward (time shifts are the only clock) and the shift
      that crosses a row's time limit is shortened to land on it, so the requested length is met to one step.
    """

    def __init__(
        self,
        codec,
        prompts: Sequence[np.ndarray],
        limit_steps: Sequence[int],
        max_hold_steps: Sequence[int] | None = None,
        device=None,
    ):
        self.codec = codec
        self.on0 = int(codec.note_on_offset)
        self.off0 = int(codec.note_off_offset)
        self.shift0 = int(codec.time_shift_offset)
        self.steps_per_token = torch.as_tensor(shift_steps(codec), device=device)  # (V,) long
        self.max_shift = int(self.steps_per_token.max())
        V = len(self.steps_per_token)
        self.allowed = torch.ones(V, dtype=torch.bool, device=device)
        for special in (codec.pad_id, codec.bos_id, codec.eos_id):
            self.allowed[special] = False
        B = len(prompts)
        # onset: when each sounding note began, in steps from the primer's end (<= 0 for the primer's notes)
        onsets = np.stack([note_onsets(codec, p) for p in prompts]) if B else np.zeros((0, 128), np.int64)
        self.onset = torch.as_tensor(onsets, device=device)  # (B, 128) long
        self.open = self.onset > _SILENT  # (B, 128)
        self.elapsed = torch.zeros(B, dtype=torch.long, device=device)  # (B,) time steps
        self.limit = torch.as_tensor(list(limit_steps), dtype=torch.long, device=device)  # (B,)
        hold = [_FOREVER] * B if max_hold_steps is None else [max(1, int(h)) for h in max_hold_steps]
        self.max_hold = torch.as_tensor(hold, dtype=torch.long, device=device)  # (B,)

    def overdue(self) -> Tensor:
        """(B, 128) bool: sounding notes that have reached their row's max_hold."""
        return self.open & (self.elapsed[:, None] - self.onset >= self.max_hold[:, None])

    def constrain(self, logits: Tensor) -> Tensor:
        logits = self._repair_orphans(logits)
        allowed = self.allowed.expand_as(logits).clone()  # (B, V)
        allowed[:, self.off0 : self.off0 + 128] = self.open
        overdue = self.overdue()
        forced = overdue.any(dim=1)  # (B,) these rows must close a note now
        if bool(forced.any()):
            allowed[forced] = False
            allowed[forced, self.off0 : self.off0 + 128] = overdue[forced]
        return logits.masked_fill(~allowed, float("-inf"))

    def _repair_orphans(self, logits: Tensor) -> Tensor:
        """Move the probability of each orphan note-off to the note-off of the nearest sounding pitch.

        A note-off for a pitch that is not sounding means "a note ends now" from a model that lost track of
        which one; masking it alone would spread that mass over every other token (mostly more note-ons and
        time), so notes the model meant to end ring on and pile up. On real piano/pop this took mean
        polyphony from 8.5 to 3.8 (the pieces: 3.6). Rows with nothing sounding keep their logits."""
        off = slice(self.off0, self.off0 + 128)
        probs = logits.float().softmax(dim=-1)  # (B, V)
        orphan = probs[:, off] * ~self.open  # (B, 128)
        # nearest sounding pitch at or below / at or above each pitch (-1 / 128 where there is none)
        pitch = torch.arange(128, device=logits.device).expand_as(self.open)
        below = torch.where(self.open, pitch, -1).cummax(dim=1).values
        above = torch.where(self.open, pitch, 128).flip(1).cummin(dim=1).values.flip(1)
        use_below = (above > 127) | ((below >= 0) & (pitch - below <= above - pitch))
        nearest = torch.where(use_below, below, above).clamp(0, 127)  # (B, 128)
        moved = torch.zeros_like(orphan).scatter_add_(1, nearest, orphan) * self.open.any(dim=1, keepdim=True)
        probs[:, off] += moved
        return probs.log()  # orphans keep their mass here; `constrain` masks them next

    def select(self, rows: Tensor) -> None:
        """Keep only `rows` (dropped rows are done)."""
        for name in _GRAMMAR_ROWS:
            setattr(self, name, getattr(self, name)[rows])

    def extend(self, other: Grammar) -> None:
        """Append the rows of `other` (jobs joining a running batch)."""
        for name in _GRAMMAR_ROWS:
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))

    def advance(self, tokens: Tensor) -> Tensor:
        """Record the sampled tokens (B,); returns them with shifts that cross the row's time limit or a
        note's max_hold cut short to land on it."""
        steps = self.steps_per_token[tokens]
        deadline = torch.where(self.open, self.onset + self.max_hold[:, None], _FOREVER).amin(dim=1)  # (B,)
        remaining = torch.minimum(self.limit, deadline) - self.elapsed
        cut = (steps > remaining) & (remaining > 0)
        tokens = torch.where(cut, self.shift0 + remaining.clamp(1, self.max_shift) - 1, tokens)
        self.elapsed += torch.where(cut, remaining, steps)
        is_on, is_off = self.codec.is_note_on(tokens), self.codec.is_note_off(tokens)
        pitch = torch.where(is_on, tokens - self.on0, (tokens - self.off0).clamp(0, 127))[:, None]  # (B, 1)
        now = torch.where(is_on | is_off, is_on, self.open.gather(1, pitch).squeeze(1))
        self.open.scatter_(1, pitch, now[:, None])
        # a note-on (a re-strike too) starts the note's clock
        onset = torch.where(is_on, self.elapsed, self.onset.gather(1, pitch).squeeze(1))
        self.onset.scatter_(1, pitch, onset[:, None])
        return tokens


_GRAMMAR_ROWS = ("open", "onset", "elapsed", "limit", "max_hold")
_FOREVER = 2**62  # steps: "no limit" that still adds to an onset without overflow
_SILENT = -(2**62)  # onset of a pitch that is not sounding


@torch.inference_mode()
def generate(
    model,
    prompt: Tensor,
    max_new_tokens: int,
    *,
    left_pad: Tensor | None = None,
    temperature: Tensor | float = 1.0,
    top_k: Tensor | int | None = None,
    top_p: Tensor | float = 1.0,
    generators: Sequence[torch.Generator] | None = None,
    grammar: Grammar | None = None,
    use_cache: bool = True,
) -> Generator[Tensor, Tensor | None, None]:
    """Yield the next token of every row, (B,) long, up to max_new_tokens times; stop early by not iterating.

    prompt (B, P) is left-padded (`left_pad` (B,) counts the padding). Past the context window the window
    slides: the last half window is prefilled again and decoding goes on. `use_cache=False` recomputes the
    whole window for every token (the reference the cache is measured and tested against).

    Rows that are done can be dropped: `gen.send(keep)` with a (B,) bool mask of the rows to go on with
    returns the next tokens of those rows only (their order kept), so finished rows cost nothing.
    """
    B, P = prompt.shape
    device = prompt.device
    window = model.cfg.max_seq_len
    if window < P:
        raise GenerationError(
            f"prompt of {P} tokens exceeds the context window ({window})", code="primer_too_long"
        )
    keep_last = max(1, window // 2)
    left_pad = torch.zeros(B, dtype=torch.long, device=device) if left_pad is None else left_pad.to(device)
    temperature, top_p = (
        torch.as_tensor(x, dtype=torch.float32).expand(B).to(device) for x in (temperature, top_p)
    )
    V = model.cfg.vocab_size
    top_k = torch.as_tensor(V if top_k is None else top_k, dtype=torch.long).expand(B).to(device)
    generators = list(generators) if generators is not None else [torch.Generator() for _ in range(B)]

    seq = torch.empty(B, P + max_new_tokens, dtype=torch.long, device=device)  # all tokens, no torch.cat
    seq[:, :P] = prompt
    cap = min(window, P + max_new_tokens)  # the cache's size; only a full window ever slides
    start = 0  # first position of the window the model sees
    was_training = model.training
    model.eval()
    try:
        cache = model.new_cache(B, cap, left_pad) if use_cache else None
        lp = left_pad
        if cache is not None:
            logits = _prefill_distinct(model, prompt, cache, lp)
        else:
            logits = model(prompt, left_pad=lp)[:, -1]
        for i in range(max_new_tokens):
            if grammar is not None:
                logits = grammar.constrain(logits)
            token = sample(logits, temperature, top_k, top_p, generators)
            if grammar is not None:
                token = grammar.advance(token)
            n = P + i + 1
            seq[:, n - 1] = token
            keep = yield token
            if i + 1 == max_new_tokens:
                return
            if keep is not None and not bool(keep.all()):
                rows = keep.to(device).nonzero().squeeze(1)
                if not len(rows):
                    return
                seq, token, left_pad, lp = seq[rows], token[rows], left_pad[rows], lp[rows]
                temperature, top_k, top_p = temperature[rows], top_k[rows], top_p[rows]
                generators = [generators[r] for r in rows.tolist()]
                if grammar is not None:
                    grammar.select(rows)
                if cache is not None:
                    cache = cache.select(rows)
            slid = n - start > cap
            if slid:  # the window is full: keep its last half and prefill that again
                start = n - keep_last
                lp = (left_pad - start).clamp(min=0)
            if cache is None:
                logits = model(seq[:, start:n], left_pad=lp)[:, -1]
            elif slid:
                logits = prefill(model, seq[:, start:n], cache, lp)
            else:
                logits = decode_one_token(model, token, cache)
    finally:
        model.train(was_training)


# ----------------------------------------------------------------------------------------------------------
# Primer, rendering


def note_onsets(codec, tokens) -> np.ndarray:
    """(128,) int64: for each pitch sounding after `tokens`, when it began, in steps before their end (<= 0);
    a large negative number for pitches not sounding."""
    tokens = np.asarray(tokens, dtype=np.int64)
    open_ = open_pitches(codec, tokens)
    clock = np.cumsum(shift_steps(codec)[tokens])  # time after each token
    end = int(clock[-1]) if len(tokens) else 0
    onsets = np.full(128, _SILENT, dtype=np.int64)
    on = np.flatnonzero(codec.is_note_on(tokens))
    onsets[tokens[on] - codec.note_on_offset] = clock[on] - end  # the last strike of each pitch wins
    onsets[~open_] = _SILENT
    return onsets


def _codec_for_tracks(codec, tracks):
    if tracks is None or tracks == codec.config.tracks:
        return codec
    return EventCodec(CodecConfig.from_dict({**codec.config.to_dict(), "tracks": tracks}))


def _window_tokens(codec, notes, start: float, cut: float) -> np.ndarray:
    """Events of the notes sounding in [start, cut), with time 0 at `start`. A note still sounding at `cut`
    stays open (no note-off: where it ends is for the continuation to say) and the tokens end exactly at
    `cut` (trailing time shifts), so what follows starts where the source went on."""
    horizon = cut + 3600.0  # open notes end far beyond the cut; their note-offs are cut away below
    window = [
        pretty_midi.Note(n.velocity, n.pitch, max(n.start, start) - start,
                         (n.end if n.end <= cut else horizon) - start)
        for n in notes
        if n.end > start and n.start < cut
    ]  # fmt: skip
    tokens = np.asarray(codec.encode_notes(window), dtype=np.int64)
    steps = shift_steps(codec)[tokens]
    cut_step = int(np.floor((cut - start) / (codec.config.step_ms / 1000.0) + 0.5))
    clock = np.cumsum(steps)  # time after each token
    n = int(np.searchsorted(clock, cut_step, side="right"))  # tokens up to the cut (events at it included)
    tokens, rest = tokens[:n], cut_step - (int(clock[n - 1]) if n else 0)
    m = codec.config.max_shift_steps
    pad = [codec.time_shift_offset + m - 1] * (rest // m) + (
        [codec.time_shift_offset + rest % m - 1] if rest % m else []
    )
    return np.concatenate([tokens, np.asarray(pad, dtype=np.int64)])


def primer_at_cut(
    codec,
    notes,
    cut: float,
    primer_seconds: float = 30.0,
    max_tokens: int | None = None,
    tempo: float = 120.0,
    program: int = 0,
) -> Primer:
    """The `primer_seconds` before `cut` of `notes` (pretty_midi notes in source time) as a primer.

    Notes sounding at the window start are kept from the start on; notes still sounding at `cut` stay open
    and the continuation starts at `cut` (evaluation cuts pieces mid-phrase this way). When the window encodes
    to more than `max_tokens` tokens its start moves later (re-encoded, so the primer still begins at an event
    boundary)."""
    if (
        isinstance(primer_seconds, bool)
        or not isinstance(primer_seconds, int | float)
        or not primer_seconds > 0
    ):
        raise GenerationError(f"primer_seconds must be > 0, got {primer_seconds!r}", code="invalid_params")
    if max_tokens is not None and max_tokens < 1:
        raise GenerationError(f"max_tokens must be >= 1, got {max_tokens!r}", code="invalid_params")
    notes = [n for n in notes if n.start < cut]
    if not notes:
        raise GenerationError("no notes before the cut", code="no_notes")
    first_start = min(n.start for n in notes)
    start = max(first_start, cut - float(primer_seconds))
    tokens = _window_tokens(codec, notes, start, cut)
    step = codec.config.step_ms / 1000.0
    for _ in range(64):
        if max_tokens is None or len(tokens) <= max_tokens:
            break
        # Time at which the last max_tokens tokens begin: move the window start there (at least one step).
        elapsed = np.cumsum(np.asarray(codec.time_advance)[tokens])
        start += max(float(elapsed[len(tokens) - max_tokens - 1]), step)
        tokens = _window_tokens(codec, notes, start, cut)
    if max_tokens is not None and len(tokens) > max_tokens:  # e.g. one huge chord: keep the tail as is
        tokens = tokens[-max_tokens:]
    elif start <= first_start and (max_tokens is None or len(tokens) < max_tokens):
        # The window holds the whole motif: mark a piece start, as training streams do ([bos] piece [eos]).
        tokens = np.concatenate([[codec.bos_id], tokens])
    clipped = [pretty_midi.Note(n.velocity, n.pitch, n.start, min(n.end, cut)) for n in notes]
    return Primer(
        tokens=tokens,
        start_time=float(start),
        end_time=float(cut),
        tempo=float(tempo),
        program=int(program),
        notes=[
            pretty_midi.Note(n.velocity, n.pitch, max(n.start, start), n.end)
            for n in clipped
            if n.end > start
        ],
        motif_notes=clipped,
    )


def prepare_primer(codec, midi, primer_seconds: float = 30.0, tracks="merge", max_tokens: int | None = None):
    """The last `primer_seconds` of the motif (path, bytes or PrettyMIDI) as primer tokens, ending at its last
    note-off (InvalidMidiError for unusable MIDI); see `primer_at_cut`."""
    codec = _codec_for_tracks(codec, tracks)
    pm = codec.read(midi)
    notes = codec.to_notes(pm)
    _, tempi = pm.get_tempo_changes()
    tempo = float(tempi[0]) if len(tempi) and tempi[0] > 0 else 120.0
    end_time = max(n.end for n in notes)
    return primer_at_cut(
        codec, notes, end_time, primer_seconds, max_tokens, tempo=tempo, program=_first_program(pm, tracks)
    )


def _first_program(pm, tracks) -> int:
    instruments = pm.instruments
    if isinstance(tracks, list | tuple):
        instruments = [instruments[i] for i in tracks if isinstance(i, int) and 0 <= i < len(instruments)]
    return next((int(i.program) for i in instruments if not i.is_drum), 0)


def max_hold_seconds(primer: Primer) -> float:
    """How long the grammar lets a note sound before it closes it for the model: the motif's longest note with
    some room (HOLD_FACTOR), within [MIN_HOLD_SECONDS, MAX_HOLD_SECONDS]; the bounds come from the corpus."""
    longest = max((n.end - n.start for n in primer.motif_notes), default=0.0)
    return float(min(MAX_HOLD_SECONDS, max(MIN_HOLD_SECONDS, HOLD_FACTOR * longest)))


def default_max_primer_tokens(model) -> int:
    """Primers fill at most 3/4 of the context window, leaving room to generate before the window slides."""
    window = model.cfg.max_seq_len
    return max(1, window - max(1, window // 4))


def row_seed(seed: int, sample_index: int) -> int:
    """The generator seed of sample `sample_index` of a job: a function of (seed, index) only, so sample i is
    reproducible whatever num_samples or batch it ran in."""
    return int(np.random.SeedSequence([seed, sample_index]).generate_state(1, np.uint64)[0] >> 1)


def render(
    codec,
    primer: Primer,
    new_tokens,
    include_primer: bool = False,
    *,
    seed: int | None = None,
    sample_index: int | None = None,
) -> pretty_midi.PrettyMIDI:
    """Generated tokens -> MIDI with the motif's tempo and program.

    Continuation only: it starts at time 0 and lasts as long as the tokens' time shifts (a text marker "end"
    holds that length even when the last notes end earlier). include_primer: every note of the motif at its
    original time, then the continuation from the motif's end. Notes still sounding at the end are closed
    there; any token stream renders to a valid file. The seed (and sample index) go into a text event.
    """
    primer_tokens = np.asarray(primer.tokens, dtype=np.int64)
    new_tokens = np.asarray(new_tokens, dtype=np.int64).reshape(-1)
    vocab = codec.vocab_size
    new_tokens = new_tokens[(new_tokens >= 0) & (new_tokens < vocab)]
    steps = shift_steps(codec)
    step = codec.config.step_ms / 1000.0
    t_primer = float(steps[primer_tokens].sum()) * step
    length = float(steps[new_tokens].sum()) * step
    # Decode primer and continuation together so the velocity in force carries over; close what still sounds.
    closing = (
        np.flatnonzero(open_pitches(codec, np.concatenate([primer_tokens, new_tokens])))
        + codec.note_off_offset
    )
    decoded = codec.decode(np.concatenate([primer_tokens, new_tokens, closing]).astype(np.int64)).instruments
    offset = primer.end_time if include_primer else 0.0
    eps = 1e-6
    continuation = []
    for n in decoded[0].notes if decoded else []:
        start, end = n.start - t_primer, min(n.end - t_primer, length)
        if start >= -eps and end - start > eps:
            continuation.append(pretty_midi.Note(n.velocity, n.pitch, max(start, 0.0) + offset, end + offset))
    # Sustain pedal (codecs with pedal="events"): keep the continuation's changes, released at the end.
    pedal = [
        pretty_midi.ControlChange(c.number, c.value, min(max(c.time - t_primer, 0.0), length) + offset)
        for c in (decoded[0].control_changes if decoded else [])
        if c.time >= t_primer - eps
    ]
    if pedal and pedal[-1].value >= 64:
        pedal.append(pretty_midi.ControlChange(64, 0, offset + length))

    # 960 ticks per beat: the 10 ms grid survives writing at any usual tempo (< 1 ms per tick).
    pm = pretty_midi.PrettyMIDI(resolution=960, initial_tempo=primer.tempo)
    inst = pretty_midi.Instrument(program=primer.program, name="musicrel")
    if include_primer:
        inst.notes.extend(pretty_midi.Note(n.velocity, n.pitch, n.start, n.end) for n in primer.motif_notes)
    inst.notes.extend(continuation)
    inst.notes.sort(key=lambda n: (n.start, n.pitch))
    inst.control_changes = pedal
    pm.instruments.append(inst)
    if seed is not None:
        label = f"musicrel seed={seed}" + ("" if sample_index is None else f" sample={sample_index}")
        pm.text_events.append(pretty_midi.Text(label, 0.0))
    pm.text_events.append(pretty_midi.Text("end", offset + length))
    return pm


# ----------------------------------------------------------------------------------------------------------
# Continuous batching


@dataclass(eq=False)
class _Job:
    id: int
    primer: Primer
    params: SamplingParams
    seed: int
    tokens: np.ndarray  # the primer tokens the model reads (cropped to leave room in the window)
    samples: list  # generated tokens per sample, filled in as its row leaves the batch
    rows_left: int
    admitted: float  # time.perf_counter() when its prefill was done
    prefill_s: float
    stopped: bool = False


@dataclass(eq=False)
class _Row:
    job: _Job
    sample: int
    history: np.ndarray  # primer, then generated tokens (preallocated); the last one is the pending token
    filled: int  # tokens in history
    max_new: int

    @property
    def new_tokens(self) -> int:
        return self.filled - len(self.job.tokens)


def _check_params(j: int, params) -> None:
    if not isinstance(params, SamplingParams):
        raise GenerationError(
            f"job {j}: params must be SamplingParams, got {type(params).__name__}", code="invalid_params"
        )


@contextmanager
def _eval(model):
    was_training = model.training
    if was_training:
        model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()


class DecodeBatch:
    """Continuous batching: the rows of many jobs decode together, one token each per `step()`, and jobs join
    (`admit`) and leave (done or stopped) between steps, so no row waits for a batch to finish.

    One KV cache of max_rows rows (growing up to max_seq_len positions) holds every row; live rows are its
    first rows and share one length, each with its own left padding. A row's K/V never depend on where it sits
    in the cache (relative schemes use distances; the absolute one counts from the row's first real token), so
    rows are copied and shifted along the cache freely:
    - admit: a primer minus its last token is prefilled in a small cache (once per distinct primer, e.g. for
      every sample of a job) and copied to end at the shared length (the running rows shift right first when
      it is longer). Its last token becomes the row's pending token, so in `step` every row does the same:
      feed the pending token, sample the next one. With `primer_cache` > 0 the K/V of that many recent
      distinct primers are kept: the same motif again (say with another seed) needs no prefill at all.
    - a row that leaves is replaced by a kept row from the end of the live block (swap-remove): only the rows
      that move are copied, so rows have no lasting order. Padding that no kept row needs any more is dropped
      only when it is a quarter of the length or more, as that copies every row;
    - when the shared length reaches the window, rows whose context fills it slide (the last half window is
      prefilled again, as `generate` does) and the others shift left.
    Each row samples with its own generator seeded by (job seed, sample index): a job's tokens are the same
    whatever it shares the batch with and whenever it is admitted.
    """

    @torch.inference_mode()
    def __init__(self, model, codec, max_rows: int, primer_cache: int = 0):
        for name, value, low in (("max_rows", max_rows, 1), ("primer_cache", primer_cache, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise GenerationError(
                    f"{name} must be an integer >= {low}, got {value!r}", code="invalid_params"
                )
        self.model, self.codec, self.max_rows, self.primer_cache = model, codec, max_rows, primer_cache
        self._primers: OrderedDict[bytes, tuple[Tensor, Tensor]] = OrderedDict()  # K/V of recent primers
        self.window = model.cfg.max_seq_len
        self.keep_last = max(1, self.window // 2)  # tokens a row keeps when its window slides
        self.device = next(model.parameters()).device
        # k, v (n_layers, max_rows, H, max_len, D); max_len grows as needed, up to the window.
        self._cache = model.new_cache(max_rows, min(self.window, 64))
        self.left_pad = torch.zeros(max_rows, dtype=torch.long, device=self.device)  # (max_rows,)
        self.length = 0  # positions the live rows share
        self.rows: list[_Row] = []
        # Per live row, in batch order:
        self.pending = torch.empty(0, dtype=torch.long, device=self.device)  # (n,) the next token to feed
        self.temperature = torch.empty(0, device=self.device)  # (n,)
        self.top_k = torch.empty(0, dtype=torch.long, device=self.device)  # (n,)
        self.top_p = torch.empty(0, device=self.device)  # (n,)
        self.generators: list[torch.Generator] = []
        self.grammar: Grammar | None = None
        self._ids = itertools.count()
        self._shift_steps = shift_steps(codec)

    @property
    def free_rows(self) -> int:
        return self.max_rows - len(self.rows)

    @property
    def live_jobs(self) -> list[int]:
        """Ids of the jobs still decoding, in the order they were admitted (rows themselves have no order)."""
        return sorted({row.job.id for row in self.rows})

    @torch.inference_mode()
    def admit(self, jobs: Sequence[tuple[Primer, SamplingParams]]) -> list[int]:
        """Add jobs (num_samples rows each) to the batch; returns their ids, as `step` reports them.

        Everything is checked and prefilled before the batch changes: a job that raises (GenerationError for
        bad params, a primer token outside the vocabulary or more rows than are free) leaves it as it was."""
        start = time.perf_counter()
        crop, V = default_max_primer_tokens(self.model), self.model.cfg.vocab_size
        primers = []
        for j, (primer, params) in enumerate(jobs):
            _check_params(j, params)
            tokens = np.asarray(primer.tokens, dtype=np.int64).reshape(-1)[-crop:]
            if not len(tokens):
                tokens = np.array([self.codec.bos_id])
            if tokens.min() < 0 or tokens.max() >= V:
                raise GenerationError(f"job {j}: primer tokens must be in 0..{V - 1}", code="invalid_primer")
            primers.append(tokens)
        n_new = sum(params.num_samples for _, params in jobs)
        if n_new > self.free_rows:
            raise GenerationError(
                f"{n_new} rows do not fit: {self.free_rows} of {self.max_rows} are free", code="batch_full"
            )
        if not jobs:
            return []
        row_jobs = [j for j, (_, params) in enumerate(jobs) for _ in range(params.num_samples)]
        contexts = [primers[j][:-1] for j in row_jobs]
        with _eval(self.model):
            kv = self._prefill(contexts, remember=True)
        width = max(len(c) for c in contexts)
        admitted = time.perf_counter()

        # Nothing below fails: commit.
        n = len(self.rows)
        self._reserve(max(width, self.length))
        if n == 0:
            self.length = width
        elif width > self.length:
            self._shift(width - self.length)
        L = self.length
        for r, (k, v) in enumerate(kv):
            self._cache.k[:, n + r, :, L - k.size(2) : L] = k
            self._cache.v[:, n + r, :, L - v.size(2) : L] = v
        self.left_pad[n : n + n_new] = torch.as_tensor([L - len(c) for c in contexts], device=self.device)
        step_ms = self.codec.config.step_ms
        ids = []
        for j, (primer, params) in enumerate(jobs):
            seed = secrets.randbelow(2**31) if params.seed is None else params.seed
            job = _Job(
                id=next(self._ids),
                primer=primer,
                params=params,
                seed=seed,
                tokens=primers[j],
                samples=[np.zeros(0, dtype=np.int64)] * params.num_samples,
                rows_left=params.num_samples,
                admitted=admitted,
                prefill_s=admitted - start,
            )
            ids.append(job.id)
            max_new = params.max_new_tokens or int(params.seconds * TOKENS_PER_SECOND_CAP) + 64
            for i in range(params.num_samples):
                history = np.empty(len(job.tokens) + max_new, dtype=np.int64)
                history[: len(job.tokens)] = job.tokens
                self.rows.append(_Row(job, i, history, len(job.tokens), max_new))
                self.generators.append(torch.Generator().manual_seed(row_seed(seed, i)))
        rows = self.rows[n:]
        params = [row.job.params for row in rows]

        def cat(old: Tensor, values: list) -> Tensor:
            return torch.cat([old, torch.as_tensor(values, dtype=old.dtype, device=self.device)])

        self.pending = cat(self.pending, [int(row.job.tokens[-1]) for row in rows])
        self.temperature = cat(self.temperature, [p.temperature for p in params])
        self.top_k = cat(self.top_k, [p.top_k or V for p in params])
        self.top_p = cat(self.top_p, [p.top_p for p in params])
        limits = [max(1, math.ceil(p.seconds * 1000.0 / step_ms - 1e-9)) for p in params]
        holds = [round(max_hold_seconds(row.job.primer) * 1000.0 / step_ms) for row in rows]
        grammar = Grammar(self.codec, [row.job.tokens for row in rows], limits, holds, device=self.device)
        if self.grammar is None:
            self.grammar = grammar
        else:
            self.grammar.extend(grammar)
        return ids

    @torch.inference_mode()
    def step(self, should_stop: Callable[[int], bool] | None = None) -> list[tuple[int, ContinuationResult]]:
        """One token for every live row. Returns (job id, result) for the jobs that finished: music long
        enough, max_new_tokens reached, or should_stop(job id) True (checked first: no token for them)."""
        finished = []
        if should_stop is not None:
            stop = {job_id for job_id in self.live_jobs if should_stop(job_id)}
            if stop:
                for row in self.rows:
                    row.job.stopped |= row.job.id in stop
                finished += self._drop([row.job.id not in stop for row in self.rows])
        if not self.rows:
            return finished
        n = len(self.rows)
        with _eval(self.model):
            if self.length == self.window:
                self._make_room()
            self._reserve(self.length + 1)
            cache = replace(
                self._cache,
                k=self._cache.k[:, :n],
                v=self._cache.v[:, :n],
                left_pad=self.left_pad[:n],
                length=self.length,
            )
            logits = decode_one_token(self.model, self.pending, cache)
        self.length += 1
        token = sample(
            self.grammar.constrain(logits), self.temperature, self.top_k, self.top_p, self.generators
        )
        self.pending = token = self.grammar.advance(token)
        reached = (self.grammar.elapsed >= self.grammar.limit).tolist()
        keep = []
        for row, t, done in zip(self.rows, token.tolist(), reached, strict=True):
            row.history[row.filled] = t
            row.filled += 1
            keep.append(not done and row.new_tokens < row.max_new)
        return finished + self._drop(keep)

    def _prefill(self, contexts: list[np.ndarray], remember: bool = False) -> list[tuple[Tensor, Tensor]]:
        """K and V of each context: (n_layers, H, len, D) each, one pair per context (views, not copies).

        Contexts that are alike (every sample of a job) share one forward pass: prefill is compute bound.
        With `remember`, the K/V of the last `primer_cache` distinct contexts are kept, so a primer seen
        again (the same motif with another seed) costs no forward pass at all."""
        found: dict[bytes, tuple[Tensor, Tensor]] = {}
        missing: dict[bytes, np.ndarray] = {}
        for c in contexts:
            key = c.tobytes()
            if key in found or key in missing:
                continue
            if key in self._primers:
                self._primers.move_to_end(key)
                found[key] = self._primers[key]
            else:
                missing[key] = c
        if missing:
            width = max(len(c) for c in missing.values())
            tokens = torch.full((len(missing), width), self.codec.pad_id, dtype=torch.long)  # (U, width)
            left_pad = torch.tensor([width - len(c) for c in missing.values()])  # (U,)
            for u, c in enumerate(missing.values()):
                tokens[u, width - len(c) :] = torch.from_numpy(c)
            small = self.model.new_cache(len(missing), max(1, width))
            if width:
                prefill(self.model, tokens.to(self.device), small, left_pad.to(self.device))
            for u, (key, c) in enumerate(missing.items()):
                kv = small.k[:, u, :, width - len(c) : width], small.v[:, u, :, width - len(c) : width]
                found[key] = kv
                if remember and self.primer_cache:
                    self._primers[key] = (kv[0].clone(), kv[1].clone())
                    while len(self._primers) > self.primer_cache:
                        self._primers.popitem(last=False)
        return [found[c.tobytes()] for c in contexts]

    def _reserve(self, length: int) -> None:
        """Grow the cache (doubling, up to the window) to hold `length` positions, keeping the live rows: a
        batch of short jobs never allocates a whole window per row."""
        size = self._cache.max_len
        if length <= size:
            return
        cache = self.model.new_cache(self.max_rows, min(self.window, max(length, 2 * size)))
        n, L = len(self.rows), self.length
        cache.k[:, :n, :, :L] = self._cache.k[:, :n, :, :L]
        cache.v[:, :n, :, :L] = self._cache.v[:, :n, :, :L]
        self._cache = cache

    def _shift(self, offset: int) -> None:
        """Move every live row `offset` positions along the cache (right > 0; left < 0 drops padding only)."""
        n, L = len(self.rows), self.length
        src, dst = slice(max(0, -offset), L), slice(max(0, offset), L + offset)
        for buf in (self._cache.k, self._cache.v):
            buf[:, :n, :, dst] = buf[:, :n, :, src].clone()
        self.left_pad[:n] = (self.left_pad[:n] + offset).clamp(min=0)
        self.length = L + offset

    def _make_room(self) -> None:
        """The cache is full. Rows whose context fills the window slide: they keep their last `keep_last`
        tokens, all but the pending one prefilled again. The others only shift left."""
        lp = self.left_pad[: len(self.rows)].tolist()
        keep = self.keep_last - 1
        slide = [r for r, pad in enumerate(lp) if pad == 0]
        length = max([keep] + [self.length - pad for pad in lp if pad > 0])
        contexts = [
            self.rows[r].history[self.rows[r].filled - self.keep_last : self.rows[r].filled - 1]
            for r in slide
        ]
        kv = self._prefill(contexts) if slide else []
        self._shift(length - self.length)
        for r, (k, v) in zip(slide, kv, strict=True):
            self._cache.k[:, r, :, length - keep : length] = k
            self._cache.v[:, r, :, length - keep : length] = v
            self.left_pad[r] = length - keep

    def _drop(self, keep: list[bool]) -> list[tuple[int, ContinuationResult]]:
        """Remove the rows not kept: their samples are done; jobs with no rows left are finished.

        Swap-remove: each hole among the first m (kept) rows takes a kept row from beyond them, so only those
        rows' K/V are copied (their real positions only: a row's padding is masked, whatever it holds) and a
        departure costs what moves, not the whole live cache. Every per-row state follows the same order."""
        finished = []
        for row, kept in zip(self.rows, keep, strict=True):
            if kept:
                continue
            job = row.job
            job.samples[row.sample] = row.history[len(job.tokens) : row.filled].copy()
            job.rows_left -= 1
            if job.rows_left == 0:
                finished.append((job.id, self._result(job)))
        m = sum(keep)
        if m == len(keep):
            return finished
        if not m:
            self.rows, self.length, self.grammar = [], 0, None
            self.pending, self.temperature = self.pending[:0], self.temperature[:0]
            self.top_k, self.top_p, self.generators = self.top_k[:0], self.top_p[:0], []
            return finished
        holes = [r for r in range(m) if not keep[r]]
        movers = [r for r in range(m, len(keep)) if keep[r]]  # as many as holes
        order = list(range(m))
        for hole, mover in zip(holes, movers, strict=True):
            order[hole] = mover
        index = torch.as_tensor(order, dtype=torch.long, device=self.device)
        L = self.length
        left_pad = self.left_pad[index]  # (m,)
        # Leading positions that are padding in every kept row could go, but that copies every kept row (what
        # swap-remove avoids). Kept, they only cost attention over masked positions (a row slides when its own
        # context fills the window; `_make_room` shifts padded rows then). So drop them once they are a
        # quarter of the length: later steps attend over <= 3/4 of the positions, repaying the copy in ~12.
        shift = int(left_pad.min())
        if 4 * shift >= L:
            for buf in (self._cache.k, self._cache.v):
                buf[:, :m, :, : L - shift] = buf[:, index, :, shift:L]
            self.length = L - shift
            left_pad = left_pad - shift
        else:
            for hole, mover in zip(holes, movers, strict=True):
                start = int(left_pad[hole])
                for buf in (self._cache.k, self._cache.v):
                    buf[:, hole, :, start:L].copy_(buf[:, mover, :, start:L])
        self.left_pad[:m] = left_pad
        self.grammar.select(index)
        self.rows = [self.rows[r] for r in order]
        self.pending, self.temperature = self.pending[index], self.temperature[index]
        self.top_k, self.top_p = self.top_k[index], self.top_p[index]
        self.generators = [self.generators[r] for r in order]
        return finished

    def _result(self, job: _Job) -> ContinuationResult:
        start = time.perf_counter()
        step_s = self.codec.config.step_ms / 1000.0
        midis = [
            render(
                self.codec,
                job.primer,
                tokens,
                include_primer=job.params.include_primer,
                seed=job.seed,
                sample_index=i,
            )
            for i, tokens in enumerate(job.samples)
        ]
        return ContinuationResult(
            midis=midis,
            tokens=job.samples,
            seed=job.seed,
            primer_tokens=len(job.tokens),
            new_tokens=int(sum(len(t) for t in job.samples)),
            seconds=max(float(self._shift_steps[t].sum()) * step_s for t in job.samples),
            timings={
                "prefill": job.prefill_s,
                "decode": start - job.admitted,
                "render": time.perf_counter() - start,
            },
            stopped=job.stopped,
        )


def generate_batch(
    model,
    codec,
    jobs: Sequence[tuple[Primer, SamplingParams]],
    should_stop: Callable[[int], bool] | None = None,
) -> list[ContinuationResult]:
    """Continue every job's primer num_samples times, all rows as ONE batch (a `DecodeBatch`).

    A row stops when its music reaches params.seconds, after params.max_new_tokens, or when should_stop(job
    index) returns True (checked every step); rows that are done leave the batch, so the others run faster.
    """
    if not jobs:
        return []
    for j, (_, params) in enumerate(jobs):
        _check_params(j, params)
    batch = DecodeBatch(model, codec, max_rows=sum(params.num_samples for _, params in jobs))
    ids = batch.admit(jobs)
    index = {job_id: j for j, job_id in enumerate(ids)}
    stop = None if should_stop is None else (lambda job_id: should_stop(index[job_id]))
    results: dict[int, ContinuationResult] = {}
    while batch.rows:
        results.update(batch.step(stop))
    return [results[job_id] for job_id in ids]


def continue_midi(
    model,
    midi,
    seconds: float = 20.0,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float = 0.95,
    seed: int | None = 0,
    num_samples: int = 2,
    primer_seconds: float = 30.0,
    include_primer: bool = False,
    tracks="merge",
    max_new_tokens: int | None = None,
    codec=None,
) -> list[pretty_midi.PrettyMIDI]:
    """Continue `midi` (path, bytes or PrettyMIDI) num_samples times; one PrettyMIDI per sample."""
    if codec is None:
        codec = EventCodec()
    params = SamplingParams(
        seconds=seconds,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        num_samples=num_samples,
        max_new_tokens=max_new_tokens,
        include_primer=include_primer,
    )
    primer = prepare_primer(codec, midi, primer_seconds, tracks, max_tokens=default_max_primer_tokens(model))
    return generate_batch(model, codec, [(primer, params)])[0].midis
