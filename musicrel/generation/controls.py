"""Steering a continuation without retraining: `Controls` (instrument, the instruments of a model that has
them, key, chord progression, density, pitch range, polyphony), what each becomes for one row (`RowControls`,
numpy arrays the grammar turns into the rules it applies with its own); the figures that show a control held
are the evaluation's (`musicrel.evaluation.control_evidence`).

A control is a rule of the same kind as the grammar's: a bias or a mask on the logits of one row, applied by
`generation.grammar.Grammar.constrain` (still the one place where logits change). Pitch controls (key, chords,
range) move probability between note-ons only, so they choose which pitches sound, not how many; density
alone decides how many (a feedback loop on the note-on logits), and the polyphony cap masks new notes while
the row already sounds that many.

No torch at import: the command line and the server's schemas read these at start-up (`DensityLoop`, the
density control's per-row loop, imports it when built). Over 450 lines: parsing, validation and the per-row
rules of the six controls share one vocabulary (scales, chords), read together.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

import numpy as np

from musicrel.errors import GenerationError, is_int, is_number
from musicrel.generation.keys import PITCH_NAMES, find_key, key_label

# "prefer": a logit bias, in nats before temperature, against pitches outside the key (for a key) or toward
# the chord's tones (for chords). 3 nats multiply the odds by 20: a model that already keeps 80 % of its notes
# in the key keeps ~99 %, an untrained one (7 of 12 pitch classes by chance) ~96 %.
PREFER_BIAS = 3.0
STRENGTHS = {"prefer": PREFER_BIAS, "only": math.inf}
MAX_BIAS = 20.0  # a finite strength above this is a mask in all but name: ask for "only"
MAX_DENSITY = 40.0  # notes per second; a dense piano passage plays ~20
MAX_CHORDS = 64
MAX_CHORD_SECONDS = 60.0
DEFAULT_CHORD_BEATS = 4.0  # a chord symbol without a duration lasts one 4/4 bar at the motif's tempo

# Density: a proportional-integral controller on the log of the recent notes per second (decayed over
# DENSITY_WINDOW seconds of music) sets one bias per row (grammar._steer applies it). The estimate starts at
# the target, so the first notes do not swing it; the bias starts at log(target / motif's rate), since a model
# continues the motif's density. A negative bias lowers the note-ons; a positive one lowers waiting (the time
# shifts) against every note event, except while DENSITY_CHORD notes are already being struck at once; either
# way the shifts are tilted, by -DENSITY_SHIFT_TILT x bias nats per second of shift. Measured on the shipped
# model, 16 test motifs x 2, targets 3 and 8 notes/s: a note-on bias alone gave 4.42 and 7.45 (-8 nats on
# note-ons still left 9 notes/s: the gap is chosen at the shift, where a note-on bias cannot reach; and +8
# stacked 20-note clusters, or struck new notes instead of closing old ones, which piled up); with the tilt
# and the other two rules, 3.31 and 8.65, and piano rolls without clusters or walls of held notes.
DENSITY_WINDOW = 4.0  # seconds
DENSITY_KP = 3.0  # nats per unit of log-rate error
DENSITY_KI = 2.0  # nats per (unit of log-rate error x second)
DENSITY_MAX_BIAS = 8.0
DENSITY_CHORD = 3  # notes struck at one instant, beyond which density asks for no more
DENSITY_SHIFT_TILT = 1.5  # time-shift logits: nats per second of shift, per nat of density bias

PITCH_CLASSES = {"C": 0, "D": 2, "E": 4, "F": 5, "G": 7, "A": 9, "B": 11}
SCALES = {
    "major": (0, 2, 4, 5, 7, 9, 11),
    "minor": (0, 2, 3, 5, 7, 8, 10),  # natural minor, what key detection calls "minor"
    "harmonic-minor": (0, 2, 3, 5, 7, 8, 11),
    "dorian": (0, 2, 3, 5, 7, 9, 10),
    "phrygian": (0, 1, 3, 5, 7, 8, 10),
    "lydian": (0, 2, 4, 6, 7, 9, 11),
    "mixolydian": (0, 2, 4, 5, 7, 9, 10),
    "locrian": (0, 1, 3, 5, 6, 8, 10),
    "major-pentatonic": (0, 2, 4, 7, 9),
    "minor-pentatonic": (0, 3, 5, 7, 10),
    "blues": (0, 3, 5, 6, 7, 10),
}
CHORD_QUALITIES = {
    "": (0, 4, 7),
    "maj": (0, 4, 7),
    "M": (0, 4, 7),
    "m": (0, 3, 7),
    "min": (0, 3, 7),
    "-": (0, 3, 7),
    "7": (0, 4, 7, 10),
    "maj7": (0, 4, 7, 11),
    "M7": (0, 4, 7, 11),
    "m7": (0, 3, 7, 10),
    "min7": (0, 3, 7, 10),
    "dim": (0, 3, 6),
    "dim7": (0, 3, 6, 9),
    "m7b5": (0, 3, 6, 10),
    "aug": (0, 4, 8),
    "+": (0, 4, 8),
    "sus2": (0, 2, 7),
    "sus4": (0, 5, 7),
    "sus": (0, 5, 7),
    "6": (0, 4, 7, 9),
    "m6": (0, 3, 7, 9),
}
_NOTE = re.compile(r"([A-Ga-g])([#b]?)$")
_CHORD = re.compile(r"([A-G])([#b]?)([^:]*)$")
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(b?)$")


class ControlError(GenerationError):
    """A control that cannot be honoured; the code says which kind (unknown_chord, unknown_key, empty_range,
    invalid_controls)."""

    code = "invalid_controls"


def _pitch_class(name: str, what: str, code: str) -> int:
    m = _NOTE.match(name)
    if not m:
        raise ControlError(f"{what}: {name!r} is not a note name (C, F#, Bb, ...)", code=code)
    return (PITCH_CLASSES[m.group(1).upper()] + {"#": 1, "b": -1, "": 0}[m.group(2)]) % 12


def parse_key(text: str) -> tuple[int, str]:
    """ "C:major", "F#:minor", "Bb:dorian", "A" (major) -> (tonic pitch class, scale name)."""
    tonic, _, scale = text.strip().partition(":")
    scale = scale.strip().lower() or "major"
    if scale not in SCALES:
        raise ControlError(
            f"key {text!r}: unknown scale {scale!r} (one of {', '.join(SCALES)})", code="unknown_key"
        )
    return _pitch_class(tonic.strip(), f"key {text!r}", "unknown_key"), scale


def scale_pitch_classes(key: tuple[int, str]) -> frozenset[int]:
    tonic, scale = key
    return frozenset((tonic + step) % 12 for step in SCALES[scale])


@dataclass(frozen=True)
class Chord:
    symbol: str
    pitch_classes: frozenset[int]
    duration: float
    beats: bool  # duration in beats at the motif's tempo, else seconds


def parse_chord(symbol: str) -> frozenset[int]:
    """Pitch classes of a chord symbol: root (C, F#, Bb) and quality (maj, m, 7, maj7, m7, dim, dim7, m7b5,
    aug, sus2, sus4, 6, m6, ...); an optional bass note after "/" is added (C/E)."""
    head, _, bass = symbol.partition("/")
    m = _CHORD.match(head)
    if not m or m.group(3) not in CHORD_QUALITIES:
        raise ControlError(
            f"unknown chord symbol {symbol!r} (root A-G with # or b, then one of "
            f"{', '.join(q or 'major' for q in CHORD_QUALITIES)})",
            code="unknown_chord",
        )
    root = _pitch_class(m.group(1) + m.group(2), f"chord {symbol!r}", "unknown_chord")
    tones = {(root + i) % 12 for i in CHORD_QUALITIES[m.group(3)]}
    if bass:
        tones.add(_pitch_class(bass, f"chord {symbol!r}", "unknown_chord"))
    return frozenset(tones)


def parse_chords(text: str) -> list[Chord]:
    """ "C:2 G:2 Am:2 F:2" (seconds) or "C:4b G:4b" (beats at the motif's tempo); a chord without a duration
    lasts DEFAULT_CHORD_BEATS beats. Separated by spaces, commas or bars."""
    chords = []
    for item in re.split(r"[\s,|]+", text.strip()):
        if not item:
            continue
        symbol, sep, duration = item.partition(":")
        tones = parse_chord(symbol)
        if not sep:
            chords.append(Chord(symbol, tones, DEFAULT_CHORD_BEATS, True))
            continue
        m = _DURATION.match(duration)
        value = float(m.group(1)) if m else math.nan
        if not m or not 0 < value <= MAX_CHORD_SECONDS:
            raise ControlError(
                f"chord {item!r}: the duration must be seconds (C:2) or beats (C:4b), > 0 and at most "
                f"{MAX_CHORD_SECONDS:g}",
                code="invalid_controls",
            )
        chords.append(Chord(symbol, tones, value, m.group(2) == "b"))
    if not chords:
        raise ControlError("chords: no chord symbols given", code="unknown_chord")
    if len(chords) > MAX_CHORDS:
        raise ControlError(f"chords: at most {MAX_CHORDS} chords, got {len(chords)}", code="invalid_controls")
    return chords


def strength_bias(value, name: str) -> float:
    """ "prefer" -> PREFER_BIAS, "only" -> a mask (inf), or a bias in nats in [0, MAX_BIAS]."""
    if isinstance(value, str):
        if value.strip().lower() in STRENGTHS:
            return STRENGTHS[value.strip().lower()]
        try:
            value = float(value)
        except ValueError:
            raise ControlError(
                f"{name} must be 'prefer', 'only' or a number of nats, got {value!r}", code="invalid_controls"
            ) from None
    if not is_number(value) or not 0 <= value <= MAX_BIAS:
        raise ControlError(
            f"{name} must be 'prefer', 'only' or a number in [0, {MAX_BIAS:g}], got {value!r}",
            code="invalid_controls",
        )
    return float(value)


def gm_program_name(program: int) -> str:
    import pretty_midi

    return pretty_midi.program_to_instrument_name(int(program))


def gm_program_names() -> list[str]:
    """The 128 General MIDI instrument names, by program (for a menu)."""
    return [gm_program_name(p) for p in range(128)]


INSTRUMENT_CHOICES = ("motif", "any")  # the instruments control's words; else a list of instruments
DRUM_WORDS = ("drums", "drum", "percussion")  # how a list of instruments names the drums


def parse_instruments(value) -> str:
    """The instruments control, canonical: "motif" (the default: the instruments of the upload's tracks read,
    whether or not they play in the primer's window, so a Lied's voice may come in after the piano's
    introduction; without tracks, those the primer plays), "any" (the model may bring in others) or a comma
    list of instruments, each a General MIDI program (0..127 or its name) or "drums": "40,42,drums" (sorted,
    each once)."""
    from musicrel.midi.instruments import DRUMS

    if not isinstance(value, str) or not value.strip():
        raise ControlError(
            f"instruments must be 'motif', 'any' or a list such as 'Violin, Cello, drums', got {value!r}",
            code="invalid_controls",
        )
    word = value.strip().lower()
    if word in INSTRUMENT_CHOICES:
        return word
    chosen = set()
    for part in value.split(","):
        part = part.strip()
        if part.lower() in DRUM_WORDS:
            chosen.add(DRUMS)
        else:
            try:
                chosen.add(parse_program(part))
            except ControlError:
                raise ControlError(
                    f"instruments: {part!r} is not a General MIDI instrument (a name or 0-127), nor 'drums'",
                    code="invalid_controls",
                ) from None
    return ",".join("drums" if i == DRUMS else str(i) for i in sorted(chosen))


def instrument_numbers(canonical: str) -> list[int]:
    """The instrument indices (programs, DRUMS) of a canonical list (`parse_instruments`)."""
    from musicrel.midi.instruments import DRUMS

    return [DRUMS if part == "drums" else int(part) for part in canonical.split(",")]


def parse_program(value) -> int:
    """A General MIDI program: 0..127 or its name ("Acoustic Grand Piano", case and spaces ignored)."""
    if isinstance(value, str) and not value.strip().isdigit():
        import pretty_midi

        try:
            return int(pretty_midi.instrument_name_to_program(value.strip()))
        except ValueError:
            raise ControlError(
                f"program: {value!r} is not a General MIDI instrument name or number 0-127",
                code="invalid_controls",
            ) from None
    if isinstance(value, str):
        value = int(value)
    if not is_int(value) or not 0 <= value <= 127:
        raise ControlError(
            f"program must be a General MIDI program 0-127, got {value!r}", code="invalid_controls"
        )
    return int(value)


@dataclass(frozen=True)
class Controls:
    """How to steer one continuation; every field None (the default) leaves that aspect to the model.
    Validated on construction (ControlError with a stable code); `to_dict`/`from_dict` round-trip as JSON."""

    program: int | None = None  # General MIDI program of the output; None: the motif's
    key: str | None = None  # "C:major", "A:minor", "Bb:dorian", or "auto" (detected from the motif)
    key_strength: str | float = "prefer"  # "prefer", "only" (a mask) or a bias in nats
    chords: str | None = None  # "C:2 G:2 Am:2 F:2" (seconds) or "C:4b G:4b" (beats), repeated
    chord_strength: str | float = "prefer"
    density: float | None = None  # target notes per second
    low_note: int | None = None  # lowest MIDI pitch a new note may have
    high_note: int | None = None  # highest
    max_polyphony: int | None = None  # most notes sounding at once (new notes wait while that many sound)
    # a model with instruments: which may play (`parse_instruments`); None is "motif"; a list, for a piano
    # model, is refused
    instruments: str | None = None

    def __post_init__(self) -> None:
        if self.program is not None:
            object.__setattr__(self, "program", parse_program(self.program))
        if self.instruments is not None:
            object.__setattr__(self, "instruments", parse_instruments(self.instruments))
        if self.key is not None:
            if not isinstance(self.key, str):
                raise ControlError(f"key must be text such as 'C:major' or 'auto', got {self.key!r}")
            key = self.key.strip()
            object.__setattr__(self, "key", "auto" if key.lower() == "auto" else key_label(parse_key(key)))
        strength = strength_bias(self.key_strength, "key_strength")
        object.__setattr__(self, "key_strength", self._strength_value(self.key_strength, strength))
        if self.chords is not None:
            if not isinstance(self.chords, str):
                raise ControlError(f"chords must be text such as 'C:2 G:2', got {self.chords!r}")
            parse_chords(self.chords)
            object.__setattr__(self, "chords", " ".join(self.chords.split()))
        strength = strength_bias(self.chord_strength, "chord_strength")
        object.__setattr__(self, "chord_strength", self._strength_value(self.chord_strength, strength))
        if self.density is not None:
            d = self.density
            if not is_number(d) or not 0 < d <= MAX_DENSITY:
                raise ControlError(f"density must be notes per second in (0, {MAX_DENSITY:g}], got {d!r}")
            object.__setattr__(self, "density", float(d))
        for name in ("low_note", "high_note"):
            v = getattr(self, name)
            if v is not None and (not is_int(v) or not 0 <= v <= 127):
                raise ControlError(f"{name} must be a MIDI pitch 0-127, got {v!r}")
            if v is not None:
                object.__setattr__(self, name, int(v))
        if self.low_note is not None and self.high_note is not None and self.low_note > self.high_note:
            raise ControlError(
                f"empty pitch range: low_note {self.low_note} is above high_note {self.high_note}",
                code="empty_range",
            )
        p = self.max_polyphony
        if p is not None:
            if not is_int(p) or not 1 <= p <= 128:
                raise ControlError(f"max_polyphony must be an integer in 1-128, got {p!r}")
            object.__setattr__(self, "max_polyphony", int(p))
        if self.key not in (None, "auto") and math.isinf(strength_bias(self.key_strength, "key_strength")):
            _check_range_meets_key(self, parse_key(self.key))

    @staticmethod
    def _strength_value(given, bias: float) -> str | float:
        # Names stay names (JSON-safe: "only" is an infinite bias); numbers become floats.
        return (
            given.strip().lower() if isinstance(given, str) and given.strip().lower() in STRENGTHS else bias
        )

    @property
    def is_empty(self) -> bool:
        """No control set (strengths alone steer nothing)."""
        steering = (
            "program", "key", "chords", "density", "low_note", "high_note", "max_polyphony", "instruments",
        )  # fmt: skip
        return all(getattr(self, name) is None for name in steering)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Controls:
        if not isinstance(d, dict):
            raise ControlError(f"controls must be a JSON object, got {type(d).__name__}")
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ControlError(f"controls have no field(s) {', '.join(unknown)}")
        return cls(**d)

    def resolve(self, primer, step_ms: float) -> RowControls:
        """What these controls are for one row continuing `primer`: the key detected from the motif when
        "auto", chord durations in beats at the motif's tempo, everything in the codec's time steps."""

        pitch_bias = np.zeros(128, dtype=np.float32)
        applied: dict = {}
        warnings: list[str] = []
        if self.program is not None:
            applied["program"] = self.program
            applied["instrument"] = gm_program_name(self.program)
        key = None
        if self.key is not None:
            found = find_key(_pitched(primer)) if self.key == "auto" else parse_key(self.key)
            if found is None:
                raise ControlError(
                    "key 'auto': the notes it reads (the motif, the melody, the music around the span) give "
                    "no key to detect",
                    code="unknown_key",
                )
            key = found
            bias = strength_bias(self.key_strength, "key_strength")
            outside = np.array([p % 12 not in scale_pitch_classes(key) for p in range(128)])
            pitch_bias[outside] = -bias
            applied.update(key=key_label(key), key_strength=self.key_strength)
            if self.key == "auto":
                applied["key_detected"] = True
        if self.low_note is not None or self.high_note is not None:
            low, high = self.low_note or 0, 127 if self.high_note is None else self.high_note
            pitch_bias[:low] = -np.inf
            pitch_bias[high + 1 :] = -np.inf
            applied.update(low_note=low, high_note=high)
        if not np.isfinite(pitch_bias).any():
            raise ControlError(
                f"empty pitch range: no note of {key_label(key)} lies in {self.low_note}-{self.high_note}",
                code="empty_range",
            )
        step_s = step_ms / 1000.0
        chord_ends = np.zeros(0, dtype=np.int64)
        chord_bias = np.zeros((0, 128), dtype=np.float32)
        if self.chords is not None:
            chords = parse_chords(self.chords)
            beat = 60.0 / primer.tempo
            seconds = [c.duration * (beat if c.beats else 1.0) for c in chords]
            steps = [max(1, round(s / step_s)) for s in seconds]
            chord_ends = np.cumsum(steps).astype(np.int64)
            bias = strength_bias(self.chord_strength, "chord_strength")
            pcs = np.arange(128) % 12
            chord_bias = np.stack(
                [np.where(np.isin(pcs, list(c.pitch_classes)), 0.0, -bias) for c in chords]
            ).astype(np.float32)
            applied.update(
                chords=[
                    {"chord": c.symbol, "seconds": round(n * step_s, 6)}
                    for c, n in zip(chords, steps, strict=True)
                ],
                chord_strength=self.chord_strength,
            )
            if key is not None:
                warnings += chords_outside_key(chords, key)
        start_bias = 0.0
        if self.density is not None:
            ratio = self.density / _motif_rate(primer)  # 0.0 when a denormal density underflows: log's limit
            start_bias = (
                float(np.clip(math.log(ratio), -DENSITY_MAX_BIAS, DENSITY_MAX_BIAS))
                if ratio > 0
                else -DENSITY_MAX_BIAS
            )
            applied["density"] = self.density
        if self.max_polyphony is not None:
            applied["max_polyphony"] = self.max_polyphony
        instruments = None
        if self.instruments not in (None, "motif"):
            from musicrel.midi.instruments import NUM_INSTRUMENTS, instrument_name

            instruments = np.ones(NUM_INSTRUMENTS, dtype=bool)
            if self.instruments != "any":
                instruments[:] = False
                instruments[instrument_numbers(self.instruments)] = True
            applied["instruments"] = (
                "any" if self.instruments == "any"
                else [instrument_name(i) for i in instrument_numbers(self.instruments)]
            )  # fmt: skip
        elif self.instruments == "motif":
            applied["instruments"] = "motif"
        return RowControls(
            pitch_bias=pitch_bias,
            chord_ends=chord_ends,
            chord_bias=chord_bias,
            max_polyphony=128 if self.max_polyphony is None else self.max_polyphony,
            density=math.nan if self.density is None else self.density,
            density_start=start_bias,
            program=self.program,
            applied=applied,
            warnings=warnings,
            instruments=instruments,
            asks_instruments=self.instruments not in (None, *INSTRUMENT_CHOICES),
        )


def chords_outside_key(chords: list[Chord], key: tuple[int, str]) -> list[str]:
    """A warning per chord with tones outside the key's scale: the two controls pull apart (under "only"
    both, such a chord's outside tones cannot sound at all). Allowed, since a borrowed chord is music, but
    said: a typo in the key or the chords otherwise steers in silence."""

    scale, out = scale_pitch_classes(key), []
    for chord in dict.fromkeys(c.symbol for c in chords):  # each symbol once, in order
        outside = sorted(parse_chord(chord) - scale)
        if outside:
            notes = ", ".join(PITCH_NAMES[pc] for pc in outside)
            out.append(f"chord {chord} has {notes} outside the key {key_label(key)}")
    return out


def _check_range_meets_key(controls: Controls, key: tuple[int, str]) -> None:
    low = controls.low_note or 0
    high = 127 if controls.high_note is None else controls.high_note
    if not any(p % 12 in scale_pitch_classes(key) for p in range(low, high + 1)):
        raise ControlError(
            f"empty pitch range: no note of {key_label(key)} lies in {low}-{high}", code="empty_range"
        )


def _pitched(primer) -> list:
    """The motif's notes that have a pitch: a drum note's number names a drum sound (a codec with instruments
    keeps drums; `Primer.motif_instruments` says which notes they are)."""
    instruments = getattr(primer, "motif_instruments", None)
    if instruments is None:
        return primer.motif_notes
    from musicrel.midi.instruments import DRUMS

    return [n for n, i in zip(primer.motif_notes, instruments, strict=True) if i != DRUMS]


def _motif_rate(primer) -> float:
    """Notes per second of the motif's last 10 s (at least 0.5: a sparse motif should not pin the start)."""
    notes = primer.motif_notes or primer.notes
    if not notes:
        return 1.0
    end = max(n.end for n in notes)
    recent = [n for n in notes if n.start >= end - 10.0]
    span = max(1.0, end - min(n.start for n in recent))
    return max(0.5, len(recent) / span)


@dataclass
class RowControls:
    """One row's controls as arrays over the 128 pitches (the grammar makes tensors of them)."""

    pitch_bias: np.ndarray  # (128,) float32: key and range, added to the note-on logits (0, -bias or -inf)
    chord_ends: np.ndarray  # (C,) int64: where each chord ends, in steps from the continuation's start
    chord_bias: np.ndarray  # (C, 128) float32: 0 on the chord's tones, -bias elsewhere
    max_polyphony: int  # 128: no cap
    density: float  # target notes per second; NaN: none
    density_start: float  # the note-on bias the density loop starts from
    program: int | None
    applied: dict  # what was applied, for the output's metadata
    warnings: list[str] = dataclasses.field(default_factory=list)  # controls that pull apart (allowed)
    # (129,) bool: the instruments that may play (a codec with them); None: the motif's (the grammar reads)
    instruments: np.ndarray | None = None
    # the instruments control named instruments: a piano model refuses that ("motif" and "any" are what it
    # does anyway: one stream, the motif's instrument)
    asks_instruments: bool = False


class DensityLoop:
    """The density control's feedback loop, one row per stream: after each token, a bias (nats) from the
    recent notes per second, a proportional-integral loop on the log of the rate; `Grammar._steer` applies it
    (see DENSITY_* above for how, and why).

    The rate is the note count decayed over DENSITY_WINDOW seconds of music, which starts at the target: a
    burst is answered while it lasts, not paid back later by a gap (what a rate since the start did). The
    integral is over music time (notes drawn on one step add error, not integral), clamped. Rows without a
    target keep a zero bias. Torch is imported inside: the module stays importable without it."""

    ROWS = ("on", "log_target", "start", "bias", "integral", "recent")

    def __init__(self, targets: np.ndarray, starts: np.ndarray, device=None):
        """targets (B,): notes per second, NaN for no density control; starts (B,): the first bias."""
        import torch

        targets = np.asarray(targets, dtype=np.float64)
        self.on = torch.as_tensor(~np.isnan(targets), device=device)  # (B,) bool
        self.log_target = torch.as_tensor(
            np.log(np.where(np.isnan(targets), 1.0, targets)), dtype=torch.float32, device=device
        )  # (B,)
        self.start = torch.as_tensor(np.asarray(starts), dtype=torch.float32, device=device)  # (B,)
        self.bias = torch.where(self.on, self.start, 0.0)  # (B,) nats
        self.integral = torch.zeros(len(targets), dtype=torch.float32, device=device)
        # notes in the last DENSITY_WINDOW seconds (decayed), as if the target had been met before the start
        self.recent = torch.where(self.on, self.log_target.exp() * DENSITY_WINDOW, 0.0)

    def update(self, struck, seconds) -> None:
        """After a token: `struck` (B,) whether it was a note-on, `seconds` (B,) the music time it took."""
        import torch

        # The same arithmetic as written out in the class docstring, in as few tensor operations as it takes
        # (a decoding step runs it for every row).
        self.recent = self.recent * (seconds * (-1.0 / DENSITY_WINDOW)).exp() + struck
        rate = self.recent.clamp(min=0.1) / DENSITY_WINDOW
        error = self.log_target - rate.log()  # > 0: too few notes
        limit = DENSITY_MAX_BIAS / DENSITY_KI
        self.integral = torch.addcmul(self.integral, error, seconds).clamp_(-limit, limit)
        bias = torch.add(self.start, error, alpha=DENSITY_KP).add_(self.integral, alpha=DENSITY_KI)
        self.bias = bias.clamp_(-DENSITY_MAX_BIAS, DENSITY_MAX_BIAS) * self.on  # 0 for rows without

    def select(self, rows) -> None:
        for name in self.ROWS:
            setattr(self, name, getattr(self, name)[rows])

    def extend(self, other: DensityLoop) -> None:
        import torch

        for name in self.ROWS:
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
