"""Checkpoint folders: config.json (model + codec settings) and model.safetensors, nothing pickled.

A folder is self-contained: copy it anywhere and `load_model` + `load_codec` rebuild exactly what was saved.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from musicrel.errors import CheckpointError, ConfigError

FORMAT = "musicrel"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
CARD_FILE = "MODEL_CARD.md"


def save_model(model, folder, codec=None, card: str | None = None) -> Path:
    """Write `folder`/config.json, model.safetensors and (when `card` is given) MODEL_CARD.md."""
    from safetensors.torch import save_model as save_safetensors

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": model.cfg.to_dict(),
    }
    if codec is not None:
        config["codec"] = codec.config.to_dict()
    # safetensors' save_model drops the tied head weight (shared with the token embedding) instead of failing.
    save_safetensors(model, str(folder / WEIGHTS_FILE), metadata={"format": FORMAT})
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    if card is not None:
        (folder / CARD_FILE).write_text(card)
    return folder


def read_config(folder) -> dict[str, Any]:
    """The parsed config.json of a checkpoint folder, checked for format; CheckpointError otherwise."""
    path = Path(folder) / CONFIG_FILE
    if not Path(folder).is_dir():
        raise CheckpointError(f"checkpoint folder {folder} does not exist", code="checkpoint_missing")
    if not path.is_file():
        raise CheckpointError(f"checkpoint folder {folder} has no {CONFIG_FILE}", code="checkpoint_missing")
    try:
        config = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise CheckpointError(f'{path} is not a musicrel checkpoint config (no "format": "{FORMAT}")')
    version = config.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{path} has format_version {version!r}; this musicrel reads {FORMAT_VERSION}")
    if not isinstance(config.get("model"), dict):
        raise CheckpointError(f'{path} has no "model" settings')
    return config


def load_model(folder, device="cpu"):
    """Rebuild the model saved in `folder`, on `device`, in eval mode."""
    from safetensors import SafetensorError
    from safetensors.torch import load_model as load_safetensors

    from musicrel.config import ModelConfig
    from musicrel.model import MusicTransformer

    config = read_config(folder)
    try:
        cfg = ModelConfig.from_dict(config["model"])
    except (ConfigError, TypeError) as exc:
        raise CheckpointError(f"{Path(folder) / CONFIG_FILE}: bad model settings: {exc}") from None
    weights = Path(folder) / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"checkpoint folder {folder} has no {WEIGHTS_FILE}", code="checkpoint_missing")
    model = MusicTransformer(cfg)
    try:
        load_safetensors(model, str(weights), strict=True, device=str(device))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{weights} is not a readable safetensors file ({exc})") from None
    except RuntimeError as exc:  # missing/unexpected tensors or shape mismatch against config.json
        first = str(exc).strip().splitlines()
        raise CheckpointError(
            f"{weights} does not match {CONFIG_FILE}: {' '.join(line.strip() for line in first)[:500]}"
        ) from None
    return model.to(device).eval()


def load_codec(folder):
    """The EventCodec the model in `folder` was trained with (defaults when the folder stored none)."""
    from musicrel.codec import CodecConfig, EventCodec

    config = read_config(folder)
    if "codec" not in config:
        return EventCodec()
    try:
        return EventCodec(CodecConfig.from_dict(config["codec"]))
    except (ConfigError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{Path(folder) / CONFIG_FILE}: bad codec settings: {exc}") from None
