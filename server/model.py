"""The engine's one door to a checkpoint: `LoadedModel.load` loads it once (model, codec, under the thread
policy's loading rule) and describes it (`ModelCard`: what /v1/model says of it, the longest primer it reads,
whether it accompanies melodies). The generation engine holds the LoadedModels; the HTTP process keeps only
their cards and codecs (`describe`), so nothing else in `server/` touches torch or a model's internals.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from musicrel.midi.codec import EventCodec
    from musicrel.model.transformer import MusicTransformer

CARD_FILE = "MODEL_CARD.md"


@dataclass(frozen=True)
class ModelCard:
    """A checkpoint's description (picklable: it crosses to the HTTP process)."""

    info: dict[str, Any]  # checkpoint, sha256, parameters, vocab_size, model, codec, card
    max_primer_tokens: int  # the longest primer the model reads (its window less room to continue)
    accompanies: bool  # its codec has melody tokens: an accompaniment model

    @property
    def vocab_size(self) -> int:
        return int(self.info["vocab_size"])


@dataclass
class LoadedModel:
    model: MusicTransformer
    codec: EventCodec
    card: ModelCard

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu") -> LoadedModel:
        """Load the checkpoint in `folder` (CheckpointError when it holds none) in eval mode on `device`."""
        from musicrel.generation.primer import default_max_primer_tokens
        from musicrel.model.checkpoint import load_codec, load_model, weights_sha256
        from musicrel.threads import loading_threads

        loading_threads()  # only a decoding thread runs a team of threads
        folder = Path(folder)
        model = load_model(folder, device=device).eval()
        codec = load_codec(folder)
        card = folder / CARD_FILE
        info = {
            "checkpoint": str(folder),
            "sha256": weights_sha256(folder),
            "parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": codec.vocab_size,
            "model": model.cfg.to_dict(),
            "codec": codec.config.to_dict(),
            "card": card.read_text(errors="replace") if card.is_file() else None,
        }
        accompanies = codec.melody_on_offset is not None
        return cls(model, codec, ModelCard(info, default_max_primer_tokens(model), accompanies))


def describe(folder: str | Path) -> tuple[ModelCard, EventCodec]:
    """The card and codec of the checkpoint in `folder`, for a process that holds no weights: loaded on the
    CPU, described, and let go."""
    loaded = LoadedModel.load(folder, device="cpu")
    return loaded.card, loaded.codec


def has_checkpoint(folder: str | Path) -> bool:
    return (Path(folder) / "config.json").is_file()


def load_accompanist(folder: str | Path, device: str = "cpu") -> LoadedModel | None:
    """The accompaniment model in `folder`, or None when there is none there or it has no melody tokens (the
    HTTP process says why: `describe_accompanist`)."""
    if not has_checkpoint(folder):
        return None
    loaded = LoadedModel.load(folder, device=device)
    return loaded if loaded.card.accompanies else None


def describe_accompanist(folder: str | Path) -> tuple[ModelCard | None, EventCodec | None, str]:
    """(card, codec, "") of the accompaniment model in `folder`, or (None, None, why there is none)."""
    folder = Path(folder)
    if not has_checkpoint(folder):
        return None, None, f"no accompaniment model on this server ({folder} holds no checkpoint)"
    card, codec = describe(folder)
    if not card.accompanies:
        return None, None, f"{folder} is not an accompaniment model (its codec has no melody tokens)"
    return card, codec, ""
