"""Models the benchmarks time when no checkpoint is given: random weights of a chosen shape (the speed of a
shape does not depend on what it learned)."""

from __future__ import annotations

from pathlib import Path


def random_checkpoint(folder: Path, **config) -> Path:
    """A random model of the default ModelConfig size, or of `config`'s, saved in `folder`."""
    import torch

    from musicrel.midi.codec import EventCodec
    from musicrel.model.checkpoint import save_model
    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import MusicTransformer

    torch.manual_seed(0)
    codec = EventCodec()
    save_model(MusicTransformer(ModelConfig(vocab_size=codec.vocab_size, **config)), folder, codec=codec)
    return folder
