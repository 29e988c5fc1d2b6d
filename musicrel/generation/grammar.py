"""The token grammar: rules every generated stream obeys, enforced by changing the logits before sampling.

`Grammar.constrain` is the one place where logits are changed (a rule is a mask, or a move of probability
mass as `_repair_orphans` does); `Grammar.advance` records what was drawn. The transformer's decoding loops
and the n-gram baseline run the same rules. Per-row state is tensors with one row per stream, so rows leave
(`select`) and join (`extend`) a running batch.

The user's controls (`generation.controls`: key, chords, range, polyphony, density) are rules here too, per
row: a batch where no row has any runs exactly the code path (and draws exactly the tokens) it did before.

A codec with instruments (`CodecConfig.instruments`) adds INSTRUMENT tokens and per-instrument note state
(`_Instruments`); a codec without them never reaches that code: same masks, same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from musicrel.generation.controls import (
    DENSITY_CHORD,
    DENSITY_SHIFT_TILT,
    ControlError,
    DensityLoop,
    RowControls,
)
from musicrel.generation.join import join_mask
from musicrel.midi.codec import open_pitches, shift_steps
from musicrel.midi.instruments import DRUMS, current_instrument, playable

# A note the model never closes is closed by the grammar after the motif's longest note times HOLD_FACTOR,
# within these bounds. Measured note lengths (codec.to_notes, sustain pedal applied): 99.9th percentile 8.0 s
# on 400 music21 works and 9.2 s on the real piano/pop files; 99th 2.0 s and 3.7 s.
HOLD_FACTOR = 1.5
MIN_HOLD_SECONDS = 1.0
MAX_HOLD_SECONDS = 8.0

# A pitch that has MAX_REPEATS of the last REPEAT_WINDOW note-ons is not struck again until others come: its
# note-on mass goes to the other pitches. The model's own loop: once it repeats a pitch, its probability of
# repeating it again rises with every strike (median 0.76 among the note-ons at the first strikes of a drone,
# 0.97 after 20), so a temperature under 1 (which squares 0.97 into 0.999 at 0.5) made the loop absorbing:
# 157 notes all A4. Real music (the train split) strikes a pitch that already has 8 of the previous 16
# note-ons at 0.05 % (POP909) to 0.6 % (music21) of its notes; the cap keeps any pitch to about half.
REPEAT_WINDOW = 16
MAX_REPEATS = 8

# An instrument that strikes in the prompt's last KEEP_SECONDS and then falls silent for longer than its own
# longest gap between strikes in the prompt's last KEEP_WINDOW_SECONDS (KEEP_GAP_FACTOR x that, at least
# MIN_KEEP_GAP_SECONDS) is drawn back: its INSTRUMENT token gains KEEP_SLOPE nats a second of silence past
# that gap, at most KEEP_MAX_NATS. Left alone, the model dropped 19 % of the instruments still playing at the
# end of 24 motifs of 8 pop songs for the next 10 s where the songs kept them (2 % with the rule), 13-15 % of
# the game bands' (3-7 %): docs/INSTRUMENTS.md "Every instrument kept playing".
KEEP_SECONDS = 5.0
KEEP_WINDOW_SECONDS = 10.0
KEEP_GAP_FACTOR = 1.5
MIN_KEEP_GAP_SECONDS = 1.0
KEEP_SLOPE = 2.0
KEEP_MAX_NATS = 12.0

_FOREVER = 2**62  # steps: "no limit" that still adds to an onset without overflow
_SILENT = -(2**62)  # onset of a pitch that is not sounding
_FAR = 1000  # a pitch further from every pitch than any other (`_repair_orphans`)
_TINY = torch.finfo(torch.float32).tiny  # divides a mass that may be 0 (what it scales is 0 then)


def reweigh(block: Tensor, weights: Tensor) -> None:
    """Multiply `block` (B, n), in place, by `weights` (B, n) and scale each row back to the mass it had: a
    rule that chooses among the note-ons without changing how many notes. Nothing to keep (no mass) or
    nothing left (every weight 0): the row stays 0."""
    mass = block.sum(dim=1, keepdim=True)  # (B, 1)
    block.mul_(weights)
    block.mul_(mass / block.sum(dim=1, keepdim=True).clamp_min(_TINY))


def first_due(open_: Tensor, onset: Tensor, max_hold: Tensor) -> Tensor:
    """The step at which the first sounding note (`open_`, `onset` (..., 128)) reaches max_hold (broadcast
    to them), never before the cut (a note of the primer still open sounds at least until the cut: the motif
    says so); _FOREVER where none sounds. (...,) long."""
    return torch.where(open_, (onset + max_hold).clamp(min=0), _FOREVER).amin(dim=-1)


class Grammar:
    """Token rules a generated stream obeys, enforced by masking logits; they keep every stream valid while
    taking from the model only what the codec cannot represent.

    - note-off only for a pitch that is sounding; an orphan note-off is repaired into a note-off of the
      nearest sounding pitch rather than masked away (`_repair_orphans`). A note-on of a pitch that is
      sounding is a re-strike: legal music, which the codec decodes as "close, then strike again", so it
      stays possible (forbidding it kept the old note open and pushed the model elsewhere: notes piled up).
    - no drone: a pitch that has MAX_REPEATS of the last REPEAT_WINDOW note-ons (the primer's count) is not
      struck again; its mass moves to the other note-ons, so the rule chooses a pitch, not how many notes.
    - no note is held by accident: a note the model leaves open for `max_hold` steps is closed then (the time
      shift that would cross that moment is shortened to land on it, and the next token is its note-off, fed
      to the model like any other), so a note sounds as long as the model says, up to a length learned from
      the data (see `max_hold_seconds`), and never until the end of the file.
    - specials (pad/bos/eos, the infill markers) never; time only moves forward (time shifts are the only
      clock) and the shift that crosses a row's time limit is shortened to land on it, so the requested
      length is met to one step.
    - the join (`tails`, musicrel.generation.join): a row's clock starts `tail` steps before its cut (the
      silence between the primer's last event and the cut); until it reaches the cut only time shifts that
      keep the first gap at least that long are drawn, and no note is closed for its length before the cut.
    - controls (rows given `RowControls`): key, chord and range biases/masks move probability among the
      note-ons only, so they choose pitches, not how many notes; the chord is the one sounding at the row's
      time (the progression repeats); a polyphony cap masks the note-ons of silent pitches while the row
      sounds that many; density sets one bias per row after each token, a proportional-integral loop on
      the log of the recent notes per second (`controls.DensityLoop`), which moves the note-ons, the waiting
      and the length of the gaps (`_steer`; why, in musicrel.generation.controls).
    - instruments (a codec with them): the note rules above hold per instrument. `open`, `onset` and the
      rules on them are the current instrument's (the last INSTRUMENT token's, the piano's before any); the
      others wait in a bank (`_Instruments`). An INSTRUMENT token is followed by a note event or its
      SET_VELOCITY, never repeats the current instrument, and is forced when another instrument holds a note
      past max_hold (its note-off comes next). Drums are left out of the drone rule (a hi-hat repeats).
      An instrument that played in the prompt's last seconds and falls silent past its own longest gap there
      is drawn back (`_Instruments.draw_back`: its INSTRUMENT token gains probability with the silence),
      so a band's bass or drums do not drop out. The controls still read the current instrument's notes only.
    """

    def __init__(
        self,
        codec,
        prompts: Sequence[np.ndarray],
        limit_steps: Sequence[int],
        max_hold_steps: Sequence[int] | None = None,
        device=None,
        controls: Sequence[RowControls | None] | None = None,
        tails: Sequence[int] | None = None,
        instruments: Sequence[np.ndarray | None] | None = None,
    ):
        self.codec = codec
        self.on0 = int(codec.note_on_offset)
        self.off0 = int(codec.note_off_offset)
        self.shift0 = int(codec.time_shift_offset)
        self.steps_per_token = torch.as_tensor(shift_steps(codec), device=device)  # (V,) long
        self.max_shift = int(self.steps_per_token.max())
        self.shift_seconds = self.steps_per_token[self.shift0 : self.shift0 + self.max_shift].float() * (
            float(codec.config.step_ms) / 1000.0
        )  # (max_shift,)
        V = len(self.steps_per_token)
        self.allowed = torch.ones(V, dtype=torch.bool, device=device)
        # specials (pad/bos/eos) and the infill markers after them (FUTURE/PAST/FILL) are placed, never drawn
        self.allowed[codec.pad_id :] = False
        B = len(prompts)
        controls = list(controls) if controls is not None else [None] * B
        # a codec with instruments: their tokens are allowed, and the note state is per instrument
        if codec.instrument_offset is None and any(c is not None and c.asks_instruments for c in controls):
            raise ControlError(
                "instruments: this model writes one piano stream; the control needs a model with instruments",
                code="no_instruments",
            )
        # who may play: the instruments control's choice, else the row's default (`instruments`: the upload's
        # tracks, a continuation's), else the instruments its prompt plays
        defaults = list(instruments) if instruments is not None else [None] * B
        chosen = [
            d if c is None or c.instruments is None else c.instruments
            for c, d in zip(controls, defaults, strict=True)
        ]
        self.inst = (
            _Instruments(codec, prompts, device, chosen) if codec.instrument_offset is not None else None
        )
        if self.inst is not None:
            self.allowed[self.inst.first : self.inst.first + self.inst.count] = True
        # Every row's clock counts steps from its cut, which lies `tail` steps after its primer's last token
        # (Primer.tail_steps; the join: musicrel.generation.join): it starts at -tail.
        tail = np.zeros(B, np.int64) if tails is None else np.asarray(list(tails), dtype=np.int64).reshape(B)
        # onset: when each sounding note began, in steps from the cut (< 0 for the primer's notes)
        onsets = np.stack([note_onsets(codec, p) for p in prompts]) if B else np.zeros((0, 128), np.int64)
        onsets = np.where(onsets > _SILENT, onsets - tail[:, None], _SILENT)
        self.onset = torch.as_tensor(onsets, device=device)  # (B, 128) long
        hold = [_FOREVER] * B if max_hold_steps is None else [max(1, int(h)) for h in max_hold_steps]
        self.max_hold = torch.as_tensor(hold, dtype=torch.long, device=device)  # (B,)
        if self.inst is not None:
            self.onset = self.inst.start(tail, self.max_hold)  # the current instrument's
        self.open = self.onset > _SILENT  # (B, 128)
        self.elapsed = torch.as_tensor(-tail, device=device)  # (B,) time steps since the cut
        self.limit = torch.as_tensor(list(limit_steps), dtype=torch.long, device=device)  # (B,)
        self.step_s = float(codec.config.step_ms) / 1000.0
        recent = [recent_pitches(codec, p, REPEAT_WINDOW) for p in prompts]
        self.recent_pitches = torch.as_tensor(
            np.stack(recent) if B else np.zeros((0, REPEAT_WINDOW), np.int64), device=device
        )  # (B, REPEAT_WINDOW) long: the last note-ons' pitches, oldest first; -1 where there were fewer
        self._init_controls(controls, device)

    def _init_controls(self, controls: list[RowControls | None], device) -> None:
        """Per-row control tensors; rows without controls get the neutral ones (zero bias, no cap)."""
        B = len(controls)
        C = max([1] + [len(c.chord_ends) for c in controls if c is not None])
        pitch_bias = np.zeros((B, 128), np.float32)
        chord_ends = np.full((B, C), _FOREVER, np.int64)  # a row without chords stays on its first "chord"
        chord_bias = np.zeros((B, C, 128), np.float32)
        period = np.full(B, _FOREVER, np.int64)
        max_poly = np.full(B, 128, np.int64)
        target = np.full(B, np.nan)
        start = np.zeros(B)
        for r, c in enumerate(controls):
            if c is None:
                continue
            pitch_bias[r] = c.pitch_bias
            n = len(c.chord_ends)
            if n:
                chord_ends[r, :n], chord_bias[r, :n], period[r] = c.chord_ends, c.chord_bias, c.chord_ends[-1]
            max_poly[r], target[r], start[r] = c.max_polyphony, c.density, c.density_start

        def t(x, dtype=None):
            return torch.as_tensor(x, dtype=dtype, device=device)

        self.controlled = t([c is not None for c in controls], torch.bool)  # (B,)
        self.pitch_bias, self.chord_ends, self.chord_bias = t(pitch_bias), t(chord_ends), t(chord_bias)
        self.chord_period, self.max_poly = t(period), t(max_poly)
        self.density = DensityLoop(target, start, device)  # the density control's loop (its bias: _steer)
        self._flags()

    def _flags(self) -> None:
        # Python flags, so a batch with no controls (or no density) skips their work without a device sync
        # per step; refreshed only when rows leave or join.
        self.any_control = bool(self.controlled.any())
        self.any_density = bool(self.density.on.any())
        self.any_pitch = bool((self.pitch_bias != 0).any())
        self.any_chords = bool((self.chord_period < _FOREVER).any())
        self.any_cap = bool((self.max_poly < 128).any())

    def deadline(self) -> Tensor:
        """(B, 128) long: the step at which each note would reach its row's max_hold, never before the cut
        (`first_due`'s rule, per pitch)."""
        return (self.onset + self.max_hold.unsqueeze(1)).clamp(min=0)

    def finished(self) -> Tensor:
        """(B,) bool: rows whose stream is complete (the time limit reached): the decode loop lets them go."""
        return self.elapsed >= self.limit

    def overdue(self) -> Tensor:
        """(B, 128) bool: sounding notes that have reached their row's max_hold."""
        return self.open & (self.elapsed.unsqueeze(1) >= self.deadline())

    def constrain(self, logits: Tensor) -> Tensor:
        """Logits (B, V) -> the log-probabilities the rules leave (-inf: not allowed).

        The rules work on probabilities (`_repair_orphans` takes the softmax, the mask takes the log): a move
        of mass is then a product and a sum, where in logits it took two logsumexps; the same masks and mass
        moves, in a fixed few batched operations and without asking the device anything."""
        probs = self._repair_orphans(logits)
        if self.any_control:
            probs = self._steer(probs)
        probs = self._vary(probs)
        if self.inst is not None:
            self.inst.draw_back(probs, self.elapsed)
        if self.inst is not None and self.inst.any_range:  # an orchestral instrument strikes within its range
            self.inst.keep_in_range(probs.narrow(1, self.on0, 128))
        # Before its cut a row only covers the silence already heard (no overdue note there: `deadline`).
        allowed = self.allowed & join_mask(self.steps_per_token, self.elapsed, self.max_shift)  # (B, V)
        overdue = self.overdue()
        forced = overdue.any(dim=1, keepdim=True)  # (B, 1) these rows must close a note now, and only that
        off = allowed.narrow(1, self.off0, 128)  # a view: written through
        allowed &= ~forced
        off.copy_(torch.where(forced, overdue, off & self.open))
        if self.inst is not None:
            self.inst.constrain(allowed, forced.squeeze(1), self.elapsed)
        return (probs * allowed).log()

    def _steer(self, probs: Tensor) -> Tensor:
        """The controls' biases and masks on the note-ons' probabilities, and density's on the time shifts'
        (`probs`, unnormalized, is this step's own tensor: changed in place). A bias of b nats multiplies a
        probability by e**b.

        Key, chord and range move mass among the note-ons (the block is scaled back to its mass after them),
        so a key does not thin the music out and density alone sets how many notes; the polyphony cap and the
        density bias then change the note-ons' share of the whole."""
        block = probs[:, self.on0 : self.on0 + 128]  # (B, 128), a view: the rules below write through it
        # Each rule runs only when some row has it: the common single control costs its own ops alone.
        if self.any_pitch or self.any_chords:
            bias = self.pitch_bias
            if self.any_chords:
                pos = self.elapsed % self.chord_period  # (B,)
                chord = (pos[:, None] >= self.chord_ends).sum(dim=1).clamp(max=self.chord_ends.size(1) - 1)
                rows = torch.arange(block.size(0), device=block.device)
                bias = bias + self.chord_bias[rows, chord]  # (B, 128)
            reweigh(block, bias.exp())
        if self.any_density:
            # Fewer notes: note-ons lose to everything else. More notes: waiting (the time shifts) loses to
            # note events, note-offs as much as note-ons (a bias on note-ons alone struck new notes instead of
            # closing old ones: they piled up), and not while a chord is being struck (that stacked 20-note
            # clusters onto a sparse motif). The gap itself is chosen at the shift, where a note-on bias
            # cannot reach (after a shift, with nothing to close, a note-on is all the model considers): the
            # shifts are tilted toward longer ones when notes come too fast, shorter when too slow.
            bias = self.density.bias[:, None]  # (B, 1)
            block *= bias.clamp(max=0.0).exp()
            struck = self.onset == self.elapsed[:, None]  # (B, 128) notes struck at this instant
            wait = bias.clamp(min=0.0) * (struck.sum(dim=1, keepdim=True) < DENSITY_CHORD)  # (B, 1): nats
            tilt = bias * self._constants().shift_tilt  # (B, max_shift): nats
            probs[:, self.shift0 : self.shift0 + self.max_shift] *= (tilt - wait).exp()
        if self.any_cap:
            # A note struck and released on this step still sounds for one step (the codec decodes it so).
            sounding = self.open | (struck if self.any_density else self.onset == self.elapsed[:, None])
            full = (sounding.sum(dim=1, keepdim=True) >= self.max_poly[:, None]) & ~sounding  # new notes wait
            block.masked_fill_(full, 0.0)
        return probs

    def _vary(self, probs: Tensor) -> Tensor:
        """Move the note-on mass of each pitch that has MAX_REPEATS of the row's last REPEAT_WINDOW note-ons
        to the other note-ons, in the proportions the model (and the controls) gave them (`probs` is this
        step's own tensor). A row where no other pitch may sound (the controls masked them all) keeps its
        note-ons: the rule never forces a rest."""
        counts = (self.recent_pitches.unsqueeze(2) == self._constants().pitch).sum(dim=1)  # (B, 128)
        worn = counts >= MAX_REPEATS  # (B, 128); no early return: `any` would cost a device sync per step
        if self.inst is not None:
            worn &= (self.inst.current != DRUMS)[:, None]  # a drum pattern repeats its pitches
        block = probs.narrow(1, self.on0, 128)
        varied = block.masked_fill(worn, 0.0)
        left = varied.sum(dim=1, keepdim=True)  # (B, 1)
        moved = varied * (block.sum(dim=1, keepdim=True) / left.clamp_min(_TINY))
        block.copy_(torch.where(left > 0, moved, block))
        return probs

    def _repair_orphans(self, logits: Tensor) -> Tensor:
        """The probabilities of `logits` (B, V), with the probability of each orphan note-off moved to the
        note-off of the nearest sounding pitch (a tie: the lower one).

        A note-off for a pitch that is not sounding means "a note ends now" from a model that lost track of
        which one; masking it alone would spread that mass over every other token (mostly more note-ons and
        time), so notes the model meant to end ring on and pile up. On real piano/pop this took mean
        polyphony from 8.5 to 3.8 (the pieces: 3.6). Only the sounding pitches' note-offs mean anything
        after this (a sounding pitch is its own nearest: it keeps its mass); `constrain` masks the others."""
        probs = (logits if logits.dtype == torch.float32 else logits.float()).softmax(dim=-1)  # (B, V)
        # nearest sounding pitch at or below / at or above each pitch (far off where there is none)
        k = self._constants()
        below = torch.where(self.open, k.pitch, k.far_below).cummax(dim=1).values
        above = torch.where(self.open, k.pitch, k.far_above).flip(1).cummin(dim=1).values.flip(1)
        nearest = torch.where(below + above >= k.twice_pitch, below, above).clamp(0, 127)  # (B, 128)
        off = probs.narrow(1, self.off0, 128)
        off.copy_(torch.zeros_like(off).scatter_add_(1, nearest, off))
        return probs

    def select(self, rows: Tensor) -> None:
        """Keep only `rows` (dropped rows are done)."""
        for name in _GRAMMAR_ROWS:
            setattr(self, name, getattr(self, name)[rows])
        self.density.select(rows)
        if self.inst is not None:
            self.inst.select(rows)
        self._flags()

    def extend(self, other: Grammar) -> None:
        """Append the rows of `other` (jobs joining a running batch)."""
        # Chord schedules are padded to the longest progression in the batch (the padding is never reached).
        C = max(self.chord_ends.size(1), other.chord_ends.size(1))
        for g in (self, other):
            pad = C - g.chord_ends.size(1)
            if pad:
                g.chord_ends = torch.nn.functional.pad(g.chord_ends, (0, pad), value=_FOREVER)
                g.chord_bias = torch.nn.functional.pad(g.chord_bias, (0, 0, 0, pad))
        for name in _GRAMMAR_ROWS:
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        self.density.extend(other.density)
        if self.inst is not None:
            self.inst.extend(other.inst)
        self._flags()

    def advance(self, tokens: Tensor) -> Tensor:
        """Record the sampled tokens (B,); returns them with shifts that cross the row's time limit or a
        note's max_hold cut short to land on it."""
        deadline = first_due(self.open, self.onset, self.max_hold.unsqueeze(1))  # (B,)
        if self.inst is not None:  # the other instruments' notes too
            deadline = torch.minimum(deadline, self.inst.deadline())
        remaining = torch.minimum(self.limit, deadline) - self.elapsed
        steps = self.steps_per_token[tokens]
        cut = (steps > remaining) & (remaining > 0)
        tokens = torch.where(cut, remaining.clamp(1, self.max_shift) + (self.shift0 - 1), tokens)
        dt = torch.where(cut, remaining, steps)
        # what each token is, looked up: (B, 1) each; pitch 0 for a token that is no note event
        k = self._constants()
        kind, pitch = k.kind[tokens], k.pitch_of[tokens]
        is_on = kind == 1  # (B, 1)
        if self.any_density:  # the loop measures the continuation: time before the cut is not its own
            music = (self.elapsed + dt).clamp(min=0) - self.elapsed.clamp(min=0)
            self.density.update(is_on.squeeze(1), music * self.step_s)
        self.elapsed += dt
        # a note-on opens its pitch, a note-off closes it, any other token writes back what was there
        now = torch.where(kind > 0, is_on, self.open.gather(1, pitch))
        self.open.scatter_(1, pitch, now)
        # a note-on (a re-strike too) starts the note's clock
        onset = torch.where(is_on, self.elapsed.unsqueeze(1), self.onset.gather(1, pitch))
        self.onset.scatter_(1, pitch, onset)
        shifted = torch.cat([self.recent_pitches.narrow(1, 1, self.recent_pitches.size(1) - 1), pitch], dim=1)
        pitched = is_on if self.inst is None else is_on & (self.inst.current != DRUMS).unsqueeze(1)  # (B, 1)
        self.recent_pitches = torch.where(pitched, shifted, self.recent_pitches)
        if self.inst is not None:
            self.inst.struck(is_on, self.elapsed)
            self.open, self.onset = self.inst.switch(tokens, self.open, self.onset, self.max_hold)
        return tokens

    def _constants(self) -> _Constants:
        """The tensors a step reads that depend on the codec alone, made at the first step."""
        k = self.__dict__.get("_k")
        if k is None:
            k = self._k = _Constants(self)
        return k


class _Constants:
    """What `Grammar.constrain` and `advance` read every step that depends on the codec alone, made once (a
    tensor made per step is an operation per step)."""

    def __init__(self, grammar: Grammar):
        device = grammar.steps_per_token.device
        self.pitch = torch.arange(128, device=device)
        self.twice_pitch = 2 * self.pitch
        self.far_below = torch.full((128,), -_FAR, device=device)
        self.far_above = torch.full((128,), _FAR, device=device)
        self.shift_tilt = -DENSITY_SHIFT_TILT * grammar.shift_seconds  # (max_shift,) nats per nat of bias
        # (V, 1) per token: its kind (1 note-on, 2 note-off, 0 any other) and its pitch (0 for the others),
        # so that tokens (B,) look up (B, 1) columns
        ids = torch.arange(len(grammar.steps_per_token), device=device)
        on, off = grammar.codec.is_note_on(ids), grammar.codec.is_note_off(ids)
        self.kind = torch.where(on, 1, torch.where(off, 2, 0)).unsqueeze(1)
        pitch = torch.where(on, ids - grammar.on0, torch.where(off, ids - grammar.off0, 0))
        self.pitch_of = pitch.unsqueeze(1)


_GRAMMAR_ROWS = (
    "open",
    "onset",
    "elapsed",
    "limit",
    "max_hold",
    "controlled",
    "pitch_bias",
    "chord_ends",
    "chord_bias",
    "chord_period",
    "max_poly",
    "recent_pitches",
)


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


def recent_pitches(codec, tokens, n: int) -> np.ndarray:
    """(n,) int64: the pitches of the last n note-ons of `tokens`, oldest first, -1 before the first."""
    tokens = np.asarray(tokens, dtype=np.int64)
    pitches = tokens[codec.is_note_on(tokens)][-n:] - codec.note_on_offset if n else np.zeros(0, np.int64)
    return np.concatenate([np.full(n - len(pitches), -1, np.int64), pitches])


def max_hold_seconds(primer) -> float:
    """How long the grammar lets a note sound before it closes it for the model: the motif's longest note with
    some room (HOLD_FACTOR), within [MIN_HOLD_SECONDS, MAX_HOLD_SECONDS]; the bounds come from the corpus."""
    longest = max((n.end - n.start for n in primer.motif_notes), default=0.0)
    return float(min(MAX_HOLD_SECONDS, max(MIN_HOLD_SECONDS, HOLD_FACTOR * longest)))


class _Instruments:
    """A codec with instruments: each row's current instrument and the note state of every instrument (a bank
    of `Grammar.open`/`onset`, the current instrument's row of it in use there), and the rules on
    INSTRUMENT tokens. The current instrument's row of the bank is written when a row switches away from it
    (`store`), with what the rules read of it every step: whether it sounds a note and when its first note
    reaches max_hold, so a step reads (B, I) tensors, not the (B, I, 128) bank, and a step without a switch
    (most of them) writes none; the rules never read the current instrument's row (its notes are
    `Grammar.open`/`onset`)."""

    def __init__(self, codec, prompts: Sequence[np.ndarray], device, permitted: Sequence[np.ndarray | None]):
        self.first, self.count = int(codec.instrument_offset), int(codec.num_instruments)
        self.on0 = int(codec.note_on_offset)
        B = len(prompts)
        current = np.zeros(B, np.int64)
        bank = np.full((B, self.count, 128), _SILENT, np.int64)
        may = np.ones((B, self.count), bool)
        ranges = np.ones((B, self.count, 128), bool)
        for r, p in enumerate(prompts):
            current[r], bank[r] = instrument_onsets(codec, p)
            may[r] = motif_instruments(codec, p) if permitted[r] is None else permitted[r]
            ranges[r] = playable(instrument_pitches(codec, p))
        # (B, I) bool: the instruments a row may strike notes of (the instruments control; the motif's by
        # default, so a band goes on as itself). Another instrument's sounding notes may still be closed.
        self.permitted = torch.as_tensor(may, device=device)
        self.current = torch.as_tensor(current, device=device)  # (B,) long
        self.onset = torch.as_tensor(bank, device=device)  # (B, I, 128) long: steps from the cut, or _SILENT
        self.switched = torch.zeros(B, dtype=torch.bool, device=device)  # the last token was an INSTRUMENT
        # (B, I, 128) bool: the pitches each instrument may strike (`instruments.playable`: an orchestral
        # instrument's range, widened to what the prompt gives it); `in_range` the current one's (B, 128)
        self.ranges = torch.as_tensor(ranges, device=device)
        self.in_range = self._row(self.ranges)
        # (V,) bool: what may follow an INSTRUMENT token: a note event (of a sounding pitch, for a note-off:
        # the grammar's own mask) or SET_VELOCITY
        self.after_switch = torch.zeros(codec.vocab_size, dtype=torch.bool, device=device)
        self.after_switch[self.on0 : self.on0 + 128] = True
        self.after_switch[codec.note_off_offset : codec.note_off_offset + 128] = True
        self.after_switch[codec.velocity_offset : codec.velocity_offset + codec.config.velocity_bins] = True
        step_s = float(codec.config.step_ms) / 1000.0
        kept = [strike_gaps(codec, p, step_s) for p in prompts]
        last = np.stack([k[0] for k in kept]) if B else np.zeros((0, self.count), np.int64)
        gap = np.stack([k[1] for k in kept]) if B else np.zeros((0, self.count), np.int64)
        # (B, I) long: each instrument's last strike (steps, the prompt's end 0) and the silence it may keep
        # before it is drawn back (_FOREVER: never); the rows' clocks are set in `start`
        self.last_on = torch.as_tensor(last, device=device)
        self.keep_gap = torch.as_tensor(np.where(may, gap, _FOREVER), device=device)
        self.keep_per_step = KEEP_SLOPE * step_s
        self._flags()

    def _flags(self) -> None:
        # a Python flag, refreshed as rows join and leave: a batch whose permitted instruments all strike
        # anything (a band of synths, guitars, bass and drums) skips the range rule's operations every step
        # (another instrument's note-ons are masked whatever their range)
        self.any_range = bool((self.permitted & ~self.ranges.all(dim=2)).any())

    def start(self, tail: np.ndarray, max_hold: Tensor) -> Tensor:
        """Move the bank's onsets to the rows' clocks (from the cut); the current instrument's (B, 128)."""
        tail_t = torch.as_tensor(tail, device=self.onset.device)[:, None, None]
        self.onset = torch.where(self.onset > _SILENT, self.onset - tail_t, _SILENT)
        self.last_on = self.last_on - tail_t[:, :, 0]
        open_ = self.onset > _SILENT
        self.sounding = open_.any(dim=2)  # (B, I) bool: the instrument sounds a note
        self.due = first_due(open_, self.onset, max_hold[:, None, None])  # (B, I) long, per instrument
        return self._row(self.onset)

    def _row(self, bank: Tensor) -> Tensor:
        return bank[torch.arange(bank.size(0), device=bank.device), self.current]

    def store(self, open_: Tensor, onset: Tensor, max_hold: Tensor) -> None:
        """The current instrument's notes (`Grammar.open`/`onset`, (B, 128)) into its row of the bank."""
        rows = torch.arange(onset.size(0), device=onset.device)
        self.onset[rows, self.current] = torch.where(open_, onset, _SILENT)
        self.sounding[rows, self.current] = open_.any(dim=1)
        self.due[rows, self.current] = first_due(open_, onset, max_hold[:, None])

    def deadline(self) -> Tensor:
        """(B,) the earliest step at which a sounding note of an instrument other than the current one reaches
        max_hold."""
        return self.due.scatter(1, self.current[:, None], _FOREVER).amin(dim=1)

    def constrain(self, allowed: Tensor, forced: Tensor, elapsed: Tensor) -> None:
        """INSTRUMENT tokens: never the current one; after one, a note event or SET_VELOCITY; forced (the
        instruments that hold a note past max_hold) when the current instrument has none overdue."""
        # views written through, and scatters by each row's current instrument: a step's fewest calls
        block = slice(self.first, self.first + self.count)
        current = self.current.unsqueeze(1)  # (B, 1)
        # an instrument not permitted is switched to only to close its notes, and strikes none
        allowed.narrow(1, self.first, self.count).bitwise_and_(self.permitted | self.sounding)
        allowed.narrow(1, self.on0, 128).bitwise_and_(self.permitted.gather(1, current))
        allowed.scatter_(1, current + self.first, False)
        if bool(self.switched.any()):
            allowed[self.switched] &= self.after_switch
        late = elapsed.unsqueeze(1) >= self.due  # (B, I): an instrument with a note past max_hold
        late.scatter_(1, current, False)
        other = late.any(dim=1) & ~forced & ~self.switched
        if bool(other.any()):
            allowed[other] = False
            allowed[other, block] = late[other]

    def draw_back(self, probs: Tensor, elapsed: Tensor) -> None:
        """Each instrument silent past its gap (`keep_gap`; one holding a note is not silent) made likelier to
        be switched to (`probs`, (B, V), written in place)."""
        silence = (elapsed.unsqueeze(1) - self.last_on - self.keep_gap).clamp(min=0)  # (B, I) steps
        silence.masked_fill_(self.sounding, 0)
        nats = (silence * self.keep_per_step).clamp(max=KEEP_MAX_NATS)
        probs.narrow(1, self.first, self.count).mul_(nats.exp())

    def struck(self, is_on: Tensor, elapsed: Tensor) -> None:
        """After a token: rows that struck a note (`is_on`, (B, 1)) mark their current instrument's strike."""
        current = self.current.unsqueeze(1)
        self.last_on.scatter_(
            1, current, torch.where(is_on, elapsed.unsqueeze(1), self.last_on.gather(1, current))
        )

    def keep_in_range(self, block: Tensor) -> None:
        """The current instrument's note-on mass (`block`, (B, 128), written in place) moved to the pitches
        in its range (`ranges`), in the proportions it had there, as the range control moves it: the range
        chooses which pitches, not how many notes. A row with none of its mass in range strikes nothing."""
        reweigh(block, self.in_range)

    def switch(self, tokens: Tensor, open_: Tensor, onset: Tensor, max_hold: Tensor) -> tuple[Tensor, Tensor]:
        """After `tokens`: rows that drew an INSTRUMENT take it up (its notes become `open`/`onset`, those of
        the one it leaves go into the bank)."""
        is_inst = (tokens >= self.first) & (tokens < self.first + self.count)
        self.switched = is_inst
        if not bool(is_inst.any()):
            return open_, onset
        self.store(open_, onset, max_hold)
        self.current = torch.where(is_inst, tokens - self.first, self.current)
        self.in_range = self._row(self.ranges)
        row = self._row(self.onset)
        # rows that did not switch keep theirs (a closed note keeps its onset there, `open` says it is closed)
        return torch.where(is_inst[:, None], row > _SILENT, open_), torch.where(is_inst[:, None], row, onset)

    ROWS = (
        "permitted", "current", "onset", "switched", "sounding", "due", "ranges", "in_range",
        "last_on", "keep_gap",
    )  # fmt: skip

    def select(self, rows: Tensor) -> None:
        for name in self.ROWS:
            setattr(self, name, getattr(self, name)[rows])
        self._flags()

    def extend(self, other: _Instruments) -> None:
        for name in self.ROWS:
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        self._flags()


def motif_instruments(codec, tokens) -> np.ndarray:
    """(I,) bool: the instruments that play a note event in `tokens` (notes before any INSTRUMENT token are
    the piano's); every instrument where none plays (nothing to go on)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    first = int(codec.instrument_offset)
    inst = current_instrument(tokens, codec.is_instrument(tokens), first)
    events = codec.is_note_on(tokens) | codec.is_note_off(tokens)
    plays = np.zeros(int(codec.num_instruments), bool)
    plays[inst[events]] = True
    return plays if plays.any() else ~plays


def instrument_pitches(codec, tokens) -> dict[int, np.ndarray]:
    """{instrument: the pitches of its note-ons in `tokens`} (notes before any INSTRUMENT token are the
    piano's)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    inst = current_instrument(tokens, codec.is_instrument(tokens), int(codec.instrument_offset))
    on = codec.is_note_on(tokens)
    pitches = tokens[on] - codec.note_on_offset
    return {int(i): pitches[inst[on] == i] for i in np.unique(inst[on])}


def strike_gaps(codec, tokens, step_s: float) -> tuple[np.ndarray, np.ndarray]:
    """((I,) int64 each) every instrument's last strike in `tokens`, in steps before their end (0 where it
    strikes none), and the silence it may keep after it (steps; _FOREVER for an instrument that struck nothing
    in the last KEEP_SECONDS): KEEP_GAP_FACTOR x its longest gap between strikes in the last
    KEEP_WINDOW_SECONDS, at least MIN_KEEP_GAP_SECONDS."""
    tokens = np.asarray(tokens, dtype=np.int64)
    count = int(codec.num_instruments)
    inst = current_instrument(tokens, codec.is_instrument(tokens), int(codec.instrument_offset))
    clock = np.cumsum(shift_steps(codec)[tokens])
    end = int(clock[-1]) if len(tokens) else 0
    on = codec.is_note_on(tokens)
    last = np.zeros(count, np.int64)
    gap = np.full(count, _FOREVER, np.int64)
    window, recent = round(KEEP_WINDOW_SECONDS / step_s), round(KEEP_SECONDS / step_s)
    for i in np.unique(inst[on]):
        times = np.unique(clock[on & (inst == i)]) - end  # <= 0
        last[i] = times[-1]
        if times[-1] >= -recent:
            near = times[times >= -window]
            longest = int(np.diff(near).max()) if len(near) > 1 else 0
            gap[i] = max(round(MIN_KEEP_GAP_SECONDS / step_s), round(KEEP_GAP_FACTOR * longest))
    return last, gap


def instrument_onsets(codec, tokens) -> tuple[int, np.ndarray]:
    """(the instrument in effect after `tokens`, (I, 128) int64: when each instrument's sounding notes began,
    in steps before the tokens' end (<= 0), a large negative number where none sounds)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    first, count = int(codec.instrument_offset), int(codec.num_instruments)
    inst = current_instrument(tokens, codec.is_instrument(tokens), first)
    clock = np.cumsum(shift_steps(codec)[tokens])
    end = int(clock[-1]) if len(tokens) else 0
    on, off = codec.is_note_on(tokens), codec.is_note_off(tokens)
    voice = np.where(on, tokens - codec.note_on_offset, tokens - codec.note_off_offset) + inst * 128
    index = np.arange(len(tokens))
    last_on = np.full(count * 128, -1)
    last_off = np.full(count * 128, -1)
    np.maximum.at(last_on, voice[on], index[on])
    np.maximum.at(last_off, voice[off], index[off])
    onsets = np.full(count * 128, _SILENT, dtype=np.int64)
    sounding = last_on > last_off
    onsets[sounding] = clock[last_on[sounding]] - end
    current = int(inst[-1]) if len(tokens) else 0
    return current, onsets.reshape(count, 128)
