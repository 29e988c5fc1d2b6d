"""`musicrel bench train`: the table has a row per shape x mode x thread count, timed (not asserted on)."""

from __future__ import annotations

import pytest

from musicrel.cli import main
from musicrel.errors import ConfigError
from training.bench import parse_shape


def test_bench_train_prints_a_row_per_contender(capsys):
    argv = ["bench", "train", "--shapes", "1x32,2x64", "--modes", "fp32,bf16", "--threads", "1"]
    assert main([*argv, "--seq-len", "16", "--batch-size", "2", "--repeats", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [(r[0], r[2], r[3]) for r in rows] == [
        ("1x32", "fp32", "1"),
        ("1x32", "bf16", "1"),
        ("2x64", "fp32", "1"),
        ("2x64", "bf16", "1"),
    ]
    assert all(float(r[4]) > 0 for r in rows) and rows[0][-1] == "1.00x" and rows[2][-1] == "1.00x"


@pytest.mark.parametrize("text", ["3", "x192", "3x100", "0x64", "ax64"])
def test_a_bad_shape_is_refused(text):
    with pytest.raises(ConfigError) as err:
        parse_shape(text)
    assert err.value.code == "bad_shape"
