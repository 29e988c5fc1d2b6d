"""`gap_nll`: the true gap scored with and without the music after it, on a tiny model."""

from __future__ import annotations

import math

import pytest

from musicrel.errors import InfillError
from musicrel.evaluation.gap_nll import gap_nll
from musicrel.midi.codec import EventCodec
from tests.musicrel.generation.test_infill import CODEC, band, infill_model


def test_gap_nll_scores_the_same_gap_both_ways():
    model = infill_model(max_seq_len=256)
    out = gap_nll(model, CODEC, band(20.0), 6.0, 10.0)
    assert set(out["nll"]) == {"with_future", "past_only"}
    for value in out["nll"].values():
        assert math.isfinite(value) and 0 < value < 3 * out["uniform"]
    assert out["gap_tokens"] > 0 and out["past_tokens"] > 0 and out["future_tokens"] > 0
    # a random model reads both the same way: neither reading is off by much
    assert abs(out["nll"]["with_future"] - out["nll"]["past_only"]) < 1.0


def test_gap_nll_needs_an_infill_model_and_a_good_span():
    model = infill_model(max_seq_len=128)
    with pytest.raises(InfillError) as err:
        gap_nll(model, CODEC, band(20.0), 10.0, 6.0)
    assert err.value.code == "invalid_span"
    with pytest.raises(InfillError) as err:
        gap_nll(model, EventCodec(), band(20.0), 6.0, 10.0)
    assert err.value.code == "model_cannot_infill"
