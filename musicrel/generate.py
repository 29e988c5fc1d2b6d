"""Continue a MIDI motif with a Music Transformer, the gpt-fast way.

`prefill` runs the primer once into a preallocated KV cache, `decode_one_token` then costs O(L) per token,
`sample` does all logits processing (the model never samples) and `generate` is an iterator of tokens, so a
caller can stream them or stop at any step. Around that: `prepare_primer` (motif -> primer tokens), a token
`Grammar` (no orphan or stuck notes, time never goes backwards, the requested length met to one time step),
`generate_batch` (several jobs with their own primers and sampling settings in one batch, each sample with its
own seeded generator so its output does not depend on what else is in the batch) and `render` (tokens -> MIDI
with the motif's tempo and program).
"""

from __future__ import annotations

import itertools
import math
import secrets
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pretty_midi
import torch
from torch import Tensor

from musicrel.errors import GenerationError

MAX_SEED = 2**63 - 1
# Without max_new_tokens a row may emit at most this many tokens per second of music (dense piano passages
# reach ~100 events/s); the cap only matters for a model that stalls time.
TOKENS_PER_SECOND_CAP = 200


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
    timings: dict  # seconds: prefill, decode (shared by every job of the batch), render
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
    """Token rules a generated stream obeys, enforced by masking logits.

    - note-off only for a pitch that is sounding, note-on only for a pitch that is not (no orphan note-offs,
      no silent re-strikes the codec would have to guess about); specials (pad/bos/eos) never;
    - time only moves forward (time shifts are the only clock) and the shift that crosses a row's time limit
      is shortened to land on it, so the requested length is met to one time step.
    Notes still sounding at the end are closed by `render`.
    """

    def __init__(self, codec, prompts: Sequence[np.ndarray], limit_steps: Sequence[int], device=None):
        self.on0 = int(codec.note_on_offset)
        self.off0 = int(codec.note_off_offset)
        self.shift0 = int(codec.time_shift_offset)
        self.steps_per_token = torch.as_tensor(shift_steps(codec), device=device)  # (V,) long
        self.max_shift = int(self.steps_per_token.max())
        V = len(self.steps_per_token)
        self.allowed = torch.ones(V, dtype=torch.bool, device=device)
        for special in (codec.pad_id, codec.bos_id, codec.eos_id):
            self.allowed[special] = False
        self.open = torch.as_tensor(
            np.stack([open_pitches(codec, p) for p in prompts]), device=device
        )  # (B, 128)
        self.elapsed = torch.zeros(len(prompts), dtype=torch.long, device=device)  # (B,) time steps
        self.limit = torch.as_tensor(list(limit_steps), dtype=torch.long, device=device)  # (B,)

    def constrain(self, logits: Tensor) -> Tensor:
        allowed = self.allowed.expand_as(logits).clone()  # (B, V)
        allowed[:, self.on0 : self.on0 + 128] = ~self.open
        allowed[:, self.off0 : self.off0 + 128] = self.open
        return logits.masked_fill(~allowed, float("-inf"))

    def select(self, rows: Tensor) -> None:
        """Keep only `rows` (dropped rows are done)."""
        self.open, self.elapsed, self.limit = self.open[rows], self.elapsed[rows], self.limit[rows]

    def advance(self, tokens: Tensor) -> Tensor:
        """Record the sampled tokens (B,); returns them with limit-crossing shifts cut short."""
        steps = self.steps_per_token[tokens]
        remaining = self.limit - self.elapsed
        cut = (steps > remaining) & (remaining > 0)
        tokens = torch.where(cut, self.shift0 + remaining.clamp(1, self.max_shift) - 1, tokens)
        self.elapsed += torch.where(cut, remaining, steps)
        is_on = (tokens >= self.on0) & (tokens < self.on0 + 128)
        is_off = (tokens >= self.off0) & (tokens < self.off0 + 128)
        pitch = torch.where(is_on, tokens - self.on0, (tokens - self.off0).clamp(0, 127))[:, None]  # (B, 1)
        now = torch.where(is_on | is_off, is_on, self.open.gather(1, pitch).squeeze(1))
        self.open.scatter_(1, pitch, now[:, None])
        return tokens


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
# Primer, batch generation, rendering


def shift_steps(codec) -> np.ndarray:
    """Time steps each token advances (0 for non-shifts), as integers so lengths add up exactly."""
    step = codec.config.step_ms / 1000.0
    return np.rint(np.asarray(codec.time_advance, dtype=np.float64) / step).astype(np.int64)


def open_pitches(codec, tokens) -> np.ndarray:
    """(128,) bool: pitches sounding after `tokens` (note-on more recent than the last note-off)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    index = np.arange(len(tokens))
    last_on = np.full(128, -1)
    last_off = np.full(128, -1)
    on = (tokens >= codec.note_on_offset) & (tokens < codec.note_on_offset + 128)
    off = (tokens >= codec.note_off_offset) & (tokens < codec.note_off_offset + 128)
    np.maximum.at(last_on, tokens[on] - codec.note_on_offset, index[on])
    np.maximum.at(last_off, tokens[off] - codec.note_off_offset, index[off])
    return last_on > last_off


def _codec_for_tracks(codec, tracks):
    from musicrel.codec import CodecConfig, EventCodec

    if tracks is None or tracks == codec.config.tracks:
        return codec
    return EventCodec(CodecConfig.from_dict({**codec.config.to_dict(), "tracks": tracks}))


def _window_notes(notes, start: float) -> list:
    """Notes sounding at or after `start`, clipped to begin there, shifted so `start` is time 0."""
    out = []
    for n in notes:
        if n.end > start:
            out.append(pretty_midi.Note(n.velocity, n.pitch, max(n.start, start) - start, n.end - start))
    return out


def prepare_primer(codec, midi, primer_seconds: float = 30.0, tracks="merge", max_tokens: int | None = None):
    """The last `primer_seconds` of the motif as primer tokens (InvalidMidiError for unusable MIDI).

    Notes sounding at the window start are kept from the start on. When the window encodes to more than
    `max_tokens` tokens its start moves later (re-encoded, so the primer still begins at an event boundary).
    """
    if (
        isinstance(primer_seconds, bool)
        or not isinstance(primer_seconds, int | float)
        or not primer_seconds > 0
    ):
        raise GenerationError(f"primer_seconds must be > 0, got {primer_seconds!r}", code="invalid_params")
    if max_tokens is not None and max_tokens < 1:
        raise GenerationError(f"max_tokens must be >= 1, got {max_tokens!r}", code="invalid_params")
    codec = _codec_for_tracks(codec, tracks)
    pm = codec.read(midi)
    notes = codec.to_notes(pm)
    end_time = max(n.end for n in notes)
    first_start = min(n.start for n in notes)
    start = max(first_start, end_time - float(primer_seconds))
    tokens = np.asarray(codec.encode_notes(_window_notes(notes, start)), dtype=np.int64)
    step = codec.config.step_ms / 1000.0
    for _ in range(64):
        if max_tokens is None or len(tokens) <= max_tokens:
            break
        # Time at which the last max_tokens tokens begin: move the window start there (at least one step).
        elapsed = np.cumsum(np.asarray(codec.time_advance)[tokens])
        start += max(float(elapsed[len(tokens) - max_tokens - 1]), step)
        tokens = np.asarray(codec.encode_notes(_window_notes(notes, start)), dtype=np.int64)
    if max_tokens is not None and len(tokens) > max_tokens:  # e.g. one huge chord: keep the tail as is
        tokens = tokens[-max_tokens:]
    elif start <= first_start and (max_tokens is None or len(tokens) < max_tokens):
        # The window holds the whole motif: mark a piece start, as training streams do ([bos] piece [eos]).
        tokens = np.concatenate([[codec.bos_id], tokens])

    _, tempi = pm.get_tempo_changes()
    tempo = float(tempi[0]) if len(tempi) and tempi[0] > 0 else 120.0
    program = _first_program(pm, tracks)
    return Primer(
        tokens=tokens,
        start_time=float(start),
        end_time=float(end_time),
        tempo=tempo,
        program=program,
        notes=[
            pretty_midi.Note(n.velocity, n.pitch, n.start + start, n.end + start)
            for n in _window_notes(notes, start)
        ],
        motif_notes=list(notes),
    )


def _first_program(pm, tracks) -> int:
    instruments = pm.instruments
    if isinstance(tracks, list | tuple):
        instruments = [instruments[i] for i in tracks if isinstance(i, int) and 0 <= i < len(instruments)]
    return next((int(i.program) for i in instruments if not i.is_drum), 0)


def default_max_primer_tokens(model) -> int:
    """Primers fill at most 3/4 of the context window, leaving room to generate before the window slides."""
    window = model.cfg.max_seq_len
    return max(1, window - max(1, window // 4))


def row_seed(seed: int, sample_index: int) -> int:
    """The generator seed of sample `sample_index` of a job: a function of (seed, index) only, so sample i is
    reproducible whatever num_samples or batch it ran in."""
    return int(np.random.SeedSequence([seed, sample_index]).generate_state(1, np.uint64)[0] >> 1)


def generate_batch(
    model,
    codec,
    jobs: Sequence[tuple[Primer, SamplingParams]],
    should_stop: Callable[[int], bool] | None = None,
) -> list[ContinuationResult]:
    """Continue every job's primer num_samples times, all rows as ONE batch (left padding for uneven primers).

    A row stops when its music reaches params.seconds, after params.max_new_tokens, or when should_stop(job)
    returns True (checked every step); rows that are done leave the batch, so the others run faster.
    """
    if not jobs:
        return []
    device = next(model.parameters()).device
    step_ms = codec.config.step_ms
    seeds, rows = [], []  # rows: (job index, sample index)
    for j, (_, params) in enumerate(jobs):
        if not isinstance(params, SamplingParams):
            raise GenerationError(f"job {j}: params must be SamplingParams, got {type(params).__name__}")
        seeds.append(secrets.randbelow(2**31) if params.seed is None else params.seed)
        rows += [(j, i) for i in range(params.num_samples)]
    # A primer that leaves no room in the window keeps its last tokens only.
    crop = default_max_primer_tokens(model)
    primers = []
    for primer, _ in jobs:
        tokens = np.asarray(primer.tokens, dtype=np.int64)
        tokens = tokens[-crop:] if len(tokens) > crop else tokens
        primers.append(tokens if len(tokens) else np.array([codec.bos_id]))
    B = len(rows)
    P = max(len(primers[j]) for j, _ in rows)
    prompt = torch.full((B, P), codec.pad_id, dtype=torch.long)
    left_pad = torch.empty(B, dtype=torch.long)
    limit_steps, max_new = [], []
    for r, (j, _) in enumerate(rows):
        params = jobs[j][1]
        n = len(primers[j])
        prompt[r, P - n :] = torch.as_tensor(primers[j])
        left_pad[r] = P - n
        limit_steps.append(max(1, math.ceil(params.seconds * 1000.0 / step_ms - 1e-9)))
        max_new.append(params.max_new_tokens or int(params.seconds * TOKENS_PER_SECOND_CAP) + 64)
    max_new_t = torch.tensor(max_new)
    grammar = Grammar(codec, [primers[j] for j, _ in rows], limit_steps, device=device)
    job_rows = [[r for r, (j, _) in enumerate(rows) if j == jj] for jj in range(len(jobs))]

    out = torch.empty(B, max(max_new), dtype=torch.long)  # generated tokens, written in place
    n_new = torch.zeros(B, dtype=torch.long)
    done = torch.zeros(B, dtype=torch.bool)
    stopped = [False] * len(jobs)

    def stop_requested() -> None:
        if should_stop is None:
            return
        for j, rs in enumerate(job_rows):
            if not stopped[j] and not bool(done[rs].all()) and should_stop(j):
                stopped[j] = True
                done[rs] = True

    t0 = time.perf_counter()
    t_first = None
    stop_requested()
    if not bool(done.all()):
        gen = generate(
            model,
            prompt.to(device),
            max(max_new),
            left_pad=left_pad.to(device),
            temperature=torch.tensor([jobs[j][1].temperature for j, _ in rows]),
            top_k=torch.tensor([jobs[j][1].top_k or model.cfg.vocab_size for j, _ in rows]),
            top_p=torch.tensor([jobs[j][1].top_p for j, _ in rows]),
            generators=[torch.Generator().manual_seed(row_seed(seeds[j], i)) for j, i in rows],
            grammar=grammar,
        )
        alive = torch.arange(B)  # the batch row of each row generate() still runs
        token = next(gen)
        t_first = time.perf_counter()
        for step in itertools.count():
            out[alive, step] = token.cpu()
            n_new[alive] += 1
            reached = grammar.elapsed.cpu() >= grammar.limit.cpu()
            done[alive] |= reached | (n_new[alive] >= max_new_t[alive])
            stop_requested()
            if bool(done.all()):
                break
            keep = ~done[alive]
            alive = alive[keep]
            try:
                token = gen.send(keep)  # done rows are dropped from the batch
            except StopIteration:
                break
        gen.close()
    t_end = time.perf_counter()
    t_first = t_first or t_end

    steps = shift_steps(codec)
    results = []
    for j, (primer, params) in enumerate(jobs):
        t_render = time.perf_counter()
        midis, toks, secs = [], [], []
        for r in job_rows[j]:
            new = out[r, : int(n_new[r])].numpy().copy()
            toks.append(new)
            secs.append(float(steps[new].sum()) * step_ms / 1000.0)
            midis.append(
                render(
                    codec,
                    primer,
                    new,
                    include_primer=params.include_primer,
                    seed=seeds[j],
                    sample_index=rows[r][1],
                )
            )
        results.append(
            ContinuationResult(
                midis=midis,
                tokens=toks,
                seed=seeds[j],
                primer_tokens=len(primers[j]),
                new_tokens=int(sum(len(t) for t in toks)),
                seconds=max(secs),
                timings={
                    "prefill": t_first - t0,
                    "decode": t_end - t_first,
                    "render": time.perf_counter() - t_render,
                },
                stopped=stopped[j],
            )
        )
    return results


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
        from musicrel.codec import EventCodec

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
