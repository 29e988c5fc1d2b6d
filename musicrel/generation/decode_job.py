"""A decode job, what `DecodeBatch` takes: apart from the batch because every task builds one (a
continuation here, an accompaniment in `generation.accompaniment`, an infill in `generation.infill`) without
needing the loop's cache bookkeeping, and the checks a job passes before any batch changes live in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from musicrel.errors import GenerationError
from musicrel.generation.controls import RowControls
from musicrel.generation.grammar import Grammar, max_hold_seconds
from musicrel.generation.primer import Primer, default_max_primer_tokens
from musicrel.generation.sampling import SamplingParams, draw_seed


@dataclass(eq=False)
class DecodeJob:
    """A job as the decode loop sees it: `num_samples` rows that read `tokens` (the prompt; the model's window
    is cropped to by the caller) and then sample under `grammar`, each with its own generator seeded by
    row_seed(seed, sample), until the grammar says the row is finished (`Grammar.finished`) or it has drawn
    max_new_tokens. The batch takes the grammar over (it records every row's tokens); a batch holds one
    grammar class at a time (rows of `Grammar` and of a subclass never share one)."""

    tokens: np.ndarray  # (P,) the prompt, P >= 1, ids in the model's vocabulary
    grammar: Grammar  # one row per sample, in its state after `tokens`
    seed: int
    max_new_tokens: int
    temperature: float = 1.0
    top_k: int | None = None  # None: every token
    top_p: float = 1.0
    shift_temperature: float = 1.0
    tail_steps: int = 0  # the result's `seconds` count from the cut, this many steps after the prompt's end
    controls: RowControls | None = None  # reported in the result (the grammar applies them)

    @property
    def num_samples(self) -> int:
        return len(self.grammar.elapsed)


def continuation_job(model, codec, primer: Primer, params: SamplingParams, *, index: int = 0) -> DecodeJob:
    """The job that continues `primer` as `params` ask: the primer cropped to leave room in the window (bos
    when it is empty), the continuation grammar (the join at the cut, the notes' hold from the motif, the
    controls resolved against the primer), a drawn seed when params has none. `index` names the job in
    errors (GenerationError: params that are not SamplingParams, a primer token outside the vocabulary)."""
    check_params(index, params)
    step_ms = codec.config.step_ms
    controls = None if params.controls is None else params.controls.resolve(primer, step_ms)
    tokens = np.asarray(primer.tokens, dtype=np.int64).reshape(-1)[-default_max_primer_tokens(model) :]
    if not len(tokens):
        tokens = np.array([codec.bos_id])
    check_tokens(index, tokens, model.cfg.vocab_size)
    B = params.num_samples
    grammar = Grammar(
        codec,
        [tokens] * B,
        [params.limit_steps(step_ms)] * B,
        [round(max_hold_seconds(primer) * 1000.0 / step_ms)] * B,
        device=next(model.parameters()).device,
        controls=[controls] * B,
        tails=[primer.tail_steps] * B,
        instruments=None if primer.tracks is None else [primer.tracks.instruments()] * B,
    )
    return DecodeJob(
        tokens=tokens,
        grammar=grammar,
        seed=draw_seed() if params.seed is None else params.seed,
        max_new_tokens=params.token_budget(),
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        shift_temperature=params.shift_temperature,
        tail_steps=primer.tail_steps,
        controls=controls,
    )


def check_params(j: int, params) -> None:
    """GenerationError (invalid_params) unless job `j`'s params are SamplingParams."""
    if not isinstance(params, SamplingParams):
        raise GenerationError(
            f"job {j}: params must be SamplingParams, got {type(params).__name__}", code="invalid_params"
        )


def check_tokens(j: int, tokens: np.ndarray, vocab_size: int) -> None:
    """GenerationError (invalid_primer) unless job `j`'s prompt is a token or more, all in the vocabulary."""
    if not len(tokens) or tokens.min() < 0 or tokens.max() >= vocab_size:
        raise GenerationError(f"job {j}: primer tokens must be in 0..{vocab_size - 1}", code="invalid_primer")
