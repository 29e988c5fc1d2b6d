"""Fixtures of the generation tests (grammar, primer, sampling, generate, batch); their helpers are in
fixtures_generation.py. A test module that defines its own `model` uses that one."""

from __future__ import annotations

import pytest
import torch

from musicrel.model.transformer import MusicTransformer
from tests.musicrel.fixtures_generation import tiny_model


@pytest.fixture(scope="module")
def one_thread():
    # Tiny models on a shared machine: thread hand-offs cost more than the arithmetic.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model() -> MusicTransformer:
    return tiny_model()
