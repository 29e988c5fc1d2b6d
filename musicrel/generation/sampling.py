"""How to sample: `Sampling`, the fields every task shares and the one source of their defaults and checks
(the library, the commands and the server's forms read them from here); `SamplingParams`, a continuation's
(the accompaniment's and the infill's extend `Sampling` in melody.py and span.py); the one seed range and
the per-sample seeds; and what a continuation gives back, `ContinuationResult`.

No torch here: the command line and the server's schemas read these defaults at start-up, and the server's
HTTP process receives results from its engine without loading torch.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field

import numpy as np

from musicrel.errors import GenerationError, is_int, is_number
from musicrel.generation.controls import Controls

# The one seed range of library, command line and API: every seed reported (drawn or given) can be sent back
# and repeats the music. 32 bits so that any client (a JavaScript page: 53-bit integers) holds it exactly.
SEED_RANGE = 2**32
MAX_SEED = SEED_RANGE - 1
# Without max_new_tokens a row may emit at most this many tokens per second of music (dense piano passages
# reach ~100 events/s); the cap only matters for a model that stalls time.
TOKENS_PER_SECOND_CAP = 200


def _number(params, name: str) -> float:
    """The field `name` of `params` as a float, set back; GenerationError `invalid_params` unless finite."""
    value = getattr(params, name)
    if not is_number(value):
        raise GenerationError(f"{name} must be a finite number, got {value!r}", code="invalid_params")
    setattr(params, name, float(value))
    return float(value)


def _positive(params, name: str) -> None:
    value = getattr(params, name)
    if _number(params, name) <= 0:
        raise GenerationError(f"{name} must be > 0, got {value!r}", code="invalid_params")


def _integer(params, name: str, low: int, high: int | None = None, allow_none: bool = False) -> None:
    """The field `name` of `params` as an int in [low, high] (None when allowed), set back."""
    value = getattr(params, name)
    if value is None and allow_none:
        return
    if not is_int(value) or value < low:
        raise GenerationError(f"{name} must be an integer >= {low}, got {value!r}", code="invalid_params")
    if high is not None and value > high:
        raise GenerationError(f"{name} must be <= {high}, got {value!r}", code="invalid_params")
    setattr(params, name, int(value))


@dataclass(kw_only=True)
class Sampling:
    """What every task samples with: the shared fields, their defaults (the one source) and their checks.
    The task's parameters extend it with their own fields (SamplingParams: a continuation's length, ...;
    AccompanimentParams, InfillParams). Validated on construction (GenerationError names the field)."""

    temperature: float = 1.0
    top_k: int | None = None
    # Nucleus off: on held-out pieces (docs/EVALUATION.md, "The density and the nucleus") top-p 0.95 cut the
    # tail that long time shifts and rarer pitches live in, so the music came denser and repeated itself more
    # (performances: 8.4 notes/s and 8 % repeated 4-grams at 0.95, 8.0 and 2 % at 1, truth 6.7 and 4 %), and
    # the classifier told it from the truth no less (POP909: 59 % -> 51 %, music21 85 % -> 84 %).
    top_p: float = 1.0
    seed: int | None = None  # None: a random seed is drawn (draw_seed) and reported
    num_samples: int = 1
    controls: Controls | None = None  # steering (generation.controls); None, like Controls(), steers nothing

    def __post_init__(self) -> None:
        _positive(self, "temperature")
        top_p = self.top_p
        if not 0 < _number(self, "top_p") <= 1:
            raise GenerationError(f"top_p must be in (0, 1], got {top_p!r}", code="invalid_params")
        _integer(self, "top_k", 1, allow_none=True)
        _integer(self, "seed", 0, MAX_SEED, allow_none=True)
        _integer(self, "num_samples", 1)
        if isinstance(self.controls, dict):
            self.controls = Controls.from_dict(self.controls)
        if self.controls is not None and not isinstance(self.controls, Controls):
            raise GenerationError(
                f"controls must be Controls, a dict or None, got {type(self.controls).__name__}",
                code="invalid_params",
            )
        if self.controls is not None and self.controls.is_empty:
            self.controls = None  # one meaning for "no control": exactly the uncontrolled path


@dataclass(kw_only=True)
class SamplingParams(Sampling):
    """How to continue one motif: the shared sampling fields and a continuation's own."""

    seconds: float = 20.0
    # The temperature within the time shifts alone: they keep the mass `temperature` gave them and only their
    # shape flattens (> 1: longer waits more likely) or sharpens (< 1), so how often the music waits is the
    # model's and how long is steered. On held-out piano performances 1.2 brought the model's density into
    # the truth's (8.0 -> 6.5 notes/s, truth 6.7; docs/EVALUATION.md, "The density and the nucleus").
    shift_temperature: float = 1.0
    max_new_tokens: int | None = None
    include_primer: bool = False  # render the motif followed by the continuation

    def __post_init__(self) -> None:
        _positive(self, "seconds")
        super().__post_init__()
        _positive(self, "shift_temperature")
        _integer(self, "max_new_tokens", 1, allow_none=True)
        if not isinstance(self.include_primer, bool):
            raise GenerationError(
                f"include_primer must be true or false, got {self.include_primer!r}", code="invalid_params"
            )

    def limit_steps(self, step_ms: float) -> int:
        """The requested length in time steps (the grammar meets it to one step)."""
        return max(1, math.ceil(self.seconds * 1000.0 / step_ms - 1e-9))

    def token_budget(self) -> int:
        """Most tokens a sample may take: max_new_tokens, else what `seconds` of dense music needs."""
        return self.max_new_tokens or int(self.seconds * TOKENS_PER_SECOND_CAP) + 64


def row_seed(seed: int, sample_index: int) -> int:
    """The generator seed of sample `sample_index` of a job: a function of (seed, index) only, so sample i is
    reproducible whatever num_samples or batch it ran in."""
    return int(np.random.SeedSequence([seed, sample_index]).generate_state(1, np.uint64)[0] >> 1)


def draw_seed() -> int:
    """A random seed for a request that gave none, in the range every seed field accepts back."""
    return secrets.randbelow(SEED_RANGE)


def derived_seed(seed: int, index: int) -> int:
    """A job seed in range, a function of (seed, index): for runs that give each of many jobs its own seed."""
    return row_seed(seed, index) % SEED_RANGE


@dataclass
class ContinuationResult:
    """A finished job: each sample's tokens and how they were made. MIDI: `primer.render_result`."""

    # np.ndarray of generated tokens per sample, as the model read them: their first primer.tail_steps of time
    # shifts lie before the cut (generation.join); render_result and NoteStream start the clock at the cut
    tokens: list
    seed: int
    primer_tokens: int
    new_tokens: int  # all samples together
    seconds: float  # music generated after the cut (the longest sample)
    # seconds: prefill (of the admission that took the job in), decode (admitted to done)
    timings: dict
    stopped: bool = False  # should_stop ended this job early
    controls: dict | None = None  # what params.controls applied (the key detected, ...), for the metadata
    warnings: list = field(default_factory=list)  # controls that pull apart (a chord outside the key, ...)
