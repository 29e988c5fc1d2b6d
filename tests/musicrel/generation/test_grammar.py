"""The grammar on constructed token streams (re-strike, orphan note-off, notes open at the cut, max hold,
pedal) and on generated ones."""

from __future__ import annotations

import numpy as np
import pretty_midi
import pytest
import torch

from musicrel.generation.decode_batch import generate_batch
from musicrel.generation.grammar import (
    HOLD_FACTOR,
    MAX_HOLD_SECONDS,
    MIN_HOLD_SECONDS,
    Grammar,
    max_hold_seconds,
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
    grammar = Grammar(CODEC, [primer.tokens], [10**6], [300])
    assert grammar.open[0].nonzero().flatten().tolist() == [60]
    assert grammar.onset[0, 60].item() == -200  # struck 2 s before the cut
    logits = grammar.constrain(_peaked(OFF + 60))
    assert logits.argmax().item() == OFF + 60  # its note-off is legal, not an orphan


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
