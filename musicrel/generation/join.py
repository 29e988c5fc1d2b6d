"""The join: what the model reads at a cut, and how decoding starts there.

A cut (the end of a motif, evaluation's cut after --motif-seconds, a `motif_end`) may fall inside a silence,
E steps after the primer's last event. A primer padded to the cut with time shifts ended on a partial shift,
which the model never saw followed by another (the codec writes a gap as whole 1 s shifts, then the rest,
then the event): it read "the next event comes now" and struck its first note right after the cut.

So the primer ends on its last event (`primer.primer_at_cut`; `Primer.tail_steps` = E) and each row's clock
starts E steps before its cut (`elapsed` = -E). Until it reaches the cut a row draws only time shifts, and
only those that keep the first gap >= E (`join_mask`): while E or more steps are left only a whole shift
(a shorter one would end the gap before the cut), then any shift that reaches the cut. This samples the
model's own gap conditioned on "nothing happened in the first E steps", in the token chain it learned, so
what the decoder reads is what it saw in training. The output's clock starts at the cut (`cut_steps`): the
first event lands gap - E after it, never before.

Every decoder that starts at a cut runs this: the grammar (`Grammar`: continuations, streams, the batch
decoder, the n-gram baseline) and, without the grammar, `Join`. E = 0 (a motif that ends on its last
note-off; the accompaniment, which starts at bos) masks nothing: those rows draw what they drew before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from musicrel.midi.codec import shift_steps

if TYPE_CHECKING:  # torch is imported where it is used: rendering and streaming (`cut_steps`) need none
    from torch import Tensor


def join_mask(steps_per_token: Tensor, elapsed: Tensor, max_shift: int) -> Tensor:
    """(B, V) bool: the tokens each row may draw as far as the join goes. A row whose clock has reached the
    cut (elapsed >= 0) may draw anything; before it, only time shifts at least min(steps to the cut,
    max_shift) long. steps_per_token (V,): steps each token advances (0 for every non-shift token); max_shift:
    the longest shift's steps."""
    need = (-elapsed).clamp(min=0, max=max_shift)  # (B,) 0 once at the cut
    return steps_per_token >= need.unsqueeze(1)  # (V,) against (B, 1)


def cut_steps(codec, primer_tokens, tail_steps: int = 0) -> int:
    """Where the continuation starts, in steps from the primer's first token: its end plus the silence
    before the cut (`Primer.tail_steps`). Rendering and streaming count the output's time from here."""
    tokens = np.asarray(primer_tokens, dtype=np.int64).reshape(-1)
    return int(shift_steps(codec)[tokens].sum()) + int(tail_steps)


class Join:
    """The join alone, for decoding without the grammar (`decode.generate(grammar=Join(...))`): each row's
    clock in steps from its cut (`elapsed`, from -tail), and `join_mask` on its logits."""

    def __init__(self, codec, tails: Sequence[int], device=None):
        import torch

        self.steps_per_token = torch.as_tensor(shift_steps(codec), device=device)  # (V,) long
        self.max_shift = int(codec.config.max_shift_steps)
        self.elapsed = -torch.as_tensor(list(tails), dtype=torch.long, device=device).reshape(-1)  # (B,)

    def constrain(self, logits: Tensor) -> Tensor:
        allowed = join_mask(self.steps_per_token, self.elapsed, self.max_shift)
        return logits.masked_fill(~allowed, float("-inf"))

    def advance(self, tokens: Tensor) -> Tensor:
        self.elapsed = self.elapsed + self.steps_per_token[tokens]
        return tokens

    def select(self, rows: Tensor) -> None:
        self.elapsed = self.elapsed[rows]
