"""The n-gram baseline: counts and probabilities against hand-computed ones, pieces never mixed, a
deterministic cycle reproduced, the grammar obeyed, seeds honoured, bad data folders refused."""

from __future__ import annotations

import json

import numpy as np
import pretty_midi
import pytest

from musicrel.evaluation.metrics import grammar_errors
from musicrel.evaluation.ngram import NGramDataError, NGramModel
from musicrel.generation.primer import primer_at_cut, render
from musicrel.midi.codec import EventCodec, open_pitches, shift_steps

CODEC = EventCodec()
# A toy vocabulary of 5: tokens 0..2 are "music", 3 = eos, 4 = bos.
STREAM = np.array([4, 0, 1, 0, 2, 3, 4, 0, 1, 3])  # [bos] 0 1 0 2 [eos] [bos] 0 1 [eos]
OFFSETS = np.array([0, 6, 10])


def test_counts_and_probabilities_by_hand():
    m = NGramModel(vocab_size=5, order=2, k=1.0).fit(STREAM, OFFSETS)
    # unigrams: 0 x3, 1 x2, 2 x1, 3 x2, 4 x2 of 10; order 1 is add-k: (c + k) / (N + k V)
    p1 = np.array([4, 3, 2, 3, 3]) / 15
    np.testing.assert_allclose(m.distribution([]), p1)
    # after 0: 1 twice, 2 once; P(w | 0) = (c(0 w) + k V P1(w)) / (c(0) + k V)
    np.testing.assert_allclose(m.distribution([0]), (np.array([0, 2, 1, 0, 0]) + 5 * p1) / (3 + 5))
    assert m.distribution([0])[1] == pytest.approx(3 / 8)
    # eos -> bos spans two pieces and is never counted: after eos the model knows nothing more than P1
    np.testing.assert_allclose(m.distribution([3]), p1)
    # only the last order - 1 tokens of a context count
    np.testing.assert_allclose(m.distribution([2, 2, 0]), m.distribution([0]))
    for context in ([], [0], [1], [4], [2]):
        assert m.distribution(context).sum() == pytest.approx(1.0)


def test_nll_matches_the_distribution_token_by_token():
    m = NGramModel(vocab_size=5, order=3, k=0.5).fit(STREAM, OFFSETS)
    held_out = np.array([4, 0, 1, 0, 1, 3, 4, 2, 2, 3])
    offsets = np.array([0, 6, 10])
    expected = [
        -np.log(m.distribution(held_out[a:i])[held_out[i]])
        for a, b in zip(offsets[:-1], offsets[1:], strict=True)
        for i in range(a + 1, b)
    ]
    nll, n = m.nll(held_out, offsets)
    assert n == 8 and nll == pytest.approx(np.mean(expected))


def cycle_notes(seconds: float) -> list:
    """C D E, a quarter second each, over and over."""
    return [
        pretty_midi.Note(80, (60, 62, 64)[i % 3], 0.25 * i, 0.25 * i + 0.25) for i in range(int(seconds * 4))
    ]


def fitted_on(notes, **kw) -> NGramModel:
    tokens = np.concatenate([[CODEC.bos_id], CODEC.encode_notes(notes), [CODEC.eos_id]])
    return NGramModel(CODEC.vocab_size, **kw).fit(tokens, [0, len(tokens)])


def test_a_deterministic_cycle_is_reproduced():
    m = fitted_on(cycle_notes(60.0), order=4, k=1e-9)
    notes = cycle_notes(60.0)
    primer = primer_at_cut(CODEC, notes, cut=3.0, primer_seconds=3.0)  # ends after E: C comes next
    [tokens] = m.sample(CODEC, [(primer, 0)], seconds=2.0)
    got = [
        (n.pitch, round(n.start, 3), round(n.end, 3))
        for n in render(CODEC, primer, tokens).instruments[0].notes
    ]
    assert got == [(n.pitch, n.start - 3.0, n.end - 3.0) for n in notes[12:20]]
    assert int(shift_steps(CODEC)[tokens].sum()) == 200  # exactly the 2 s asked for


def test_sampling_obeys_the_grammar_and_its_seed():
    rng = np.random.default_rng(0)
    events = rng.integers(0, CODEC.num_events, size=20_000)  # no specials; note-offs of anything, anywhere
    m = NGramModel(CODEC.vocab_size, order=3, k=0.1).fit(events, [0, len(events)])
    primer = primer_at_cut(CODEC, cycle_notes(4.0) + [pretty_midi.Note(80, 72, 3.5, 5.0)], cut=4.0)
    sounding = open_pitches(CODEC, primer.tokens)
    assert sounding[72] and sounding.sum() == 1
    # unconstrained, nearly every note-off the n-gram proposes would be an orphan
    off = slice(CODEC.note_off_offset, CODEC.note_off_offset + 128)
    assert m.distribution(primer.tokens)[off].sum() > 0.2
    jobs = [(primer, seed) for seed in range(6)]
    samples = m.sample(CODEC, jobs, seconds=3.0)
    for tokens in samples:
        counts = grammar_errors(CODEC, tokens, sounding)
        assert counts["orphan_note_off"] == counts["special_token"] == counts["out_of_vocab"] == 0
        assert int(shift_steps(CODEC)[tokens].sum()) == 300
    assert len({t.tobytes() for t in samples}) == 6  # six seeds, six continuations
    # a job's tokens depend on its seed only, not on the jobs beside it
    np.testing.assert_array_equal(m.sample(CODEC, [jobs[3]], seconds=3.0)[0], samples[3])


def test_from_prepared_checks_the_folder(tmp_path):
    with pytest.raises(NGramDataError) as err:
        NGramModel.from_prepared(tmp_path, CODEC)
    assert err.value.code == "invalid_ngram_data"
    tokens = np.array([CODEC.bos_id, 60, 256, 188, CODEC.eos_id], dtype=np.uint16)
    np.save(tmp_path / "train.npy", tokens)
    np.save(tmp_path / "train_offsets.npy", np.array([0, 5]))
    other = {**CODEC.config.to_dict(), "step_ms": 20}
    (tmp_path / "manifest.json").write_text(json.dumps({"codec": other}))
    with pytest.raises(NGramDataError, match="another codec"):
        NGramModel.from_prepared(tmp_path, CODEC)
    (tmp_path / "manifest.json").write_text(json.dumps({"codec": CODEC.config.to_dict()}))
    m = NGramModel.from_prepared(tmp_path, CODEC, order=2)
    V, k = CODEC.vocab_size, m.k  # 60 -> 256 seen once, against k V pseudo-counts spread by the unigrams
    p1 = (1 + k) / (5 + k * V)
    assert m.distribution([60])[256] == pytest.approx((1 + k * V * p1) / (1 + k * V))
    with pytest.raises(NGramDataError, match="offsets"):
        NGramModel(5).fit(STREAM, [0, 6])
