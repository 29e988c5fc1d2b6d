"""`CodecConfig`: the codec's settings, saved with every checkpoint and prepared folder (`musicrel.midi.codec`
reads them; the vocabulary each setting adds is described there)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

import numpy as np

from musicrel.errors import ConfigError


@dataclass
class CodecConfig:
    """Codec settings; saved with every checkpoint, so `from_dict(to_dict())` is exact."""

    step_ms: int = 10  # TIME_SHIFT resolution
    max_shift_steps: int = 100  # longest single shift (1 s)
    velocity_bins: int = 32
    pedal: str = "extend"  # "extend" | "events"
    tracks: str | list[int] = "merge"  # "merge" | [instrument index, ...]
    # MELODY_ON/MELODY_OFF tokens: a given melody, interleaved with the part the model writes (accompaniment)
    melody: bool = False
    # the melody's tokens sit this far ahead of when they sound (anticipation: the part hears it coming)
    melody_lead_ms: int = 0
    # FUTURE/PAST/FILL markers after eos: the model fills a gap between the music before and after it
    # (musicrel.generation.fim); encoding is unchanged, so a folder prepared without them trains with them
    infill: bool = False
    # an INSTRUMENT token (a General MIDI program, or drums) before a note event whose instrument differs from
    # the previous note event's; the ids come after every other, so a piano checkpoint's rows keep theirs
    instruments: bool = False
    # caps on hostile uploads, enforced by the pre-scan before any parser runs
    max_bytes: int = 4 * 1024 * 1024
    max_tracks: int = 256
    max_events: int = 2_000_000
    max_ticks: int = 4_000_000  # pretty_midi allocates ~24 bytes per tick while parsing
    max_seconds: float = 3600.0

    def __post_init__(self):
        ranges = {
            "step_ms": (1, 1000),
            "max_shift_steps": (1, 10_000),
            "melody_lead_ms": (0, 60_000),
            "velocity_bins": (1, 128),
            "max_bytes": (14, 1 << 31),
            "max_tracks": (1, 65535),
            "max_events": (1, 1 << 31),
            "max_ticks": (1, 1 << 40),
        }
        for name, (lo, hi) in ranges.items():
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not lo <= value <= hi:
                raise ConfigError(f"CodecConfig.{name} must be an integer in [{lo}, {hi}], got {value!r}")
            setattr(self, name, int(value))
        if (
            not isinstance(self.max_seconds, (int, float))
            or isinstance(self.max_seconds, bool)
            or not 0 < self.max_seconds < math.inf
        ):
            raise ConfigError(f"CodecConfig.max_seconds must be a positive number, got {self.max_seconds!r}")
        self.max_seconds = float(self.max_seconds)
        if self.pedal not in ("extend", "events"):
            raise ConfigError(f"CodecConfig.pedal must be 'extend' or 'events', got {self.pedal!r}")
        if isinstance(self.tracks, (list, tuple)):
            if not self.tracks or not all(
                isinstance(i, (int, np.integer)) and not isinstance(i, bool) and i >= 0 for i in self.tracks
            ):
                raise ConfigError(
                    f"CodecConfig.tracks must be 'merge' or a non-empty list of instrument indices >= 0, "
                    f"got {self.tracks!r}"
                )
            self.tracks = [int(i) for i in self.tracks]
        elif self.tracks != "merge":
            raise ConfigError(f"CodecConfig.tracks must be 'merge' or a list of indices, got {self.tracks!r}")
        if not isinstance(self.melody, bool):
            raise ConfigError(f"CodecConfig.melody must be true or false, got {self.melody!r}")
        if not isinstance(self.infill, bool):
            raise ConfigError(f"CodecConfig.infill must be true or false, got {self.infill!r}")
        if not isinstance(self.instruments, bool):
            raise ConfigError(f"CodecConfig.instruments must be true or false, got {self.instruments!r}")
        if self.melody and self.instruments:
            raise ConfigError(
                "CodecConfig.melody and CodecConfig.instruments cannot be combined yet: a melody's part is "
                "one stream without instruments"
            )
        if self.melody and not (isinstance(self.tracks, list) and len(self.tracks) >= 2):
            raise ConfigError(
                "CodecConfig.melody reads the melody from the first of `tracks` and its part from the "
                f"others: tracks must list at least two instruments, got {self.tracks!r}"
            )

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        # Without instruments the dict is the one written before the field existed, so the codec's hash (the
        # token caches of `musicrel prepare`) and every config.json written from it stay byte-for-byte.
        if not self.instruments:
            del d["instruments"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> CodecConfig:
        if not isinstance(d, dict):
            raise ConfigError(f"CodecConfig must be a JSON object, got {type(d).__name__}")
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(f"CodecConfig has no field(s) {', '.join(unknown)}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> CodecConfig:
        try:
            d = json.loads(s)
        except (json.JSONDecodeError, TypeError) as exc:
            raise ConfigError(f"CodecConfig JSON is malformed: {exc}") from None
        return cls.from_dict(d)
