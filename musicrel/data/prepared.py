"""A prepared data folder, the one reader of its format (training/prepare.py writes it):

    manifest.json             what was prepared: codec, sources, splits and their files (FORMAT_VERSION)
    {split}.npy               uint16, the split's pieces as one token stream: [bos] piece [eos] [bos] ...
    {split}_offsets.npy       int64 [n_pieces + 1]: where each piece's bos starts (last = stream length)

Training, the n-gram baseline and the evaluation read it here, never by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from musicrel.errors import ConfigError

SPLITS = ("train", "val", "test")
MANIFEST = "manifest.json"
FORMAT_VERSION = 2


def is_prepared(folder) -> bool:
    """Whether `folder` is a prepared data folder (it has a manifest)."""
    return (Path(folder) / MANIFEST).is_file()


def has_split(folder, split: str) -> bool:
    """Whether the prepared folder holds `split`'s token stream."""
    return is_prepared(folder) and split in SPLITS and (Path(folder) / f"{split}.npy").is_file()


def load_manifest(data_dir) -> dict:
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        raise ConfigError(
            f"{data_dir} is not a prepared data folder (no {MANIFEST}); run `musicrel prepare`",
            code="not_prepared",
        )
    return json.loads(path.read_text())


def source_ranges(manifest: dict, split: str) -> dict[str, tuple[int, int]]:
    """Where each source with tokens lies in a split's stream ([start, end)); {} when the split has fewer
    than two such sources (a single-source or format-1 folder: the stream is one part)."""
    ranges = {
        name: (r["start"], r["end"])
        for name, r in manifest["splits"][split].get("sources", {}).items()
        if r["end"] - r["start"] >= 2
    }
    return ranges if len(ranges) > 1 else {}


def crop_weights(manifest: dict, given: dict[str, float] | None = None) -> dict[str, float]:
    """Each source's weight in the crops drawn from a folder: the one it was prepared with (`prepare
    --weight`), or, by name, `given`'s (a training run's own mix, with no re-prepare). Refused: a name the
    folder has no source of, a weight < 0, or none > 0."""
    names = [s["name"] for s in manifest.get("sources", [])]
    weights = {n: float(manifest.get("weights", {}).get(n, 1.0)) for n in names}
    given = {k: float(v) for k, v in (given or {}).items()}
    if not names and not given:
        return {}  # a folder prepared before sources had names: its stream is one part
    if unknown := sorted(set(given) - set(names)):
        raise ConfigError(f"weights for unknown sources {unknown} (sources: {names})", code="bad_sources")
    return check_weights({**weights, **given})


def check_weights(weights: dict[str, float]) -> dict[str, float]:
    """`weights` when each is >= 0 and one is > 0 (a mix that draws something), else a ConfigError."""
    if any(not w >= 0 for w in weights.values()) or not any(w > 0 for w in weights.values()):
        raise ConfigError(f"weights must be >= 0 and one > 0, got {weights}", code="bad_sources")
    return weights


def load_split(data_dir, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(stream, offsets) of a split, memory-mapped."""
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
    data_dir = Path(data_dir)
    load_manifest(data_dir)
    stream = np.load(data_dir / f"{split}.npy", mmap_mode="r")
    offsets = np.load(data_dir / f"{split}_offsets.npy")
    return stream, offsets
