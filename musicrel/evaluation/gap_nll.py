"""The true gap's NLL read two ways by an infill model (`gap_nll`): as an infill (the music after the gap,
then before it: `generation.fim`'s layout) and as a continuation of the same past alone. A model that uses the
future scores the true gap lower with it (docs/INFILL.md, Evidence)."""

from __future__ import annotations

import math

import numpy as np
import torch

from musicrel.generation.fim import FUTURE, FUTURE_SHARE, GAP, PAST, fim_sequence
from musicrel.generation.infill import check_model, infill_segments


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
