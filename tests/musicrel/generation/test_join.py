"""generation.join: a primer that ends inside a silence. The decoder reads the primer up to its last event (no
trailing partial shift), covers the silence before the cut with the gap the model would give it, and the
output's clock starts at the cut: nothing lands before it, with silences under 1 s, over 1 s and none at
all."""

from __future__ import annotations

import numpy as np
import pretty_midi
import pytest
import torch

from musicrel.generation.decode_batch import DecodeBatch, generate_batch
from musicrel.generation.grammar import Grammar
from musicrel.generation.join import Join, join_mask
from musicrel.generation.primer import primer_at_cut, render_result
from musicrel.generation.sampling import SamplingParams
from musicrel.generation.streaming import NoteStream
from musicrel.midi.codec import open_pitches, shift_steps
from musicrel.model.transformer import MusicTransformer
from tests.musicrel.conftest import CODEC, STEP, check_grammar, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

ON, OFF, SHIFT = CODEC.note_on_offset, CODEC.note_off_offset, CODEC.time_shift_offset
M = CODEC.config.max_shift_steps  # 100: the longest shift, 1 s
STEPS = torch.as_tensor(shift_steps(CODEC))


def _allowed(mask_row: torch.Tensor) -> list[int]:
    return mask_row.nonzero().flatten().tolist()


def test_the_mask_lets_only_shifts_that_keep_the_first_gap_long_enough():
    mask = join_mask(STEPS, torch.tensor([-250, -170, -70, -1, 0, 30]), M)
    assert _allowed(mask[0]) == [SHIFT + M - 1]  # 2.5 s to go: a shorter shift would end the gap too soon
    assert _allowed(mask[1]) == [SHIFT + M - 1]  # 1.7 s: likewise
    assert _allowed(mask[2]) == list(range(SHIFT + 69, SHIFT + M))  # 0.7 s: shifts of 0.7 s to 1 s
    assert _allowed(mask[3]) == list(range(SHIFT, SHIFT + M))  # one step to go: any shift
    assert mask[4:].all()  # at the cut and after it: everything (the grammar's own rules aside)


def _gap_law(p: torch.Tensor) -> dict[int, float]:
    """Exact law of the first gap (steps) of a model that, after an event or a whole shift, draws from `p`
    (V,), and after a partial shift always an event: the codec's chain (whole shifts, then the rest)."""
    law, whole, p_event = {}, 1.0, float(p[STEPS == 0].sum())
    for a in range(8):
        for k in range(1, M):
            law[a * M + k] = whole * float(p[SHIFT + k - 1])
        law[a * M] = law.get(a * M, 0.0) + whole * p_event
        whole *= float(p[SHIFT + M - 1])
    return law


def _joined_law(logits: torch.Tensor, tail: int) -> dict[int, float]:
    """The same model decoded through `Join` from `tail` steps before the cut, enumerated exactly."""
    law, whole, elapsed = {}, 1.0, -tail
    for a in range(8):
        join = Join(CODEC, [0])
        join.elapsed = torch.tensor([elapsed])
        q = join.constrain(logits[None].clone())[0].softmax(-1)
        for k in range(1, M):
            law[a * M + k] = whole * float(q[SHIFT + k - 1])
        law[a * M] = law.get(a * M, 0.0) + whole * float(q[STEPS == 0].sum())
        whole *= float(q[SHIFT + M - 1])
        elapsed += M
    return law


@pytest.mark.parametrize("tail", [0, 1, 70, 100, 170, 250])
def test_the_gap_is_the_models_own_given_that_nothing_came_before_the_cut(tail):
    """P(gap = g | gap >= tail) exactly: masking token by token keeps the model's proportions among the gaps
    it allows, whole shifts (gaps over 1 s) included."""
    torch.manual_seed(tail)
    logits = torch.randn(CODEC.vocab_size) * 2
    logits[SHIFT + M - 1] += 2.0  # long gaps are likely enough to matter
    model, joined = _gap_law(logits.softmax(-1)), _joined_law(logits, tail)
    beyond = sum(v for g, v in model.items() if g >= tail)
    for g in sorted(model):
        want = model[g] / beyond if g >= tail else 0.0
        assert joined[g] == pytest.approx(want, rel=1e-4, abs=1e-9), g


def test_a_note_the_motif_holds_past_the_cut_is_closed_for_its_length_at_the_cut_not_before():
    # 60 struck 1 s before the primer's last event; a hold of 0.5 s is over long before the cut, 1.5 s later.
    grammar = Grammar(CODEC, [np.array([ON + 60, SHIFT + M - 1, ON + 64])], [10**6], [50], tails=[150])
    logits = grammar.constrain(torch.zeros(1, CODEC.vocab_size))
    assert _allowed(torch.isfinite(logits[0])) == [SHIFT + M - 1]  # no forced note-off before the cut
    grammar.advance(torch.tensor([SHIFT + M - 1]))
    assert grammar.elapsed.item() == -50 and not grammar.overdue().any()
    # a 1 s shift would carry the note past the cut: it lands on the cut, where the note is closed
    assert grammar.advance(torch.tensor([SHIFT + M - 1])).item() == SHIFT + 49
    assert grammar.elapsed.item() == 0 and grammar.overdue()[0].nonzero().flatten().tolist() == [60, 64]


def test_no_tail_changes_nothing():
    prompts = [np.array([ON + 60, SHIFT + 9, OFF + 60]), np.array([ON + 62, SHIFT + 4])]
    plain, joined = (
        Grammar(CODEC, prompts, [500, 500], [300, 300]),
        Grammar(CODEC, prompts, [500, 500], [300, 300], tails=[0, 0]),
    )
    torch.manual_seed(0)
    for _ in range(30):
        logits = torch.randn(2, CODEC.vocab_size)
        a, b = plain.constrain(logits.clone()), joined.constrain(logits.clone())
        torch.testing.assert_close(a, b)
        token = torch.distributions.Categorical(logits=a).sample()
        assert torch.equal(plain.advance(token.clone()), joined.advance(token.clone()))
    assert torch.equal(plain.elapsed, joined.elapsed)


class _Eager(MusicTransformer):
    """A model that wants to strike a note after every time shift (a primer ending on a partial shift made
    the shipped model do that at the cut): the join must still hold it until the cut."""

    @staticmethod
    def _strike(tokens, logits):
        logits = logits.clone()
        after_shift = CODEC.is_time_shift(tokens).float()[..., None]  # (B, T, 1) or (B, 1)
        logits[..., ON + 48 : ON + 84] += 12.0 * after_shift
        return logits

    def forward(self, tokens, *args, **kwargs):  # the prefill
        return self._strike(tokens, super().forward(tokens, *args, **kwargs))

    def decoder(self):  # the steps after it
        decode = super().decoder()
        return lambda tokens, cache: self._strike(tokens, decode(tokens, cache))


def _eager() -> MusicTransformer:
    model = tiny_model()
    eager = _Eager(model.cfg).eval()
    eager.load_state_dict(model.state_dict())
    return eager


def _motif(last_event: float) -> list:
    """Notes whose last event (a note-off) is at `last_event` seconds."""
    return [
        pretty_midi.Note(80, 60 + k % 5, 0.25 * k, 0.25 * k + 0.2) for k in range(int(last_event / 0.25))
    ] + [pretty_midi.Note(80, 67, last_event - 0.2, last_event)]


@pytest.mark.parametrize(("silence", "cut"), [(0.7, 3.0), (1.75, 3.0), (2.3, 3.3), (0.0, 3.0)])
def test_the_first_note_never_lands_before_the_cut(silence, cut):
    notes = _motif(cut - silence)
    primer = primer_at_cut(CODEC, notes, cut)
    tail = round(silence / STEP)
    assert primer.tail_steps == tail
    assert not CODEC.is_time_shift(primer.tokens[-1])  # the decoder reads no trailing (partial) shift
    params = SamplingParams(seconds=3.0, seed=5, num_samples=4)
    result = generate_batch(_eager(), CODEC, [(primer, params)])[0]
    assert result.seconds == pytest.approx(3.0)  # counted from the cut
    for tokens, midi in zip(result.tokens, render_result(CODEC, primer, result), strict=True):
        steps = shift_steps(CODEC)[tokens]
        first_event = int(np.flatnonzero(steps == 0)[0])
        assert steps[:first_event].sum() >= tail  # nothing before the cut
        if tail >= M:  # a chain: whole shifts while a whole shift or more is left, as the codec writes gaps
            assert (tokens[: tail // M] == SHIFT + M - 1).all()
        check_grammar(tokens, open_pitches(CODEC, primer.tokens))
        first_on = int(np.flatnonzero(CODEC.is_note_on(tokens))[0])
        onsets = [n.start for n in midi.instruments[0].notes]
        # the clock starts at the cut: the first note lands gap - tail after it
        assert min(onsets) == pytest.approx((steps[:first_on].sum() - tail) * STEP)
        assert min(onsets) < 1.0  # the eager model strikes once the shift that crosses the cut is drawn
        stream = NoteStream(CODEC, primer.tokens, primer.tail_steps)
        heard = [e.time for e in stream.feed(tokens) + stream.close() if e.kind == "on"]
        assert heard[0] == pytest.approx(min(onsets))


def test_rows_with_and_without_a_tail_share_a_batch():
    """Each row keeps its own clock in a running batch: a job whose primer ends in a silence joins one that
    does not, and each is the same as alone."""
    notes = _motif(2.0)
    jobs = [
        (primer_at_cut(CODEC, notes, 2.0), SamplingParams(seconds=2.0, seed=1, num_samples=2)),
        (primer_at_cut(CODEC, notes, 3.2), SamplingParams(seconds=2.0, seed=2, num_samples=2)),
    ]
    assert [p.tail_steps for p, _ in jobs] == [0, 120]
    model = tiny_model()
    alone = [generate_batch(model, CODEC, [job])[0].tokens for job in jobs]
    batch = DecodeBatch(model, CODEC, max_rows=4)
    batch.admit(jobs[:1])
    batch.step()
    batch.admit(jobs[1:])
    results = {}
    while batch.rows:
        results.update(batch.step())
    for j, tokens in enumerate(alone):
        for a, b in zip(tokens, results[j].tokens, strict=True):
            np.testing.assert_array_equal(a, b)
