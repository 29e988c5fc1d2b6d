"""musicrel: a Music Transformer with memory-efficient relative attention.

Public names are imported lazily so that `musicrel --help` and the codec do not pay for importing torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "MusicrelError": "musicrel.errors",
    "InvalidMidiError": "musicrel.errors",
    "ConfigError": "musicrel.errors",
    "CheckpointError": "musicrel.errors",
    "GenerationError": "musicrel.errors",
    "InfillError": "musicrel.errors",
    "EventCodec": "musicrel.midi.codec",
    "CodecConfig": "musicrel.midi.codec",
    "ModelConfig": "musicrel.model.config",
    "MusicTransformer": "musicrel.model.transformer",
    "save_model": "musicrel.model.checkpoint",
    "load_model": "musicrel.model.checkpoint",
    "load_codec": "musicrel.model.checkpoint",
    "continue_midi": "musicrel.generation.continuation",
    "accompany_midi": "musicrel.generation.accompaniment",
    "AccompanimentParams": "musicrel.generation.melody",
    "infill_midi": "musicrel.generation.infill",
    "InfillParams": "musicrel.generation.infill",
    "Controls": "musicrel.generation.controls",
    "ControlError": "musicrel.generation.controls",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'musicrel' has no attribute {name!r}")
