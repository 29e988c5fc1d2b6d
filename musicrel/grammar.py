"""The token grammar: rules every generated stream obeys, enforced by changing the logits before sampling.

`Grammar.constrain` is the one place where logits are changed (a rule is a mask, or a move of probability
mass as `_repair_orphans` does); `Grammar.advance` records what was drawn. The transformer's decoding loops
and the n-gram baseline run the same rules. Per-row state is tensors with one row per stream, so rows leave
(`select`) and join (`extend`) a running batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from musicrel.codec import open_pitches, shift_steps

# A note the model never closes is closed by the grammar after the motif's longest note times HOLD_FACTOR,
# within these bounds. Measured note lengths (codec.to_notes, sustain pedal applied): 99.9th percentile 8.0 s
# on 400 music21 works and 9.2 s on the real piano/pop files; 99th 2.0 s and 3.7 s.
HOLD_FACTOR = 1.5
MIN_HOLD_SECONDS = 1.0
MAX_HOLD_SECONDS = 8.0

_FOREVER = 2**62  # steps: "no limit" that still adds to an onset without overflow
_SILENT = -(2**62)  # onset of a pitch that is not sounding


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


def max_hold_seconds(primer) -> float:
    """How long the grammar lets a note sound before it closes it for the model: the motif's longest note with
    some room (HOLD_FACTOR), within [MIN_HOLD_SECONDS, MAX_HOLD_SECONDS]; the bounds come from the corpus."""
    longest = max((n.end - n.start for n in primer.motif_notes), default=0.0)
    return float(min(MAX_HOLD_SECONDS, max(MIN_HOLD_SECONDS, HOLD_FACTOR * longest)))
