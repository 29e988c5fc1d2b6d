"""The generation fuzz (musicrel/bench/genfuzz.py), a short seeded run in-process: valid requests steered
into degenerate outputs (empty samples, one-note motifs, extreme sampling, every control) are never a 5xx, and
each answer holds what it says. `musicrel bench reliability --fuzz-generation N` is the long run."""

from __future__ import annotations

import os

import pytest

from musicrel.bench import genfuzz
from tests.server.conftest import serve

CASES = int(os.environ.get("MUSICREL_GENFUZZ_CASES", "60"))


@pytest.fixture(scope="module")
def indexed_client(tiny_checkpoint, tmp_path_factory):
    folder = genfuzz.with_novelty_index(tiny_checkpoint, tmp_path_factory.mktemp("fuzz") / "ckpt")
    with serve(folder, batch_window_ms=0, raise_errors=False) as (client, _):
        yield client


def test_degenerate_generations_are_never_a_server_error(indexed_client):
    report = genfuzz.run(indexed_client, CASES, seed=0)
    assert report.sent == CASES
    assert not report.failures, "\n".join(report.failures[:5])
    assert report.server_errors == 0
    # The run reached what it is for: samples of fewer than two notes, and plenty of successes.
    assert report.empty_samples > 0
    assert report.statuses["200"] >= CASES // 2, report.statuses


def test_cases_are_seeded():
    import random

    limits = {"seconds": 60, "primer_seconds": 120, "num_samples": 4, "top_k": 391}
    names = sorted(genfuzz.motifs())
    first = [genfuzz.case(random.Random(5), limits, names) for _ in range(3)]
    again = [genfuzz.case(random.Random(5), limits, names) for _ in range(3)]
    assert first == again
    assert all(float(c["fields"]["seconds"]) <= 3.0 for c in first)
