"""Given notes placed into a model's stream at their own times while it writes around them: the infill's kept
tracks (`generation.infill`: the model writes the chosen tracks hearing the others in the gap) and the
accompaniment of a model with instruments (`generation.accompaniment`: the melody track's notes given, the
model writing the other instruments). `PlacedGrammar` places them (the accompaniment's melody mechanism,
`accompaniment.MelodyGrammar`, on the codec's own note tokens); `Heard` tells them apart from the model's own
tokens afterwards; the schedule of events is `span.kept_schedule`'s.
"""

from __future__ import annotations

import numpy as np
import torch

from musicrel.generation.grammar import Grammar
from musicrel.midi.codec import shift_steps

_NEVER = 2**62  # the step of "no more events to place"


class PlacedGrammar(Grammar):
    """The continuation grammar, plus given note events (`kept`: (steps from the rows' start, tokens), as
    `span.kept_schedule` makes them): each row's events are placed at their steps, before anything the model
    writes at that step (a time shift that would cross the next one is cut short to land on it, and then its
    token is the only one allowed), so the model writes hearing them. The density loop (a `density` control)
    counts the model's own notes only."""

    def __init__(self, codec, prompts, limit_steps, max_hold_steps, device, controls, kept, instruments=None):
        super().__init__(
            codec,
            prompts,
            limit_steps,
            max_hold_steps,
            device=device,
            controls=controls,
            instruments=instruments,
        )
        steps, tokens = (np.asarray(x, dtype=np.int64) for x in kept)
        B, M = len(prompts), len(steps) + 1  # +1: a sentinel, never due, after every row's events
        at = np.full((B, M), _NEVER, dtype=np.int64)
        tok = np.full((B, M), codec.pad_id, dtype=np.int64)
        at[:, : len(steps)], tok[:, : len(tokens)] = steps, tokens
        self.kept_step = torch.as_tensor(at, device=device)  # (B, M)
        self.kept_tok = torch.as_tensor(tok, device=device)  # (B, M)
        self.kept_next = torch.zeros(B, dtype=torch.long, device=device)  # (B,) the next event to place

    def _due(self) -> tuple[torch.Tensor, torch.Tensor]:
        i = self.kept_next[:, None]
        return self.kept_step.gather(1, i).squeeze(1), self.kept_tok.gather(1, i).squeeze(1)

    def constrain(self, logits: torch.Tensor) -> torch.Tensor:
        logits = super().constrain(logits)
        step, tok = self._due()
        placed = torch.full_like(logits, float("-inf")).scatter_(1, tok[:, None], 0.0)
        return torch.where((step <= self.elapsed)[:, None], placed, logits)  # no sync with the device

    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        step, _ = self._due()
        placed = step <= self.elapsed
        self.kept_next += placed.long()
        remaining = step - self.elapsed
        cut = (self.steps_per_token[tokens] > remaining) & (remaining > 0)
        tokens = torch.where(cut, self.shift0 + remaining.clamp(1, self.max_shift) - 1, tokens)
        tokens = super().advance(tokens)
        if self.any_density:  # the loop holds the model's own notes: a kept note struck is not one
            struck = placed & (tokens >= self.on0) & (tokens < self.on0 + 128)
            self.density.update(-struck.float(), torch.zeros_like(self.density.recent))
        return tokens

    def select(self, rows: torch.Tensor) -> None:
        super().select(rows)
        for name in ("kept_step", "kept_tok", "kept_next"):
            setattr(self, name, getattr(self, name)[rows])

    def extend(self, other: Grammar) -> None:
        if not isinstance(other, PlacedGrammar):
            raise TypeError(f"a PlacedGrammar extends with a PlacedGrammar, not a {type(other).__name__}")
        for name, value in (("kept_step", _NEVER), ("kept_tok", self.codec.pad_id)):
            mine, theirs = getattr(self, name), getattr(other, name)
            width = max(mine.size(1), theirs.size(1))
            mine, theirs = (
                torch.nn.functional.pad(x, (0, width - x.size(1)), value=value) for x in (mine, theirs)
            )
            setattr(self, name, torch.cat([mine, theirs]))
        self.kept_next = torch.cat([self.kept_next, other.kept_next])
        super().extend(other)


class Heard:
    """Tells, token by token, which of a row's tokens were the given note events (the model heard them; they
    are not its notes), replaying PlacedGrammar's rule: the token drawn when a given event was due is that
    event. Their velocity and instrument tokens stay in the row: they set what the model's next notes are
    played with."""

    def __init__(self, codec, kept: tuple):
        self.steps = np.asarray(kept[0], dtype=np.int64).tolist()
        tokens = np.asarray(kept[1], dtype=np.int64)
        self.note = (codec.is_note_on(tokens) | codec.is_note_off(tokens)).tolist()
        self.steps_of = shift_steps(codec).tolist()
        self.next, self.elapsed = 0, 0

    def mine(self, token: int) -> bool:
        """Whether `token` (the row's next) is the model's own, or a kept event's velocity or instrument."""
        placed = self.next < len(self.steps) and self.steps[self.next] <= self.elapsed
        note = placed and self.note[self.next]
        self.next += placed
        self.elapsed += self.steps_of[token]
        return not note
