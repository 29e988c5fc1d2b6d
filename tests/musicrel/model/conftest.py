"""Tiny models of every attention scheme, shared by the model tests (transformer, KV cache,
attention, checkpoint); every one of them runs on one thread."""

from __future__ import annotations

import pytest
import torch

from musicrel.model.config import ModelConfig
from musicrel.model.transformer import MusicTransformer

SCHEMES = ["skew", "shaw", "t5", "absolute"]
VOCAB = 40


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: intra-op threads only add synchronisation cost (badly so on a busy shared CPU)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny(attention: str, **kw) -> ModelConfig:
    base = dict(
        vocab_size=VOCAB, n_layers=2, d_model=32, n_heads=4, d_ff=48, max_seq_len=48, dropout=0.0,
        attention=attention, max_relative_distance=9, t5_num_buckets=8, t5_max_distance=20,
    )  # fmt: skip
    return ModelConfig(**{**base, **kw})


def make(attention: str, seed: int = 0, **kw) -> MusicTransformer:
    torch.manual_seed(seed)
    return MusicTransformer(tiny(attention, **kw)).eval()


def tokens(B: int, T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))
