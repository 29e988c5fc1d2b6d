"""The infill token layout (fill-in-the-middle, Bavarian et al. 2022, on this project's event tokens): one
place that training (training/data.py), the library (`generation.infill`) and the evidence
(`evaluation.infills`) build an infill sequence from, so that all three read the same thing. numpy only.

An infill sequence, with a codec whose `CodecConfig.infill` is set:

    [FUTURE] shifts(gap) future... ([eos]) [PAST] ([bos]) past... [FILL] gap...

- `past`, `gap` and `future` are one event stream cut at two time steps (`split_at`): an event at step t
  belongs to the segment whose [from, to) holds t, and a time shift that crosses a cut is split in two, so the
  past ends exactly at the gap's start and the gap's shifts add up exactly to its length.
- the future is written from the gap's start: its first tokens are time shifts as long as the gap, so the
  model knows when the gap ends. It is read first and bounded (`FUTURE_SHARE` of the context); what does not
  fit is cut from its end. `eos` after it: the piece ends there. Notes sounding across the gap's end appear
  there as note-offs without their note-on (the model learns that a note sounds then).
- the past is what continuation reads; cut from its start to fit; `bos` before it: the piece starts there.
- the gap comes last, a token at a time, and ends exactly at the gap's end (the grammar's time limit).

`roles` says what each token is: PLACED (a marker, bos/eos, the gap-length shifts: written, never
predicted), FUTURE, PAST or GAP.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from musicrel.errors import ConfigError
from musicrel.midi.codec import shift_steps

FUTURE_SHARE = 1 / 3  # the future segment (its marker and shifts included) takes at most this share
PLACED, FUTURE, PAST, GAP = 0, 1, 2, 3


def require_infill(codec) -> None:
    if codec.fill_id is None:
        raise ConfigError(
            "this codec has no infill tokens (CodecConfig.infill is false)", code="model_cannot_infill"
        )


def shifts(codec, steps: int) -> np.ndarray:
    """Time-shift tokens that advance exactly `steps` steps (full shifts first)."""
    m = codec.config.max_shift_steps
    full, rem = divmod(max(0, int(steps)), m)
    out = [codec.time_shift_offset + m - 1] * full + ([codec.time_shift_offset + rem - 1] if rem else [])
    return np.asarray(out, dtype=np.int64)


def split_at(codec, tokens, cuts) -> list[np.ndarray]:
    """An event stream (no specials; time 0 at its first token) cut at the time steps `cuts` (non-decreasing):
    len(cuts) + 1 segments. Each segment but the last covers exactly [cut before, cut) in time: a shift that
    crosses a cut is split in two, and a segment the stream ends inside is padded with shifts to its cut. An
    event at a cut's very step belongs to the segment after it."""
    cuts = [int(c) for c in cuts]
    if any(b < a for a, b in zip(cuts, cuts[1:], strict=False)) or (cuts and cuts[0] < 0):
        raise ValueError(f"cuts must be non-decreasing steps >= 0, got {cuts}")
    steps_of = shift_steps(codec).tolist()
    segments: list[list[int]] = [[] for _ in range(len(cuts) + 1)]
    k, clock = 0, 0  # the segment being written; the time at the end of what was read
    for tok in np.asarray(tokens, dtype=np.int64).ravel().tolist():
        while k < len(cuts) and cuts[k] <= clock:
            k += 1
        d = steps_of[tok] if 0 <= tok < len(steps_of) else 0
        if not d:
            segments[k].append(tok)
            continue
        end = clock + d
        while k < len(cuts) and cuts[k] < end:  # the shift crosses a cut: its part before goes before it
            segments[k].extend(shifts(codec, cuts[k] - clock).tolist())
            clock = cuts[k]
            k += 1
        segments[k].extend(shifts(codec, end - clock).tolist())
        clock = end
    for j in range(k, len(cuts)):  # the stream ended before these cuts: pad each segment to its cut
        segments[j].extend(shifts(codec, cuts[j] - max(clock, cuts[j - 1] if j else 0)).tolist())
    return [np.asarray(seg, dtype=np.int64) for seg in segments]


@dataclass
class FimSequence:
    tokens: np.ndarray  # (N,) int64
    roles: np.ndarray  # (N,) int8: PLACED, FUTURE, PAST or GAP
    past_cut: bool  # the past lost tokens at its start to fit
    future_cut: bool  # the future lost tokens at its end to fit

    @property
    def prompt_length(self) -> int:
        """Tokens up to and including [FILL]: what a decoder reads before it writes the gap."""
        gap = np.flatnonzero(self.roles == GAP)
        return int(gap[0]) if len(gap) else len(self.tokens)


def fim_sequence(
    codec,
    past,
    future,
    gap_steps: int,
    gap=(),
    *,
    max_tokens: int | None = None,
    future_tokens: int | None = None,
    past_whole: bool = False,
    future_whole: bool = False,
) -> FimSequence:
    """The infill sequence of a gap of `gap_steps` steps between `past` and `future` (segments of
    `split_at`), followed by the gap's own tokens when given (training, evaluation) or not (a prompt).

    The future (with its marker and the gap-length shifts) is cut at its end to `future_tokens` (default
    FUTURE_SHARE of `max_tokens`); the past is cut at its start so that everything fits in `max_tokens`
    (None: no limit). `past_whole`/`future_whole`: the segment reaches the piece's start/end, marked by
    bos/eos when nothing of it is cut. ConfigError when the gap alone does not leave room for the markers."""
    require_infill(codec)
    past, future, gap = (np.asarray(x, dtype=np.int64).ravel() for x in (past, future, gap))
    head = np.concatenate([[codec.future_id], shifts(codec, gap_steps)])
    if future_tokens is None and max_tokens is not None:
        future_tokens = int(max_tokens * FUTURE_SHARE)
    room_future = len(future) if future_tokens is None else max(0, future_tokens - len(head) - 1)
    future_cut = len(future) > room_future
    future = future[:room_future]
    tail_future = [codec.eos_id] if future_whole and not future_cut else []
    fixed = len(head) + len(future) + len(tail_future) + 2 + len(gap)  # + PAST + FILL
    room_past = len(past) if max_tokens is None else max_tokens - fixed
    if room_past < 0:
        raise ConfigError(
            f"the gap's {len(gap)} tokens and the future's {fixed - len(gap)} leave no room in {max_tokens}",
            code="span_too_long",
        )
    past_cut = len(past) > room_past
    past = past[len(past) - room_past :] if past_cut else past
    lead_past = [codec.bos_id] if past_whole and not past_cut and room_past > len(past) else []
    parts = [
        (head, PLACED),
        (future, FUTURE),
        (np.asarray(tail_future, dtype=np.int64), PLACED),
        (np.asarray([codec.past_id, *lead_past], dtype=np.int64), PLACED),
        (past, PAST),
        (np.asarray([codec.fill_id], dtype=np.int64), PLACED),
        (gap, GAP),
    ]
    tokens = np.concatenate([p for p, _ in parts]).astype(np.int64)
    roles = np.concatenate([np.full(len(p), r, dtype=np.int8) for p, r in parts])
    return FimSequence(tokens, roles, past_cut=past_cut, future_cut=future_cut)
