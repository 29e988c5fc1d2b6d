"""`musicrel export`: a Lightning checkpoint of `musicrel train` -> a self-contained model folder.

The .ckpt is read with `torch.load(weights_only=True)`: the module's hyper-parameters are plain types (the
ModelConfig fields and the codec settings linked from the prepared data), so nothing needs unpickling.
"""

from __future__ import annotations

import pickle
from pathlib import Path

from musicrel.errors import CheckpointError

PREFIX = "model."


def read_lightning_checkpoint(path) -> dict:
    import torch

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint file at {path}", code="checkpoint_missing")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
        raise CheckpointError(
            f"{path} is not a readable Lightning checkpoint: {str(exc).splitlines()[0]}"
        ) from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "hyper_parameters" not in ckpt:
        raise CheckpointError(
            f"{path} is not a checkpoint of `musicrel train` (no state_dict/hyper_parameters)"
        )
    return ckpt


def model_from_lightning_checkpoint(path):
    """(model in eval mode, EventCodec, the raw checkpoint dict) from a .ckpt of `musicrel train`."""
    from musicrel.midi.codec import CodecConfig, EventCodec
    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import MusicTransformer

    ckpt = read_lightning_checkpoint(path)
    hp = ckpt["hyper_parameters"]
    cfg = ModelConfig.from_hparams(hp)
    if not hp.get("codec"):
        raise CheckpointError(f"{path} carries no codec settings in its hyper-parameters")
    codec = EventCodec(CodecConfig.from_dict(hp["codec"]))
    if codec.vocab_size != cfg.vocab_size:
        raise CheckpointError(f"{path}: codec vocab {codec.vocab_size} != model vocab_size {cfg.vocab_size}")
    # torch.compile(module) would prefix keys with _orig_mod.; in-place Module.compile (what we use) does not.
    state = {
        k[len(PREFIX) :].replace("_orig_mod.", ""): v
        for k, v in ckpt["state_dict"].items()
        if k.startswith(PREFIX)
    }
    model = MusicTransformer(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (cfg.tie_embeddings and k == "head.weight")]
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match the config (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return model.eval(), codec, ckpt


def default_card(path, ckpt, model) -> str:
    from musicrel.model.config import ModelConfig

    hp = ckpt["hyper_parameters"]
    cfg = ModelConfig.from_hparams(hp).to_dict()
    arch = ", ".join(
        f"{k}={cfg[k]}" for k in ("attention", "n_layers", "d_model", "n_heads", "d_ff", "max_seq_len")
    )
    return (
        f"# musicrel model\n\nExported from `{path}` "
        f"(step {ckpt.get('global_step')}, epoch {ckpt.get('epoch')}).\n\n"
        f"- architecture: {arch}\n- parameters: {model.num_parameters():,}\n- codec: {hp['codec']}\n"
    )


def export_checkpoint(
    path, out, card: str | Path | None = None, max_shard_bytes: int | None = None, dtype: str = "float32"
) -> Path:
    """Write the model folder; weights over `max_shard_bytes` (default: checkpoint.MAX_SHARD_BYTES) are
    sharded, `dtype` is their storage dtype (see musicrel.model.checkpoint.save_model)."""
    from musicrel.model.checkpoint import MAX_SHARD_BYTES, save_model

    model, codec, ckpt = model_from_lightning_checkpoint(path)
    text = Path(card).read_text() if card is not None else default_card(path, ckpt, model)
    limit = MAX_SHARD_BYTES if max_shard_bytes is None else max_shard_bytes
    return save_model(model, out, codec=codec, card=text, max_shard_bytes=limit, dtype=dtype)
