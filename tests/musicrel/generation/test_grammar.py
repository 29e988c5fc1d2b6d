"""The grammar on constructed token streams (re-strike, orphan note-off, notes open at the cut, max hold,
pedal) and on generated ones."""

from __future__ import annotations

import numpy as np
import pretty_midi
import pytest
import torch

from musicrel.evaluation.metrics import one_pitch
from musicrel.generation.decode import sample
from musicrel.generation.decode_batch import generate_batch
from musicrel.generation.grammar import (
    HOLD_FACTOR,
    MAX_HOLD_SECONDS,
    MAX_REPEATS,
    MIN_HOLD_SECONDS,
    REPEAT_WINDOW,
    Grammar,
    max_hold_seconds,
    recent_pitches,
)
from musicrel.generation.primer import Primer, prepare_primer, primer_at_cut, render_result
from musicrel.generation.sampling import SamplingParams
from musicrel.midi.codec import CodecConfig, EventCodec, open_pitches, shift_steps
from tests.musicrel.conftest import (
    CODEC,
    STEP,
    check_grammar,
    make_motif,
)

pytestmark = pytest.mark.usefixtures("one_thread")

# ---------------------------------------------------------------------------------------------------------
# The grammar on constructed streams

ON, OFF, SHIFT = CODEC.note_on_offset, CODEC.note_off_offset, CODEC.time_shift_offset


def _peaked(*tokens: int, codec=CODEC) -> torch.Tensor:
    """(len(tokens), V) logits putting almost all mass of row r on tokens[r]."""
    logits = torch.zeros(len(tokens), codec.vocab_size)
    for r, t in enumerate(tokens):
        logits[r, t] = 30.0
    return logits


def test_grammar_keeps_a_restrike_legal():
    grammar = Grammar(CODEC, [np.array([ON + 60, SHIFT + 9])], [10**6])
    logits = grammar.constrain(_peaked(ON + 60))
    assert logits.argmax().item() == ON + 60  # the model's re-strike is what it gets
    assert grammar.advance(torch.tensor([ON + 60])).item() == ON + 60
    assert grammar.open[0, 60] and grammar.onset[0, 60] == 0  # the re-strike restarts the note's clock
    decoded = CODEC.decode_notes([ON + 60, SHIFT + 9, ON + 60, SHIFT + 4])
    assert [(n.pitch, n.start, n.end) for n in decoded] == [
        (60, 0.0, 0.1),
        (60, 0.1, pytest.approx(0.2)),
    ]  # the codec closes and restarts it


def test_grammar_repairs_an_orphan_note_off_to_the_nearest_sounding_pitch():
    prompt = np.array([ON + 60, ON + 72, SHIFT + 9])
    grammar = Grammar(CODEC, [prompt] * 3, [10**6] * 3)
    logits = grammar.constrain(_peaked(OFF + 61, OFF + 70, OFF + 66))  # 66: as near to 60 as to 72
    probs = logits.softmax(-1)
    assert probs[0, OFF + 60] > 0.99 and probs[1, OFF + 72] > 0.99 and probs[2, OFF + 60] > 0.99
    assert torch.isinf(logits[:, OFF + 61]).all() and torch.isinf(logits[:, OFF + 66]).all()
    # nothing sounding: an orphan note-off is masked and the rest keeps its proportions
    silent = Grammar(CODEC, [np.array([SHIFT + 9])], [10**6])
    raw = torch.randn(1, CODEC.vocab_size)
    out = silent.constrain(raw.clone())
    assert torch.isinf(out[0, OFF : OFF + 128]).all()
    keep = torch.isfinite(out[0])
    torch.testing.assert_close(out[0, keep].softmax(-1), raw[0, keep].softmax(-1))


def test_grammar_knows_the_notes_open_at_the_primers_cut():
    notes = [pretty_midi.Note(80, 60, 0.0, 5.0), pretty_midi.Note(80, 64, 0.5, 1.0)]
    primer = primer_at_cut(CODEC, notes, cut=2.0)
    assert primer.tail_steps == 100  # the primer ends on 64's note-off, 1 s before the cut
    grammar = Grammar(CODEC, [primer.tokens], [10**6], [300], tails=[primer.tail_steps])
    assert grammar.open[0].nonzero().flatten().tolist() == [60]
    assert grammar.onset[0, 60].item() == -200  # struck 2 s before the cut
    assert grammar.elapsed.item() == -100  # the clock counts from the cut
    # Before the cut the note is known to sound: only the 1 s shift that reaches the cut may come.
    logits = grammar.constrain(_peaked(OFF + 60))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [SHIFT + 99]
    grammar.advance(torch.tensor([SHIFT + 99]))
    logits = grammar.constrain(_peaked(OFF + 60))
    assert logits.argmax().item() == OFF + 60  # at the cut its note-off is legal, not an orphan


def test_grammar_closes_a_note_held_past_max_hold():
    grammar = Grammar(CODEC, [np.array([ON + 60, ON + 64])], [10**6], [150])
    grammar.advance(torch.tensor([OFF + 64]))
    # a 1 s shift would carry note 60 past its 1.5 s hold: it is cut to land on it
    assert grammar.advance(torch.tensor([SHIFT + 99])).item() == SHIFT + 99
    assert grammar.advance(torch.tensor([SHIFT + 99])).item() == SHIFT + 49
    assert grammar.elapsed.item() == 150 and grammar.overdue()[0].nonzero().flatten().tolist() == [60]
    logits = grammar.constrain(_peaked(SHIFT + 20))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [OFF + 60]  # forced note-off
    grammar.advance(torch.tensor([OFF + 60]))
    assert not grammar.open.any() and torch.isfinite(grammar.constrain(_peaked(SHIFT + 20))[0, SHIFT + 20])


def test_grammar_leaves_pedal_events_to_the_model():
    codec = EventCodec(CodecConfig(pedal="events"))
    grammar = Grammar(codec, [np.array([codec.note_on_offset + 60])], [10**6])
    for token in (codec.pedal_on_id, codec.pedal_off_id):
        assert grammar.constrain(_peaked(token, codec=codec)).argmax().item() == token
    assert torch.isinf(grammar.constrain(_peaked(codec.eos_id, codec=codec))[0, codec.eos_id])


def _strikes(pitches, shift: int = 9) -> np.ndarray:
    """A stream striking `pitches` one after another, each closed before the next."""
    return np.array([t for p in pitches for t in (ON + p, SHIFT + shift, OFF + p)])


def test_recent_pitches_counts_the_primers_last_note_ons():
    assert recent_pitches(CODEC, _strikes([60, 62, 64]), 4).tolist() == [-1, 60, 62, 64]
    assert recent_pitches(CODEC, _strikes([60, 62, 64]), 2).tolist() == [62, 64]
    assert recent_pitches(CODEC, np.array([SHIFT]), 2).tolist() == [-1, -1]


def test_a_pitch_with_max_repeats_of_the_recent_note_ons_gives_its_mass_to_the_other_pitches():
    others = [62, 64, 65, 67, 69, 71, 72, 74]
    worn = _strikes([60] * MAX_REPEATS + others[: REPEAT_WINDOW - MAX_REPEATS])
    fresh = _strikes(others[: REPEAT_WINDOW - MAX_REPEATS + 1] + [60] * (MAX_REPEATS - 1))
    grammar = Grammar(CODEC, [worn, fresh], [10**6] * 2)
    raw = torch.full((2, CODEC.vocab_size), -10.0)
    raw[:, ON + 60], raw[:, ON + 64], raw[:, ON + 67], raw[:, SHIFT + 20] = 8.0, 2.0, 1.0, 6.0
    before = raw.softmax(-1)
    after = grammar.constrain(raw.clone()).softmax(-1)
    # worn: 60 gets nothing; its note-on mass goes to 64 and 67 in the model's proportions (e^2 : e^1);
    # waiting keeps its probability, so the rule chooses a pitch, not whether to play
    assert after[0, ON + 60] == 0
    on = slice(ON, ON + 128)
    torch.testing.assert_close(after[0, on].sum(), before[0, on].sum())
    torch.testing.assert_close(after[0, ON + 64] / after[0, ON + 67], torch.tensor(np.e))
    torch.testing.assert_close(after[0, SHIFT + 20], before[0, SHIFT + 20])
    # fresh: 7 of the last 16 note-ons are 60: it may be struck
    torch.testing.assert_close(after[1, on], before[1, on])
    # one more note-on of 60 on the fresh row makes it worn too
    grammar.advance(torch.tensor([SHIFT + 5, ON + 60]))
    assert grammar.constrain(raw.clone())[1, ON + 60] == float("-inf")


def test_the_repeat_rule_never_forces_a_rest():
    """A row whose only allowed note-on is the worn pitch (a range control, here its mask) keeps it."""
    grammar = Grammar(CODEC, [_strikes([60] * REPEAT_WINDOW)], [10**6])
    raw = torch.full((1, CODEC.vocab_size), float("-inf"))
    raw[0, ON + 60], raw[0, SHIFT + 20] = 5.0, 0.0
    out = grammar.constrain(raw.clone())
    assert torch.isfinite(out[0, ON + 60])
    torch.testing.assert_close(out.softmax(-1), raw.softmax(-1))


def test_a_model_stuck_on_one_pitch_does_not_drone_at_low_temperature():
    """The shipped model at temperature 0.5 gave 157 notes all A4: a distribution that favours one pitch
    (as a looping model does, more with every strike) sharpened by the temperature. The grammar keeps any
    pitch to about half of the notes however peaked the model is."""
    grammar = Grammar(CODEC, [np.array([SHIFT + 9])], [500])  # 5 s
    raw = torch.full((1, CODEC.vocab_size), -5.0)
    raw[0, ON + 69], raw[0, ON + 72], raw[0, ON + 64] = 6.0, 1.0, 0.5
    raw[0, OFF : OFF + 128], raw[0, SHIFT + 9] = 5.0, 4.0
    generators = [torch.Generator().manual_seed(0)]
    tokens = []
    while grammar.elapsed.item() < 500:
        settings = torch.tensor([0.5]), torch.tensor([CODEC.vocab_size]), torch.tensor([1.0])
        token = sample(grammar.constrain(raw.clone()), *settings, generators)
        tokens.append(grammar.advance(token).item())
    notes = CODEC.decode_notes(tokens)
    assert len(notes) > 40
    assert one_pitch(notes) == 0.0
    assert {n.pitch for n in notes} == {64, 69, 72}  # the model's own choices, its favourite included


def test_max_hold_follows_the_motif_within_the_corpus_bounds():
    def primer(length: float) -> Primer:
        return Primer(np.array([0]), 0.0, 1.0, 120.0, 0, [], [pretty_midi.Note(80, 60, 0.0, length)])

    assert max_hold_seconds(primer(0.2)) == MIN_HOLD_SECONDS
    assert max_hold_seconds(primer(2.0)) == pytest.approx(HOLD_FACTOR * 2.0)
    assert max_hold_seconds(primer(60.0)) == MAX_HOLD_SECONDS  # a pedal held through the motif


def test_no_note_is_held_longer_than_its_cap_in_a_generated_piece(model):
    primer = prepare_primer(CODEC, make_motif(), 4.0)
    res = generate_batch(model, CODEC, [(primer, SamplingParams(seconds=12.0, seed=3, num_samples=2))])[0]
    cap = max_hold_seconds(primer)
    for midi in render_result(CODEC, primer, res):
        assert max(n.end - n.start for n in midi.instruments[0].notes) <= cap + 1e-6


def test_grammar_of_generated_streams(model):
    primer = prepare_primer(CODEC, make_motif(), 4.0)
    jobs = [(primer, SamplingParams(seconds=3.0, seed=s, num_samples=3, temperature=1.5)) for s in range(2)]
    for res in generate_batch(model, CODEC, jobs):
        for tokens, pm in zip(res.tokens, render_result(CODEC, primer, res), strict=True):
            check_grammar(tokens, open_pitches(CODEC, primer.tokens))
            length = shift_steps(CODEC)[tokens].sum() * STEP
            notes = pm.instruments[0].notes
            assert notes, "a random tiny model still plays notes in 3 s"
            assert all(0 <= n.start < n.end <= length + 1e-9 for n in notes)  # closed, never backwards
            assert [n.start for n in notes] == sorted(n.start for n in notes)
