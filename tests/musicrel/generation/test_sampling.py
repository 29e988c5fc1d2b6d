"""musicrel.generation.sampling: SamplingParams refuses what it cannot sample with."""

from __future__ import annotations

import pytest

from musicrel.errors import GenerationError
from musicrel.generation.sampling import MAX_SEED, SEED_RANGE, SamplingParams, derived_seed, draw_seed


@pytest.mark.parametrize(
    "field, value",
    [
        ("seconds", 0),
        ("seconds", float("nan")),
        ("temperature", 0.0),
        ("temperature", -1),
        ("top_k", 0),
        ("top_k", 2.5),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("shift_temperature", 0.0),
        ("shift_temperature", float("inf")),
        ("num_samples", 0),
        ("seed", -1),
        ("seed", MAX_SEED + 1),
        ("max_new_tokens", 0),
        ("include_primer", "yes"),
    ],
)
def test_sampling_params_are_validated(field, value):
    with pytest.raises(GenerationError, match=field) as info:
        SamplingParams(**{field: value})
    assert info.value.code == "invalid_params"


def test_one_seed_range_drawn_derived_and_accepted():
    assert MAX_SEED == SEED_RANGE - 1 == 2**32 - 1
    assert SamplingParams(seed=MAX_SEED).seed == MAX_SEED
    drawn = {draw_seed() for _ in range(200)}
    assert all(0 <= s <= MAX_SEED for s in drawn) and len(drawn) > 190
    derived = [derived_seed(MAX_SEED, i) for i in range(50)]
    assert all(0 <= s <= MAX_SEED for s in derived) and derived == [
        derived_seed(MAX_SEED, i) for i in range(50)
    ]
    assert len(set(derived)) == 50
