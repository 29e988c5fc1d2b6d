"""Checkpoint folders: exact round trip, self-contained, no pickle, clear errors for bad folders."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from musicrel.checkpoint import load_codec, load_model, save_model
from musicrel.codec import CodecConfig, EventCodec
from musicrel.config import ModelConfig
from musicrel.errors import CheckpointError
from musicrel.model import MusicTransformer
from tests.musicrel.test_model import one_thread  # noqa: F401

SCHEMES = ["skew", "shaw", "t5", "absolute"]


def tiny_model(attention="skew", **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=EventCodec().vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64,
                      max_seq_len=128, attention=attention, **kw)  # fmt: skip
    return MusicTransformer(cfg).eval()


@pytest.mark.parametrize("attention", SCHEMES)
def test_round_trip_identical_logits(tmp_path, attention, monkeypatch):
    model = tiny_model(attention, max_relative_distance=20, absolute_kind="sinusoidal")
    codec = EventCodec(CodecConfig(step_ms=8, velocity_bins=16, pedal="events", tracks=[0, 2]))
    save_model(model, tmp_path / "ckpt", codec=codec, card="# tiny\n")
    copied = tmp_path / "elsewhere" / "copy"
    shutil.copytree(tmp_path / "ckpt", copied)
    shutil.rmtree(tmp_path / "ckpt")

    def no_pickle(*a, **k):
        raise AssertionError("torch.load (pickle) must not be used")

    monkeypatch.setattr(torch, "load", no_pickle)
    loaded = load_model(copied)
    assert not loaded.training
    assert loaded.cfg == model.cfg
    x = torch.randint(0, model.cfg.vocab_size, (2, 50))
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    assert load_codec(copied).config == codec.config
    assert sorted(p.name for p in copied.iterdir()) == ["MODEL_CARD.md", "config.json", "model.safetensors"]
    assert (copied / "MODEL_CARD.md").read_text() == "# tiny\n"


def test_config_json_layout_and_tied_weights(tmp_path):
    model = tiny_model()
    save_model(model, tmp_path, codec=EventCodec())
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["format"] == "musicrel" and config["format_version"] == 1
    assert ModelConfig.from_dict(config["model"]) == model.cfg
    assert CodecConfig.from_dict(config["codec"]) == EventCodec().config
    loaded = load_model(tmp_path)
    assert loaded.head.weight is loaded.tok_emb.weight  # still tied after loading
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]  # no card given


def test_codec_defaults_when_none_saved(tmp_path):
    save_model(tiny_model(), tmp_path)
    assert load_codec(tmp_path).config == CodecConfig()


@pytest.fixture
def saved(tmp_path):
    save_model(tiny_model(), tmp_path, codec=EventCodec())
    return tmp_path


def test_missing_folder_or_files(tmp_path, saved):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "nope")
    (saved / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model(saved)
    (saved / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        load_model(saved)
    with pytest.raises(CheckpointError, match="config.json"):
        load_codec(saved)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_weights(saved, damage):
    path = saved / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(
        {"truncate": data[: len(data) // 2], "garbage": b"\x00not safetensors" * 10, "empty": b""}[damage]
    )
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model(saved)


def test_shape_mismatch_with_config(saved):
    path = saved / "config.json"
    config = json.loads(path.read_text())
    config["model"]["d_ff"] = 96
    path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="does not match"):
        load_model(saved)


def test_scheme_mismatch_with_config(saved):
    path = saved / "config.json"
    config = json.loads(path.read_text())
    config["model"]["attention"] = "t5"  # weights have E_r, config expects a T5 bias
    path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="does not match"):
        load_model(saved)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.update(format="other"), "not a musicrel checkpoint"),
        (lambda c: c.update(format_version=99), "format_version"),
        (lambda c: c["model"].update(n_heads=0), "n_heads"),
        (lambda c: c["model"].update(bogus=1), "bogus"),
        (lambda c: c["codec"].update(step_ms=0), "step_ms"),
    ],
)
def test_bad_config_json(saved, edit, message):
    path = saved / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        load_model(saved) if "codec" not in message and message != "step_ms" else load_codec(saved)


def test_config_json_not_json(saved):
    (saved / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_model(saved)
