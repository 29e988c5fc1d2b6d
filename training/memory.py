"""`musicrel fit-memory`: fit a checkpoint's copy-memory gate (`generation.memory`) on a prepared split and
report held-out NLL per source with and without it.

Every token of the pieces read is predicted by the model (windows of its context, each token once, after at
least half a window where the piece has it) and by the memory of the tokens before it in the same piece (a
row stepped token by token, exactly as decoding steps it); the gate is the logistic regression of FEATURES
that maximises the mixture's likelihood, each source weighing the same (the largest corpus does not choose
it alone). The report is the mixture's NLL against the model's on another split, per source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from musicrel.errors import ConfigError
from musicrel.model.config import FEATURES

MIN_TOKENS = 2
READ_ROWS = 1024  # positions whose memory is read in one batch
WINDOWS_AT_ONCE = 4  # the model's windows scored in one batch


@dataclass
class Scored:
    """Per token of a source: the model's and the memory's probability of the truth, what the gate reads,
    and whether the memory had a match."""

    p_model: np.ndarray  # (N,)
    p_memory: np.ndarray  # (N,)
    features: np.ndarray  # (N, F)
    matched: np.ndarray  # (N,) bool

    def mixture_nll(self, gate: tuple[float, ...]) -> float:
        share = _share(torch.from_numpy(self.features).double(), torch.tensor(gate, dtype=torch.float64))
        share = share * torch.from_numpy(self.matched)
        p = (1 - share) * torch.from_numpy(self.p_model).double() + share * torch.from_numpy(self.p_memory)
        return float(-p.clamp(min=1e-30).log().mean())

    @property
    def model_nll(self) -> float:
        return float(-np.log(np.maximum(self.p_model.astype(np.float64), 1e-30)).mean())


def _share(features, gate):
    return torch.sigmoid(gate[0] + features @ gate[1:])


def pieces(data, split: str, max_tokens: int) -> dict[str, list[np.ndarray]]:
    """Each source's pieces in `split` (ids in the stream's own codec), at most `max_tokens` tokens a source
    (its first pieces; the last one cut)."""
    from musicrel.data.prepared import load_manifest, load_split, source_ranges

    manifest = load_manifest(data)
    stream, offsets = load_split(data, split)
    ranges = source_ranges(manifest, split) or {"all": (0, len(stream))}
    out = {}
    for name, (a, b) in ranges.items():
        bounds = [int(o) for o in offsets if a <= o < b] + [b]
        taken, left = [], max_tokens
        for s, e in zip(bounds[:-1], bounds[1:], strict=True):
            e = min(e, s + left)
            if e - s >= MIN_TOKENS:
                taken.append(np.asarray(stream[s:e], dtype=np.int64))
                left -= e - s
            if left <= 0:
                break
        if taken:
            out[name] = taken
    return out


@torch.inference_mode()
def score_piece(model, tokens: np.ndarray, window: int) -> tuple[np.ndarray, ...]:
    """(p_model, p_memory, features, matched) for tokens[1:] of one piece."""
    from musicrel.generation.memory import CopyMemory
    from musicrel.model.config import MemoryConfig

    L = model.cfg.max_seq_len
    n = len(tokens)
    log_model = torch.empty(n, model.cfg.vocab_size)
    # windows of the context every half window, so that each token after the first half window is predicted
    # from at least half a window, as a decoding row's sliding window always leaves it
    stride = L // 2
    starts = [0] + list(range(stride, max(n - L, 0) + stride, stride))
    for b in range(0, len(starts), WINDOWS_AT_ONCE):
        group = starts[b : b + WINDOWS_AT_ONCE]
        size = min(L, n - group[0]) - 1
        same = [s for s in group if min(L, n - s) - 1 == size]  # full windows batch; a short last one alone
        for batch in (same, [s for s in group if s not in same]):
            if not batch:
                continue
            width = min(L, n - batch[0]) - 1
            x = torch.stack([torch.from_numpy(tokens[s : s + width]) for s in batch])
            logp = model(x).float().log_softmax(-1)  # (b, width, V): predicts tokens[s+1 : s+width+1]
            for row, s in enumerate(batch):
                first = 0 if s == 0 else L - stride - 1
                log_model[s + 1 + first : s + 1 + width] = logp[row, first:]
    memory = CopyMemory(MemoryConfig(gate=(0.0,) * len(FEATURES) + (0.0,)), [tokens[:1]], window)
    truth = torch.from_numpy(tokens)
    states: list[tuple[torch.Tensor, torch.Tensor]] = []
    parts = []
    for i in range(1, n):
        states.append((memory.tokens, memory.match))  # advance replaces them: no copy needed
        memory.advance(truth[i : i + 1])
        if len(states) == READ_ROWS or i == n - 1:
            # the gate's reading of many positions at once: each position's window is a row of its own
            first = i + 1 - len(states)
            memory.tokens, memory.match, now = (
                torch.cat([t for t, _ in states]),
                torch.cat([m for _, m in states]),
                (memory.tokens, memory.match),
            )
            features, p_memory, matched = memory.read(log_model[first : i + 1])
            memory.tokens, memory.match = now
            y = truth[first : i + 1, None]
            parts.append(
                (
                    log_model[first : i + 1].gather(1, y)[:, 0].exp().numpy(),
                    p_memory.gather(1, y)[:, 0].numpy(),
                    features.numpy(),
                    matched.numpy(),
                )
            )
            states = []
    if not parts:
        return np.zeros(0), np.zeros(0), np.zeros((0, len(FEATURES)), np.float32), np.zeros(0, bool)
    return tuple(np.concatenate([p[k] for p in parts]) for k in range(4))


def score(model, codec, data, split: str, max_tokens: int, progress=None) -> dict[str, Scored]:
    """Each source's Scored over its pieces of `split` (see `pieces`), in the model's token ids (`codec`:
    the model's)."""
    from musicrel.data.prepared import load_manifest
    from musicrel.midi.codec import CodecConfig, EventCodec, id_map

    manifest = load_manifest(data)
    ids = id_map(EventCodec(CodecConfig.from_dict(manifest["codec"])), codec)
    window = model.cfg.max_seq_len - 1
    out = {}
    for name, taken in pieces(data, split, max_tokens).items():
        parts = [score_piece(model, ids[p] if ids is not None else p, window) for p in taken]
        out[name] = Scored(*(np.concatenate([part[k] for part in parts]) for k in range(4)))
        if progress:
            progress(f"{split} {name}: {len(out[name].p_model)} tokens of {len(taken)} pieces")
    return out


def fit_gate(scored: dict[str, Scored]) -> tuple[float, ...]:
    """The gate (bias, one weight per feature) maximising the mixture's mean log-likelihood, each source's
    mean weighing the same."""
    parts = [
        (
            torch.from_numpy(s.features).double(),
            torch.from_numpy(s.p_model).double().clamp(min=1e-30),
            torch.from_numpy(s.p_memory).double(),
            torch.from_numpy(s.matched),
        )
        for s in scored.values()
        if len(s.p_model)
    ]
    if not parts:
        raise ConfigError("no tokens to fit the memory's gate on", code="no_data")
    gate = torch.zeros(parts[0][0].size(1) + 1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([gate], max_iter=500, line_search_fn="strong_wolfe")

    def loss():
        opt.zero_grad()
        total = 0
        for features, p_model, p_memory, matched in parts:
            share = _share(features, gate) * matched
            total = total - ((1 - share) * p_model + share * p_memory).log().mean()
        total = total / len(parts)
        total.backward()
        return total

    opt.step(loss)
    fitted = tuple(float(w) for w in gate.detach())
    if not all(math.isfinite(w) for w in fitted):
        raise ConfigError("the memory's gate did not converge", code="no_data")
    return fitted
