"""The service with a sharded checkpoint folder: `serve` accepts it, /v1/model's sha256 covers every shard."""

from __future__ import annotations

import hashlib

import pytest

from musicrel.errors import CheckpointError


@pytest.fixture
def sharded(tmp_path):
    import torch

    from musicrel.midi.codec import EventCodec
    from musicrel.model.checkpoint import save_model
    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import MusicTransformer

    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=EventCodec().vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=128
    )
    save_model(MusicTransformer(config), tmp_path, codec=EventCodec(), max_shard_bytes=60_000)
    return tmp_path


def test_serve_checks_a_sharded_folder(sharded):
    from server.cli import check_checkpoint

    check_checkpoint(sharded)  # no model.safetensors, and that is fine
    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002") as exc:
        check_checkpoint(sharded)
    assert exc.value.code == "checkpoint_missing"


def test_model_info_hashes_the_shards_in_order(sharded):
    from server.metrics import Metrics
    from server.service import Service
    from server.settings import Settings

    service = Service(Settings(checkpoint=sharded, engine="thread"), Metrics())  # the model loads here
    service.load()
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) == 2
    assert service.info["sha256"] == hashlib.sha256(b"".join(p.read_bytes() for p in shards)).hexdigest()
    from musicrel.model.checkpoint import load_model

    assert service.info["parameters"] == load_model(sharded).num_parameters()
