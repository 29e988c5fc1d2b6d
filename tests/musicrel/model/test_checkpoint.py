"""Checkpoint folders: exact round trip, self-contained, no pickle, clear errors for bad folders."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from musicrel.errors import CheckpointError, ConfigError
from musicrel.midi.codec import CodecConfig, EventCodec
from musicrel.model.checkpoint import load_codec, load_model, save_model
from musicrel.model.config import ModelConfig
from musicrel.model.transformer import MusicTransformer

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


# ---- sharded and bfloat16 storage ------------------------------------------------------------------


def _logits(model, seed=1):
    x = torch.randint(0, model.cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(x)


def _through_bf16(model):
    """The same model with every float weight rounded to bfloat16 and back (what bf16 storage keeps)."""
    rounded = tiny_model()
    rounded.load_state_dict({k: v.bfloat16().float() for k, v in model.state_dict().items()})
    return rounded.eval()


def test_sharded_round_trip(tmp_path, monkeypatch):
    from safetensors import safe_open

    model = tiny_model()
    limit = 60_000  # the tiny model's weights are ~100 kB in float32 (~50 kB of them the embedding)
    save_model(model, tmp_path, codec=EventCodec(), max_shard_bytes=limit)
    names = sorted(p.name for p in tmp_path.iterdir())
    shards = [n for n in names if n.startswith("model-")]
    assert len(shards) >= 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert names == sorted(["config.json", "model.safetensors.index.json", *shards])
    assert all((tmp_path / n).stat().st_size <= limit for n in shards)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    stored = {}
    for n in shards:
        with safe_open(tmp_path / n, "pt") as f:
            stored.update(dict.fromkeys(f.keys(), n))
    assert index["weight_map"] == stored  # every tensor once, in the shard the index names
    assert "head.weight" in stored and "tok_emb.weight" not in stored  # the tied pair stored once
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values()) - model.head.weight.nbytes
    assert index["metadata"]["total_size"] == total

    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load (pickle) must not be used"))
    loaded = load_model(tmp_path)
    assert loaded.head.weight is loaded.tok_emb.weight
    assert torch.equal(_logits(loaded), _logits(model))


@pytest.mark.parametrize("limit", [None, 30_000], ids=["single", "sharded"])
def test_bfloat16_storage_loads_as_float32(tmp_path, limit):
    from safetensors import safe_open

    model = tiny_model()
    kw = {} if limit is None else {"max_shard_bytes": limit}
    save_model(model, tmp_path / "f32", **kw)
    save_model(model, tmp_path / "bf16", dtype="bfloat16", **kw)
    size = lambda folder: sum(p.stat().st_size for p in folder.glob("*.safetensors"))  # noqa: E731
    assert size(tmp_path / "bf16") < 0.55 * size(tmp_path / "f32")
    first = sorted((tmp_path / "bf16").glob("*.safetensors"))[0]
    with safe_open(first, "pt") as f:
        assert {f.get_tensor(k).dtype for k in list(f.keys())} == {torch.bfloat16}
    loaded = load_model(tmp_path / "bf16")
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    assert torch.equal(_logits(loaded), _logits(_through_bf16(model)))


def test_single_file_is_what_safetensors_save_model_writes(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_model as safetensors_save_model

    model = tiny_model()
    save_model(model, tmp_path / "ours")  # default limit: 16 MiB, far above the tiny model
    safetensors_save_model(model, str(tmp_path / "theirs.safetensors"), metadata={"format": "musicrel"})
    with (
        safe_open(tmp_path / "ours" / "model.safetensors", "pt") as a,
        safe_open(tmp_path / "theirs.safetensors", "pt") as b,
    ):
        assert a.metadata() == b.metadata() and sorted(a.keys()) == sorted(b.keys())
        assert all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in list(a.keys()))
    assert sorted(p.name for p in (tmp_path / "ours").iterdir()) == ["config.json", "model.safetensors"]


def test_a_tensor_over_the_limit_gets_a_shard_of_its_own(tmp_path):
    from musicrel.model.checkpoint import weights_files

    model = tiny_model()
    save_model(model, tmp_path, max_shard_bytes=30_000)  # below the 50 kB embedding
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    alone = [f for f in weights_files(tmp_path) if list(index.values()).count(f.name) == 1]
    assert [index_name for index_name, f in index.items() if f == alone[-1].name] == ["head.weight"]
    assert all(f.stat().st_size <= 30_000 for f in weights_files(tmp_path) if f != alone[-1])
    assert torch.equal(_logits(load_model(tmp_path)), _logits(model))


def test_saving_again_replaces_the_other_layout(tmp_path):
    model = tiny_model()
    save_model(model, tmp_path, max_shard_bytes=30_000)
    save_model(model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    save_model(model, tmp_path, max_shard_bytes=60_000)
    assert "model.safetensors" not in {p.name for p in tmp_path.iterdir()}
    assert torch.equal(_logits(load_model(tmp_path)), _logits(model))


def test_weights_sha256(tmp_path):
    import hashlib

    from musicrel.model.checkpoint import weights_files, weights_sha256

    model = tiny_model()
    save_model(model, tmp_path / "one")
    single = (tmp_path / "one" / "model.safetensors").read_bytes()
    assert weights_sha256(tmp_path / "one") == hashlib.sha256(single).hexdigest()  # unchanged meaning
    save_model(model, tmp_path / "sh", max_shard_bytes=30_000)
    files = weights_files(tmp_path / "sh")
    assert len(files) >= 3 and files == sorted(files)
    joined = b"".join(f.read_bytes() for f in files)
    assert weights_sha256(tmp_path / "sh") == hashlib.sha256(joined).hexdigest()
    files[-1].write_bytes(files[-1].read_bytes()[:-1] + b"\x01")
    assert weights_sha256(tmp_path / "sh") != hashlib.sha256(joined).hexdigest()


@pytest.fixture
def sharded(tmp_path):
    save_model(tiny_model(), tmp_path, codec=EventCodec(), max_shard_bytes=30_000)
    return tmp_path


def _edit_index(folder, edit):
    path = folder / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    edit(index)
    path.write_text(json.dumps(index))


def test_sharded_missing_or_extra_files(sharded):
    (sharded / "model-00002-of-00004.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00004") as exc:
        load_model(sharded)
    assert exc.value.code == "checkpoint_missing"
    save_model(tiny_model(), sharded, max_shard_bytes=30_000)
    shutil.copy(sharded / "model-00001-of-00004.safetensors", sharded / "model.safetensors")
    with pytest.raises(CheckpointError, match="both"):
        load_model(sharded)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda i: i.update(weight_map={}), "weight_map"),
        (lambda i: i["weight_map"].update({"head.weight": "../model.safetensors"}), "not a shard file"),
        (lambda i: i["weight_map"].pop("blocks.0.attn.E_r"), "does not hold the tensors"),
        (lambda i: i["weight_map"].pop("head.weight"), "does not match config.json: missing"),
        (
            lambda i: i["weight_map"].update({"extra.weight": "model-00001-of-00004.safetensors"}),
            "does not hold",
        ),
    ],
)
def test_sharded_bad_index(sharded, edit, message):
    _edit_index(sharded, edit)
    with pytest.raises(CheckpointError, match=message):
        load_model(sharded)


def test_sharded_bad_shard_or_shape(sharded):
    shard = sharded / "model-00003-of-00004.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="model-00003-of-00004.safetensors is not a readable"):
        load_model(sharded)
    save_model(tiny_model(), sharded, max_shard_bytes=30_000)
    config = json.loads((sharded / "config.json").read_text())
    config["model"]["d_ff"] = 96
    (sharded / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="does not match"):
        load_model(sharded)


def test_save_refuses_bad_storage_settings(tmp_path):
    with pytest.raises(ConfigError, match="dtype"):
        save_model(tiny_model(), tmp_path, dtype="float16")
    with pytest.raises(ConfigError, match="max_shard_bytes"):
        save_model(tiny_model(), tmp_path, max_shard_bytes=0)
