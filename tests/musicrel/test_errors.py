"""The one strict-number check (musicrel.errors.is_int, is_number) every setting is validated with."""

from __future__ import annotations

import math

import numpy as np

from musicrel.errors import is_int, is_number


def test_integers_and_numbers_are_strict():
    assert is_int(3) and is_int(np.int64(3)) and is_int(-1)
    assert not is_int(True) and not is_int(3.0) and not is_int("3") and not is_int(None)
    assert is_number(0.5) and is_number(2) and is_number(np.float32(0.5)) and is_number(np.int16(1))
    for bad in (True, False, math.nan, math.inf, -math.inf, "1", None, [1]):
        assert not is_number(bad), bad
