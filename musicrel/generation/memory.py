"""A copy memory beside the model: each row's next-token distribution mixed with what followed the longest
earlier match of the row's latest tokens (a cache language model, Kuhn & De Mori 1990; the lookup of
"prompt lookup decoding"), as much as a small gate fitted on held-out music trusts it.

Why: music repeats (a riff, a drum bar, a chorus), and the models copy less than the music does. On the
held-out game bands the model with its memory predicts the truth 0.13 nats a token better than the model alone
(docs/INSTRUMENTS.md), the memory reading no further back than the model does.

How, for B rows at once with fixed shapes (a step asks the device nothing, and a static step could hold it):
each row keeps its last `window` + 1 tokens right-aligned (the model's context: a match is looked for no
further back than the model reads) (its newest in the last column, -1 before a short
history) and, for every column, the length of the common suffix of the tokens up to it and the row's whole
history (at most MAX_MATCH). Appending a token moves both one column left and updates the lengths with one
comparison: a column still matches if its token is the new one and the column before it matched. The
columns of the longest match vote for the token that followed them; the gate (`model.config.MemoryConfig`, a
logistic regression on how long and how unanimous the match is and how much the model already agrees)
says how much of the vote to mix into the model's probabilities. The grammar and the sampler work on the
mixture as they worked on the model's logits.

A checkpoint carries its gate (config.json's "memory", `MemoryConfig`): it is fitted to that model's
predictions (`fit_gate`); a checkpoint without one decodes as before.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from musicrel.model.config import MAX_MATCH, MemoryConfig


def suffix_matches(tokens: Tensor) -> Tensor:
    """tokens (B, S) right-aligned (-1 before a short history) -> (B, S) long: for each column c, the length
    of the common suffix of tokens[:, :c+1] and the whole row, at most MAX_MATCH (the last column, the row
    itself, 0). Only what the window holds is read."""
    B, S = tokens.shape
    end = tokens[:, -MAX_MATCH:].flip(1)  # (B, <=K): the newest token first
    run = torch.ones(B, S, dtype=torch.bool, device=tokens.device)
    match = torch.zeros(B, S, dtype=torch.long, device=tokens.device)
    for t in range(end.size(1)):
        # column c matches t+1 deep if its token t back equals the row's token t back (and all before did)
        back = torch.full_like(tokens, -2)
        back[:, t:] = tokens[:, : S - t]
        run &= (back == end[:, t : t + 1]) & (back >= 0)
        match += run
    match[:, -1] = 0
    return match


class CopyMemory:
    """The rows' windows of tokens and their match lengths; `mix` before the grammar, `advance` with the
    token the row took. Rows follow the batch with `select` and `extend`, as the grammar's state does."""

    ROWS = ("tokens", "match")

    def __init__(self, config: MemoryConfig, histories: list[np.ndarray], window: int, device=None):
        S = window + 1
        tokens = torch.full((len(histories), S), -1, dtype=torch.long)
        for r, h in enumerate(histories):
            h = np.asarray(h, dtype=np.int64).reshape(-1)[-S:]
            if len(h):
                tokens[r, S - len(h) :] = torch.from_numpy(h)
        self.tokens = tokens.to(device)  # (B, S)
        self.match = suffix_matches(self.tokens)  # (B, S)
        self.gate = torch.tensor(config.gate, dtype=torch.float32, device=device)  # (F+1,)
        self.config = config

    def __len__(self) -> int:
        return self.tokens.size(0)

    def read(self, log_model: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """What the gate reads, given the model's log-probabilities (B, V): (features (B, F) in FEATURES'
        order, the memory's distribution (B, V), whether a row has an earlier match (B,) bool)."""
        B, V = log_model.shape
        longest = self.match[:, :-1].amax(dim=1)  # (B,)
        voters = (self.match[:, :-1] == longest[:, None]) & (longest[:, None] > 0)  # (B, S-1)
        following = self.tokens[:, 1:].clamp(0, V - 1)  # (B, S-1): what followed each column
        counts = torch.zeros(B, V, device=log_model.device).scatter_add_(1, following, voters.float())
        votes = counts.sum(dim=1).clamp(min=1)  # (B,)
        p_memory = counts / votes[:, None]
        p_model = log_model.exp()
        features = torch.stack(
            [
                longest.clamp(min=1).float().log(),
                votes.log(),
                (counts > 0).sum(dim=1).clamp(min=1).float().log(),
                counts.amax(dim=1) / votes,
                (p_model * p_memory).sum(dim=1).clamp(min=1e-9).log(),
                -(p_model * log_model.clamp(min=-1e4)).sum(dim=1),
            ],
            dim=1,
        )
        return features, p_memory, longest > 0

    def mix(self, logits: Tensor) -> Tensor:
        """logits (B, V) -> log of the mixture (B, V): (1 - g) p_model + g p_memory, g the gate's share per
        row (0 where the row's latest token never came before in its window)."""
        log_model = logits.float().log_softmax(dim=-1)
        features, p_memory, matched = self.read(log_model)
        share = (torch.sigmoid(self.gate[0] + features @ self.gate[1:]) * matched)[:, None]  # (B, 1)
        return torch.logaddexp(log_model + torch.log1p(-share), p_memory.log() + share.log())

    def advance(self, token: Tensor) -> None:
        """Every row's new token (B,) appended: the window moves one column left. A column now matches one
        deeper than the column before it did (which, moved, has its index) if its token is the new one."""
        token = token.to(self.tokens.device)
        tokens = torch.cat([self.tokens[:, 1:], token[:, None]], dim=1)
        match = torch.where(tokens == token[:, None], (self.match + 1).clamp(max=MAX_MATCH), 0)
        match[:, -1] = 0
        self.tokens, self.match = tokens, match

    def select(self, rows) -> None:
        """Keep only `rows` (an index tensor or list), in that order."""
        self.tokens, self.match = self.tokens[rows], self.match[rows]

    def extend(self, other: CopyMemory) -> None:
        """Append the rows of `other`."""
        self.tokens = torch.cat([self.tokens, other.tokens])
        self.match = torch.cat([self.match, other.match])
