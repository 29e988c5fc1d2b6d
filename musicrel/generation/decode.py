"""Decoding, the gpt-fast way: `prefill` runs the primer once into a preallocated KV cache, the model's
decoding step (`MusicTransformer.decoder`) then costs O(L) per token, `sample` does all logits processing
after the grammar (the model never samples), and `generate` is an iterator of tokens, so a caller can stream
them or stop at any step.

The decode loop is `generation.decode_batch.DecodeBatch`, built from these three functions: continuations
(the library's `continue_midi`, the command, the service), accompaniments and infills run on it, rows
joining and leaving a running batch. `generate` is kept as the reference: one fixed batch of rows, no
joining, the plainest loop over the same functions. The KV cache and DecodeBatch are tested against it
token for token (`use_cache=False` recomputes the whole window for every token), and the decodes that start
every row together and need nothing else (evaluation's baselines: the model without the grammar, the
continuation model deaf to the melody; the benchmarks) still run on it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from contextlib import contextmanager
from typing import TypeVar

import torch
from torch import Tensor

from musicrel.errors import GenerationError
from musicrel.generation.grammar import Grammar
from musicrel.generation.row_random import RowRandom

T = TypeVar("T")


@contextmanager
def eval_mode(model):
    """Decode without dropout, and hand the model back in the mode it came in (training samples from it)."""
    was_training = model.training
    if was_training:
        model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()


def prefill(model, tokens: Tensor, cache, left_pad: Tensor | None = None) -> Tensor:
    """Run the (left-padded) primer into an empty cache; logits of the last position (B, vocab)."""
    cache.reset(left_pad)
    return model(tokens, cache=cache)[:, -1]


MIN_TEMPERATURE = 1e-6


def sample(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    random: RowRandom | Tensor | Sequence[torch.Generator],
    shift_temperature: Tensor | None = None,
    shifts: slice | None = None,
    *,
    truncate: bool | None = None,
    reshape: bool | None = None,
    scale: bool | None = None,
) -> Tensor:
    """Draw one token per row: logits (B, V); temperature, top_p (B,) float; top_k (B,) long (V = off);
    `random`: the rows' streams (RowRandom: a row's draws never depend on the other rows), their draws for
    this step ((B,) float32 in [0, 1), `RowRandom.ahead`), or one torch.Generator per row (a loop over them:
    tests that pin a distribution); shift_temperature (B,)
    float: a temperature within the time shifts (`shifts`, the codec's slice of them) alone, their block
    keeping its mass (`flatten_block`). Returns (B,) long.

    `truncate` (any row with top-k or top-p on), `reshape` (any row with a shift temperature other than 1)
    and `scale` (any row with a temperature other than 1) skip work no row needs; None finds them from the
    tensors (a device sync each). Either way a row draws the same token: rows without them go through that
    work unchanged (a division by 1 is exact)."""
    B, V = logits.shape
    if logits.dtype != torch.float32:
        logits = logits.float()
    if scale is None:
        scale = bool((temperature != 1).any())
    if scale:
        # Below MIN_TEMPERATURE sampling is greedy anyway; any positive temperature is valid, but one under
        # float32's range (1e-45) divided logits into inf/NaN, no token kept its probability, and the index
        # -1 failed the decoding step of every request in the batch (500s, found by schemathesis; top_p
        # too, below).
        logits = logits / temperature.float().clamp_min(MIN_TEMPERATURE).unsqueeze(1)
    if shift_temperature is not None and shifts is not None:
        if reshape is None:
            reshape = bool((shift_temperature != 1).any())
        if reshape:
            logits = flatten_block(logits, shifts, shift_temperature)
    if truncate is None:
        truncate = bool(((top_k < V) | (top_p < 1)).any())
    if truncate:
        logits = logits.masked_fill(~_kept(logits, top_k, top_p), float("-inf"))
    # Inverse-CDF sampling in the vocabulary's order, one uniform per row. u < 1 - 2**-24, so u x total
    # stays under the total (float32 rounds it down): the first token whose cumulative mass passes it has
    # probability, whatever the masks left.
    cdf = logits.softmax(dim=-1).cumsum(dim=-1)  # (B, V)
    if isinstance(random, (RowRandom, Tensor)):
        u = random.uniform() if isinstance(random, RowRandom) else random
        if u.device != cdf.device:
            u = u.to(cdf.device)
    else:
        u = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in random]).to(cdf.device)
        u = u.float().clamp(max=1 - 2**-24)
    return (cdf <= (u * cdf[:, -1])[:, None]).sum(dim=-1)


def _kept(logits: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """(B, V) bool: the tokens top-k and top-p keep (every token of a row where both are off)."""
    V = logits.size(-1)
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)  # (B, V)
    rank = torch.arange(V, device=logits.device)
    keep = rank[None] < top_k[:, None]  # top-k is a prefix of the sorted order
    probs = sorted_logits.masked_fill(~keep, float("-inf")).softmax(dim=-1)  # (B, V)
    # Nucleus: keep the smallest prefix whose mass reaches top_p (the most likely token always stays).
    # The first token is kept outright: a top_p under float32's range (1e-46) is 0 here, and `< 0` kept none.
    # A row at top_p 1 keeps every token (rounding can bring the running mass to 1 before the last one).
    keep &= ((probs.cumsum(dim=-1) - probs) < top_p[:, None]) | (rank[None] == 0) | (top_p >= 1)[:, None]
    return torch.empty_like(keep).scatter_(1, order, keep)


def flatten_block(logits: Tensor, block: slice, temperature: Tensor) -> Tensor:
    """Logits (B, V) with the tokens of `block` re-tempered by `temperature` (B,) among themselves: the block
    keeps its log-mass, so the choice between it and the rest is unchanged. Rows whose block has no mass
    (all masked), or at temperature 1, are left as they are."""
    part = logits[:, block]
    mass = part.logsumexp(dim=-1, keepdim=True)  # (B, 1)
    tempered = part / temperature.float().clamp_min(MIN_TEMPERATURE)[:, None]
    moved = tempered - tempered.logsumexp(dim=-1, keepdim=True) + mass
    logits = logits.clone()
    # a row at temperature 1 keeps its logits exactly (rounding would move them): it draws what it drew alone
    logits[:, block] = torch.where(mass.isfinite() & (temperature != 1)[:, None], moved, part)
    return logits


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
    seeds: Sequence[int] | None = None,
    generators: Sequence[torch.Generator] | None = None,
    grammar: Grammar | None = None,
    use_cache: bool = True,
    shift_temperature: Tensor | float = 1.0,
    shifts: slice | None = None,
) -> Generator[Tensor, Tensor | None, None]:
    """Yield the next token of every row, (B,) long, up to max_new_tokens times; stop early by not iterating.
    The reference decode loop (module docstring): DecodeBatch draws the same tokens for the same rows.

    prompt (B, P) is left-padded (`left_pad` (B,) counts the padding). Past the context window the window
    slides: the last half window is prefilled again and decoding goes on. `use_cache=False` recomputes the
    whole window for every token (the reference the cache is measured and tested against).

    Rows that are done can be dropped: `gen.send(keep)` with a (B,) bool mask of the rows to go on with
    returns the next tokens of those rows only (their order kept), so finished rows cost nothing.

    Each row draws from its own stream (`RowRandom`) seeded by `seeds` (B,); or, for callers that seed a
    torch.Generator per row, by each generator's seed (`initial_seed()`, what manual_seed set): the row draws
    what DecodeBatch draws for a row of that seed. Neither: every row seed 0.
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
    temperature, top_p, shift_temperature = (
        torch.as_tensor(x, dtype=torch.float32).expand(B).to(device)
        for x in (temperature, top_p, shift_temperature)
    )
    V = model.cfg.vocab_size
    top_k = torch.as_tensor(V if top_k is None else top_k, dtype=torch.long).expand(B).to(device)
    if seeds is None:
        seeds = [0] * B if generators is None else [g.initial_seed() for g in generators]
    random = RowRandom(seeds, device)
    if len(random) != B:
        raise GenerationError(f"{len(random)} seeds for {B} rows", code="invalid_params")
    # the sampler's work no row needs, skipped (rows leaving never make it needed)
    truncate = bool(((top_k < V) | (top_p < 1)).any())
    reshape = bool((shift_temperature != 1).any())
    scale = bool((temperature != 1).any())

    seq = torch.empty(B, P + max_new_tokens, dtype=torch.long, device=device)  # all tokens, no torch.cat
    seq[:, :P] = prompt
    cap = min(window, P + max_new_tokens)  # the cache's size; only a full window ever slides
    start = 0  # first position of the window the model sees
    with eval_mode(model):
        cache = model.new_cache(B, cap, left_pad) if use_cache else None
        decode = model.decoder()  # token (B,), cache -> logits of the next position (B, vocab)
        lp = left_pad
        logits = prefill(model, prompt, cache, lp) if use_cache else model(prompt, left_pad=lp)[:, -1]
        for i in range(max_new_tokens):
            if grammar is not None:
                logits = grammar.constrain(logits)
            token = sample(
                logits, temperature, top_k, top_p, random, shift_temperature, shifts,
                truncate=truncate, reshape=reshape, scale=scale,
            )  # fmt: skip
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
                shift_temperature = shift_temperature[rows]
                random.select(rows)
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
                logits = decode(token, cache)


def collect_rows(gen: Generator[Tensor, Tensor | None, None], rows: int, going: Callable[[], Tensor]):
    """Run `generate` to its end: each of its `rows` rows' tokens, a row dropped as soon as `going()` (a (B,)
    bool over the rows still decoding, after each token) says it is done."""
    return run_to_end(collecting_rows(gen, rows, going))


def run_to_end(steps: Generator[None, None, T]) -> T:
    """What a stepwise decode (a generator that yields after each token and returns its result) returns."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def collecting_rows(
    gen: Generator[Tensor, Tensor | None, None], rows: int, going: Callable[[], Tensor]
) -> Generator[None, None, list[list[int]]]:
    """`collect_rows` one token at a time: yields after each token (but the last), so that a caller can run
    other work between tokens; returns the rows' tokens."""
    out: list[list[int]] = [[] for _ in range(rows)]
    alive = list(range(rows))  # the row of `out` each decoding row fills
    token = next(gen, None)
    while token is not None:
        for r, t in zip(alive, token.tolist(), strict=True):
            out[r].append(t)
        keep = going()
        if not bool(keep.any()):
            break
        alive = [r for r, k in zip(alive, keep.tolist(), strict=True) if k]
        yield
        try:
            token = gen.send(keep)
        except StopIteration:
            break
    return out
