"""Typed errors. Every error a user can cause carries a stable short `code` and a one-line message;
the CLI prints it, the service maps it to JSON `{"error": {"code", "message"}}`."""

from __future__ import annotations

import math
import numbers


class MusicrelError(Exception):
    """Base of every error musicrel raises on purpose."""

    code: str = "error"

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)

    def __reduce__(self):
        # Pickle keeps the code (the service's engine process sends errors to the server process).
        return type(self), (str(self), self.code)


class InvalidMidiError(MusicrelError, ValueError):
    """The input is not MIDI we can use (not MIDI, truncated, hostile, or without notes)."""

    code = "invalid_midi"


class ConfigError(MusicrelError, ValueError):
    """A configuration value is out of range; the message names the field."""

    code = "invalid_config"


class CheckpointError(MusicrelError):
    """A checkpoint folder is missing files or does not match its config."""

    code = "invalid_checkpoint"


class GenerationError(MusicrelError, ValueError):
    """Generation settings that cannot be honoured (e.g. a primer longer than the model can read)."""

    code = "invalid_generation"


class InfillError(GenerationError):
    """An infill request that cannot be honoured: its span (invalid_span, span_too_long,
    span_outside_music, nothing_before, nothing_after) or its model (model_cannot_infill)."""

    code = "invalid_span"


# The one strict-number check behind the invalid_params / invalid_controls / ConfigError messages: Python
# counts True as 1, and a setting given as true must be refused, not read as one row or one second.
def is_int(value) -> bool:
    """An integer (numpy's too), never a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A finite real number (an integer or a float, numpy's too), never a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
