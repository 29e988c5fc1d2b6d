"""`musicrel curves`: runs put on one time axis by their own step time; table and plot."""

from __future__ import annotations

import pytest

from musicrel.cli import main
from musicrel.errors import ConfigError
from training.curves import curves, parse_run


def _metrics(folder, rows):
    folder.mkdir(parents=True)
    lines = ["epoch,step,train/loss,val_nll,val_nll/pop,val_nll/piano"]
    lines += [f"0,{step},,{a},{b},{c}" for step, a, b, c in rows]
    lines.append("0,5,3.0,,,")  # a training row: no validation figures
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
    return folder


def test_runs_compare_at_the_shorter_runs_end_in_its_own_seconds(tmp_path, capsys):
    fast = _metrics(tmp_path / "fast", [(100, 3.0, 3.5, 2.5), (200, 2.0, 2.5, 1.5), (400, 1.0, 1.5, 0.5)])
    slow = _metrics(tmp_path / "slow", [(50, 4.0, 4.5, 3.5), (100, 3.5, 4.0, 3.0)])
    # fast: 0.5 s a step (400 steps = 200 s); slow: 2 s a step (100 steps = 200 s, 50 steps = 100 s)
    table = curves([f"fast={fast}:0.5", f"slow={slow}:2"], out=tmp_path / "c.png")
    rows = [line.split("|")[1:-1] for line in table.splitlines()[2:]]
    assert [[c.strip() for c in r] for r in rows] == [
        ["fast", "3", "1.000", "0.500", "1.500"],
        ["slow", "3", "3.500", "3.000", "4.000"],
    ]
    assert table.splitlines()[0].split("|")[3:6] == [" all ", " piano ", " pop "]
    assert (tmp_path / "c.png").stat().st_size > 10_000
    longer = curves([f"fast={fast}:1", f"slow={slow}:2"])  # fast runs 400 s: rows at 200 s and 400 s
    assert [line.split("|")[2].strip() for line in longer.splitlines()[2:]] == ["3", "7", "3"]
    assert main(["curves", f"a={fast}+{slow}:1"]) == 0  # a resumed run: folders joined, later ones win
    assert "| a | 7 |" in capsys.readouterr().out


@pytest.mark.parametrize("spec", ["nolabel", "a=dir", "a=dir:x", "a=dir:-1", "a=/nowhere:1"])
def test_a_bad_run_is_refused(spec):
    with pytest.raises(ConfigError) as err:
        parse_run(spec)
    assert err.value.code == "bad_run"
