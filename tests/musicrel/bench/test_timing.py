from __future__ import annotations

import torch

from musicrel.bench.timing import cpu_name, side_by_side

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 23
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu avx2

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: another
"""


def test_cpu_name_tells_generations_apart_by_family_and_model():
    name = cpu_name(CPUINFO)
    assert name.startswith("AMD EPYC (family 23 model 1), ")  # the first processor's, not the second's
    assert torch.backends.cpu.get_cpu_capability() in name
    assert name.endswith(" CPUs")


def test_cpu_name_without_cpuinfo_still_names_something():
    name = cpu_name("")
    assert "family" not in name and name.split(",")[0].strip()


def test_side_by_side_interleaves_and_alternates():
    calls: list[str] = []
    results = side_by_side(
        {"a": lambda: calls.append("a") or 1.0, "b": lambda: calls.append("b") or 2.0},
        repeats=3,
        warmup=False,
        alternate=True,
    )
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert results == {"a": [1.0, 1.0, 1.0], "b": [2.0, 2.0, 2.0]}
