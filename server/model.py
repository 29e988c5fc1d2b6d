"""The engine's one door to a checkpoint. `LoadedModel.load` loads it once, under the thread policy's loading
rule, and describes it (`ModelCard`: what /v1/model says of it); the engine holds the LoadedModels and sends
their cards to the HTTP process when it is ready. The HTTP process never loads weights: `CheckpointView.read`
gives it what it needs to parse uploads and check forms (the codec, the longest primer the model reads,
whether it accompanies melodies, whether it fills spans) from the checkpoint's config alone, without torch.
Nothing else in `server/` touches torch or a model's internals.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from musicrel.model.weights import DEFAULT_DECODE_WEIGHTS

if TYPE_CHECKING:
    from musicrel.midi.codec import EventCodec
    from musicrel.model.transformer import MusicTransformer

log = logging.getLogger("musicrel.server")

CARD_FILE = "MODEL_CARD.md"
DEFAULT_INFILL_CHECKPOINT = Path("checkpoints/infill")  # the infill model when the continuation's cannot fill


def has_checkpoint(folder: str | Path) -> bool:
    return (Path(folder) / "config.json").is_file()


@dataclass(frozen=True)
class CheckpointView:
    """A checkpoint as the HTTP process sees it: read from its config, no weights, no torch."""

    folder: Path
    codec: EventCodec
    max_primer_tokens: int  # the longest primer the model reads (its window less room to continue)
    accompanies: bool  # its codec has melody tokens or instruments: it can accompany a melody
    infills: bool = False  # its codec has infill tokens and its model reads them: an infill model

    @property
    def instruments(self) -> bool:
        """Its codec has instruments: it hears and writes every track, drums too."""
        return self.codec.instrument_offset is not None

    @classmethod
    def read(cls, folder: str | Path) -> CheckpointView:
        """CheckpointError when `folder` holds no readable checkpoint config."""
        from musicrel.generation.primer import max_primer_tokens
        from musicrel.model.checkpoint import load_codec, read_config
        from musicrel.model.config import ModelConfig

        folder = Path(folder)
        codec = load_codec(folder)
        config = ModelConfig.from_dict(read_config(folder)["model"])
        window = config.max_seq_len
        # generation.infill.check_model's rule, from the config alone
        infills = codec.fill_id is not None and config.vocab_size >= codec.vocab_size
        # generation.accompaniment's two ways: melody tokens, or the melody track's notes placed (instruments)
        accompanies = codec.melody_on_offset is not None or codec.instrument_offset is not None
        return cls(folder, codec, max_primer_tokens(window), accompanies, infills)


def _view(folder: str | Path, what: str, can: str, lacks: str) -> tuple[CheckpointView | None, str]:
    """The `what` checkpoint in `folder` (one whose view says `can`), or None and why the server has none."""
    if not has_checkpoint(folder):
        return None, f"no {what} model on this server ({folder} holds no checkpoint)"
    view = CheckpointView.read(folder)
    if not getattr(view, can):
        return None, f"{folder} is not an {what} model ({lacks})"
    return view, ""


def view_accompanist(folder: str | Path) -> tuple[CheckpointView | None, str]:
    """The accompaniment checkpoint in `folder`, or None and why the server has none."""
    return _view(folder, "accompaniment", "accompanies", "its codec has no melody tokens nor instruments")


def view_infiller(folder: str | Path) -> tuple[CheckpointView | None, str]:
    """The infill checkpoint in `folder`, or None and why the server has none."""
    return _view(folder, "infill", "infills", "its model has no infill tokens")


def view_instruments(folder: str | Path, continuation: CheckpointView) -> tuple[CheckpointView | None, str]:
    """The instruments model in `folder`, which serves the uploads the `continuation` model would flatten
    into one piano stream (`musicrel.midi.instruments.wants_instruments`), or None and why the server has
    none: also when the continuation model hears every instrument itself."""
    if continuation.instruments:
        return None, f"the continuation model ({continuation.folder}) hears every instrument itself"
    return _view(folder, "instruments", "instruments", "its codec has no instruments")


def infill_folder(chosen: str | Path | None, checkpoint: str | Path) -> Path:
    """Where the infill model is: `chosen` (MUSICREL_INFILL_CHECKPOINT) when set; else the continuation
    `checkpoint` when it fills gaps itself (a model with instruments and infill tokens serves a band's fills
    as it serves its continuations, where the piano infill model would hear one piano); else
    DEFAULT_INFILL_CHECKPOINT."""
    if chosen is not None:
        return Path(chosen)
    if has_checkpoint(checkpoint) and CheckpointView.read(checkpoint).infills:
        return Path(checkpoint)
    return DEFAULT_INFILL_CHECKPOINT


@dataclass(frozen=True)
class ModelCard:
    """What /v1/model says of a loaded model, and its card (picklable: the engine sends it to the HTTP
    process)."""

    info: dict[str, Any]  # checkpoint, sha256, parameters, vocab_size, model, codec
    text: str | None = None  # MODEL_CARD.md, served at a URL of its own (routes/model.py); None: none


@dataclass
class LoadedModel:
    model: MusicTransformer
    codec: EventCodec
    card: ModelCard

    @classmethod
    def load(
        cls, folder: str | Path, device: str = "cpu", weights: str = DEFAULT_DECODE_WEIGHTS
    ) -> LoadedModel:
        """Load the checkpoint in `folder` (CheckpointError when it holds none) in eval mode on `device`, its
        weights held as `weights` (musicrel.model.quantize)."""
        from musicrel.model.checkpoint import load_codec, load_model, weights_sha256
        from musicrel.model.quantize import held_weights
        from musicrel.runtime.threads import loading_threads

        loading_threads()  # only a decoding thread runs a team of threads
        folder = Path(folder)
        model = load_model(folder, device=device, weights=weights)
        codec = load_codec(folder)
        card = folder / CARD_FILE
        info = {
            "checkpoint": str(folder),
            "sha256": weights_sha256(folder),
            "parameters": model.num_parameters(),
            "weights": held_weights(model),  # bfloat16 on a GPU
            "vocab_size": codec.vocab_size,
            "model": model.cfg.to_dict(),
            "codec": codec.config.to_dict(),
        }
        log.info("loaded %s: %d parameters, sha256 %s", folder, info["parameters"], info["sha256"][:12])
        text = card.read_text(errors="replace") if card.is_file() else None
        return cls(model, codec, ModelCard(info, text))


def load_accompanist(
    folder: str | Path, device: str = "cpu", weights: str = DEFAULT_DECODE_WEIGHTS
) -> LoadedModel | None:
    """The accompaniment model in `folder`, or None when there is none there or it has no melody tokens
    (`view_accompanist` says why)."""
    view, _ = view_accompanist(folder)
    return None if view is None else LoadedModel.load(folder, device=device, weights=weights)


def load_instrumentalist(
    folder: str | Path, continuation: str | Path, weights: str = DEFAULT_DECODE_WEIGHTS
) -> LoadedModel | None:
    """The instruments model in `folder` beside the `continuation` checkpoint, or None where the server has
    none (`view_instruments` says why)."""
    view, _ = view_instruments(folder, CheckpointView.read(continuation))
    return None if view is None else LoadedModel.load(folder, weights=weights)


def load_infiller(
    folder: str | Path, device: str = "cpu", weights: str = DEFAULT_DECODE_WEIGHTS
) -> LoadedModel | None:
    """The infill model in `folder`, or None when there is none there or it has no infill tokens
    (`view_infiller` says why)."""
    view, _ = view_infiller(folder)
    return None if view is None else LoadedModel.load(folder, device=device, weights=weights)
