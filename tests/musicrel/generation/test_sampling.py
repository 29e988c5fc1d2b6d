"""musicrel.generation.sampling: SamplingParams refuses what it cannot sample with."""

from __future__ import annotations

import pytest

from musicrel.errors import GenerationError
from musicrel.generation.sampling import SamplingParams


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
        ("num_samples", 0),
        ("seed", -1),
        ("max_new_tokens", 0),
        ("include_primer", "yes"),
    ],
)
def test_sampling_params_are_validated(field, value):
    with pytest.raises(GenerationError, match=field) as info:
        SamplingParams(**{field: value})
    assert info.value.code == "invalid_params"
