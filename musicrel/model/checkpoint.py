"""Checkpoint folders: config.json (model + codec settings) and the weights in safetensors, nothing pickled.

The weights are one `model.safetensors`, or, when they exceed `max_shard_bytes`, shards
`model-00001-of-0000N.safetensors` listed by `model.safetensors.index.json` (Hugging Face's layout), so that
no file is larger than what a transfer allows. A folder is self-contained: copy it anywhere and `load_model`
+ `load_codec` rebuild exactly what was saved.

torch, safetensors and the model are imported inside the functions that load or save: `musicrel --help` and
`musicrel serve` read this module's constants and checks at start-up, before anything needs torch.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from musicrel.errors import CheckpointError, ConfigError, is_int
from musicrel.model.weights import DECODE_WEIGHTS

FORMAT = "musicrel"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SHARD_FILE = "model-{:05d}-of-{:05d}.safetensors"
SHARD_RE = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
CARD_FILE = "MODEL_CARD.md"
# Files coming back from a GPU machine are capped at 16 MiB each.
MAX_SHARD_BYTES = 16 * 2**20
# Storage dtypes: bfloat16 halves the files (a bf16-mixed run computed in bf16 anyway); loading upcasts.
WEIGHT_DTYPES = ("float32", "bfloat16")
# Room in a shard for its JSON header: per tensor its name plus ~80 bytes of dtype/shape/offsets, and the
# metadata (format, tied-weight aliases).
_HEADER_BYTES_PER_TENSOR = 128
_HEADER_BYTES_BASE = 1024


def save_model(
    model,
    folder,
    codec=None,
    card: str | None = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    dtype: str = "float32",
) -> Path:
    """Write `folder`/config.json, the weights and (when `card` is given) MODEL_CARD.md.

    The weights go to one model.safetensors when it fits in `max_shard_bytes`, else to shards of at most that
    size plus model.safetensors.index.json (a single tensor larger than that gets a shard of its own).
    `dtype` is the storage dtype of floating-point weights ("float32" or "bfloat16")."""
    from safetensors.torch import save_file

    if dtype not in WEIGHT_DTYPES:
        raise ConfigError(f"weights dtype must be one of {WEIGHT_DTYPES}, got {dtype!r}")
    if not is_int(max_shard_bytes) or max_shard_bytes < 1:
        raise ConfigError(f"max_shard_bytes must be a positive integer, got {max_shard_bytes!r}")
    from musicrel.model.quantize import is_quantized

    if is_quantized(model):  # its int8 weights are a decoding copy; the float32 ones are gone
        raise CheckpointError("a model loaded with int8 weights cannot be saved; load its float32 weights")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": model.cfg.to_dict(),
    }
    if codec is not None:
        config["codec"] = codec.config.to_dict()
    tensors, aliases = _tensors_to_store(model, dtype)
    metadata = {"format": FORMAT, **aliases}
    shards = _plan_shards(tensors, max_shard_bytes, metadata)
    # A folder saved into again must not keep weights of its previous layout (both would be ambiguous).
    for old in folder.iterdir():
        if old.name in (WEIGHTS_FILE, INDEX_FILE) or SHARD_RE.fullmatch(old.name):
            old.unlink()
    if len(shards) == 1:
        save_file(tensors, str(folder / WEIGHTS_FILE), metadata=metadata)
    else:
        weight_map = {}
        for i, names in enumerate(shards, 1):
            name = SHARD_FILE.format(i, len(shards))
            save_file({k: tensors[k] for k in names}, str(folder / name), metadata=metadata)
            weight_map.update(dict.fromkeys(names, name))
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"format": FORMAT, "total_size": total}, "weight_map": weight_map}
        (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    if card is not None:
        (folder / CARD_FILE).write_text(card)
    return folder


def _tensors_to_store(model, dtype: str) -> tuple[dict[str, Any], dict[str, str]]:
    """({name: contiguous CPU tensor}, {dropped alias: kept name}).

    Tensors sharing storage (the tied head and token embedding) are stored once, under the name
    safetensors' own save_model keeps (the first in sorted order), with the same alias metadata: a float32
    single file holds what `safetensors.torch.save_model` (which earlier checkpoints were written with)
    writes."""
    import torch

    state = model.state_dict()
    groups: dict[tuple, list[str]] = {}
    for name, t in state.items():
        groups.setdefault((t.data_ptr(), tuple(t.shape), t.stride()), []).append(name)
    aliases = {}
    for names in groups.values():
        keep = sorted(names)[0]
        aliases.update({other: keep for other in names if other != keep})
    target = getattr(torch, dtype)
    tensors = {}
    for name, t in state.items():
        if name in aliases:
            continue
        t = t.detach().to("cpu")
        tensors[name] = (t.to(target) if t.is_floating_point() else t).contiguous()
    return tensors, aliases


def _plan_shards(tensors: dict[str, Any], max_bytes: int, metadata: dict[str, str]) -> list[list[str]]:
    """Tensor names per shard, in state-dict order, each shard's file at most `max_bytes`."""
    base = _HEADER_BYTES_BASE + len(json.dumps(metadata))
    shards: list[list[str]] = [[]]
    size = base
    for name, t in tensors.items():
        need = t.numel() * t.element_size() + _HEADER_BYTES_PER_TENSOR + len(name)
        if shards[-1] and size + need > max_bytes:
            shards.append([])
            size = base
        shards[-1].append(name)
        size += need
    return shards


def weights_files(folder) -> list[Path]:
    """The weight files of a checkpoint folder: [model.safetensors], or its shards in index order."""
    folder = Path(folder)
    single, index = folder / WEIGHTS_FILE, folder / INDEX_FILE
    if not index.is_file():
        if not single.is_file():
            raise CheckpointError(
                f"checkpoint folder {folder} has no {WEIGHTS_FILE} (nor {INDEX_FILE})",
                code="checkpoint_missing",
            )
        return [single]
    if single.is_file():
        raise CheckpointError(f"checkpoint folder {folder} has both {WEIGHTS_FILE} and {INDEX_FILE}")
    files = [folder / name for name in sorted(set(_read_index(index).values()))]
    for f in files:
        if not f.is_file():
            raise CheckpointError(
                f"checkpoint folder {folder} has no {f.name} (listed in {INDEX_FILE})",
                code="checkpoint_missing",
            )
    return files


def _read_index(index: Path) -> dict[str, str]:
    """weight_map of an index file: {tensor name: shard file name}, checked."""
    try:
        data = json.loads(index.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{index} is not valid JSON: {exc}") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f'{index} has no "weight_map" of tensor names to shard files')
    for name, shard in weight_map.items():
        # only plain shard names: an index must not point outside its folder
        if not isinstance(shard, str) or not SHARD_RE.fullmatch(shard):
            raise CheckpointError(f"{index}: tensor {name!r} maps to {shard!r}, not a shard file name")
    return weight_map


def weights_sha256(folder) -> str:
    """sha256 of the weights: of model.safetensors itself, or of the shards' bytes concatenated in index
    order (what one file holding them all would hash to if it were their concatenation)."""
    digest = hashlib.sha256()
    for path in weights_files(folder):
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _config_path(folder) -> Path:
    path = Path(folder) / CONFIG_FILE
    if not Path(folder).is_dir():
        raise CheckpointError(f"checkpoint folder {folder} does not exist", code="checkpoint_missing")
    if not path.is_file():
        raise CheckpointError(f"checkpoint folder {folder} has no {CONFIG_FILE}", code="checkpoint_missing")
    return path


def check_checkpoint(folder) -> None:
    """Fail early (before a server starts, say) when the folder lacks its config or weights (one file or
    shards); reads neither."""
    _config_path(folder)
    weights_files(folder)


def read_config(folder) -> dict[str, Any]:
    """The parsed config.json of a checkpoint folder, checked for format; CheckpointError otherwise."""
    path = _config_path(folder)
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


def load_model(folder, device="cpu", weights: str = "float32"):
    """Rebuild the model saved in `folder` (one file or shards, float32 or bfloat16 storage), on `device`, in
    eval mode, with the model's own float32 parameters; `weights="int8"` then quantizes it for decoding,
    "auto" where that decodes faster here (musicrel.model.quantize; `held_weights` says which)."""
    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import MusicTransformer

    check_decode_weights(weights)
    config = read_config(folder)
    try:
        cfg = ModelConfig.from_dict(config["model"])
    except (ConfigError, TypeError) as exc:
        raise CheckpointError(f"{Path(folder) / CONFIG_FILE}: bad model settings: {exc}") from None
    files = weights_files(folder)
    model = MusicTransformer(cfg)
    if (Path(folder) / INDEX_FILE).is_file():
        _load_shards(model, Path(folder), files)
    else:
        _load_single(model, files[0], device)
    from musicrel.model.quantize import hold_weights

    return hold_weights(model.to(device).eval(), weights)


def check_decode_weights(weights) -> str:
    """`weights` if it is one of DECODE_WEIGHTS, else ConfigError `invalid_weights`."""
    if weights not in DECODE_WEIGHTS:
        raise ConfigError(
            f"weights must be one of {', '.join(DECODE_WEIGHTS)}, got {weights!r}", code="invalid_weights"
        )
    return weights


def _load_single(model, weights: Path, device) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_model as load_safetensors

    try:
        # load_state_dict copies into the float32 parameters, which upcasts bfloat16 storage.
        load_safetensors(model, str(weights), strict=True, device=str(device))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{weights} is not a readable safetensors file ({exc})") from None
    except RuntimeError as exc:  # missing/unexpected tensors or shape mismatch against config.json
        first = str(exc).strip().splitlines()
        raise CheckpointError(
            f"{weights} does not match {CONFIG_FILE}: {' '.join(line.strip() for line in first)[:500]}"
        ) from None


def _load_shards(model, folder: Path, files: list[Path]) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    index = folder / INDEX_FILE
    weight_map = _read_index(index)
    state = {}
    for path in files:
        try:
            part = load_file(str(path), device="cpu")
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{path} is not a readable safetensors file ({exc})") from None
        listed = {k for k, v in weight_map.items() if v == path.name}
        if set(part) != listed:
            odd = sorted(set(part) ^ listed)[:3]
            raise CheckpointError(f"{path.name} does not hold the tensors {INDEX_FILE} lists for it ({odd})")
        state.update(part)
    # Tied weights are stored once; the model's other names for the same storage load with it.
    shared: dict[int, list[str]] = {}
    for name, t in model.state_dict().items():
        shared.setdefault(t.data_ptr(), []).append(name)
    covered = {n for names in shared.values() if any(x in state for x in names) for n in names}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shape mismatch against config.json
        first = " ".join(line.strip() for line in str(exc).strip().splitlines())
        raise CheckpointError(f"{index} does not match {CONFIG_FILE}: {first[:500]}") from None
    missing = [k for k in missing if k not in covered]
    if missing or unexpected:
        raise CheckpointError(
            f"{index} does not match {CONFIG_FILE}: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )


def load_codec(folder):
    """The EventCodec the model in `folder` was trained with (defaults when the folder stored none)."""
    from musicrel.midi.codec import CodecConfig, EventCodec

    config = read_config(folder)
    if "codec" not in config:
        return EventCodec()
    try:
        return EventCodec(CodecConfig.from_dict(config["codec"]))
    except (ConfigError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{Path(folder) / CONFIG_FILE}: bad codec settings: {exc}") from None
