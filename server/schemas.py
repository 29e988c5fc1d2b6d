"""Request and response models. The Field bounds are the fixed sanity limits (documented in /docs); the
operator's tighter limits (MUSICREL_MAX_SECONDS, ...) are checked on top in deps.py."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.fields import FieldInfo

from musicrel.generation.controls import MAX_DENSITY, Controls, gm_program_names
from musicrel.generation.melody import AccompanimentParams as LibraryAccompanimentParams
from musicrel.generation.primer import PRIMER_SECONDS
from musicrel.generation.sampling import MAX_SEED, Sampling, SamplingParams
from musicrel.generation.span import MAX_SPAN_SECONDS
from musicrel.generation.span import InfillParams as LibraryInfillParams
from musicrel.midi.codec import CodecConfig
from musicrel.model.weights import DECODE_WEIGHTS, GPU_WEIGHTS

# The defaults are the library's (Sampling, SamplingParams, PRIMER_SECONDS, Controls); the bounds are the
# server's own.
_S = Sampling
_D = SamplingParams
_C = Controls

PROGRAMS_BY_NAME = {name.lower(): program for program, name in enumerate(gm_program_names())}
MAX_TRACKS = 64


# What the sampling sweeps measured (docs/EVALUATION.md), not "lower = safer": lower temperatures loop.
_TEMPERATURE = (
    "softmax temperature; no other of 0.5-1.0 beat the default on held-out POP909, piano and music21 "
    "(sweep-sampling); lower loops (at 0.5 a third of 4-note patterns repeat, 3-5 % in the music)"
)
_SHIFT_TEMPERATURE = (
    "temperature within the time shifts alone (how long the music waits, not how often): above 1 longer "
    "waits, sparser music; 1.2 played held-out piano performances at their own density (1: a fifth denser), "
    "pop songs measured best at 1"
)


class MusicForm(BaseModel):
    """What every generation form shares: the sampling fields (the library's `Sampling`: its defaults, the
    server's bounds) and the controls but `program` (whose "empty" means something of its own per task);
    how the fields read what an HTML form sends (an empty string for a field left blank, an instrument's
    name for `program`); and the form as the library's parameters (`library`, `library_params`). A task's
    form adds its own fields and retells a shared one (`_retold`) only where its meaning differs."""

    # NaN compares false with every bound, so pydantic reported "seconds=nan" as out of bounds ("should be
    # less than or equal to 600"); refused as "should be a finite number", it says what is wrong.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    library: ClassVar[type[Sampling]]  # the library's parameters the form becomes

    temperature: float = Field(_S.temperature, gt=0, le=10, description=_TEMPERATURE)
    top_k: int | None = Field(_S.top_k, ge=1, le=4096, description="sample among the k likeliest tokens only")
    top_p: float = Field(_S.top_p, gt=0, le=1, description="nucleus sampling mass (1 disables it)")
    seed: int | None = Field(
        _S.seed, ge=0, le=MAX_SEED, description="random seed; empty draws one (reported back)"
    )
    num_samples: int = Field(
        _S.num_samples, ge=1, le=64, description="independent samples of the same upload (each one a file)"
    )
    # Controls (generation.controls): empty leaves that aspect to the model. Text fields are checked by the
    # library (ControlError: unknown_chord, unknown_key, empty_range, invalid_controls -> 422).
    key: str | None = Field(
        _C.key,
        max_length=40,
        description='keep new notes in a key: "C:major", "A:minor", "Bb:dorian", "auto"',
    )
    key_strength: str = Field(
        _C.key_strength, max_length=20, description='"prefer" (a bias), "only" (a mask) or a bias in nats'
    )
    chords: str | None = Field(
        _C.chords,
        max_length=1000,
        description='chord progression, repeated: "C:2 G:2 Am:2 F:2" (seconds) or "C:4b G:4b" (beats)',
    )
    chord_strength: str = Field(
        _C.chord_strength, max_length=20, description='"prefer" (a bias), "only" (a mask) or a bias in nats'
    )
    density: float | None = Field(
        _C.density, gt=0, le=MAX_DENSITY, description="target notes per second (held by a feedback loop)"
    )
    low_note: int | None = Field(_C.low_note, ge=0, le=127, description="lowest MIDI pitch of a new note")
    high_note: int | None = Field(_C.high_note, ge=0, le=127, description="highest MIDI pitch of a new note")
    max_polyphony: int | None = Field(
        _C.max_polyphony, ge=1, le=128, description="most notes sounding at once"
    )
    instruments: str | None = Field(
        _C.instruments,
        max_length=1000,
        description='a model with instruments: who plays. "motif" (the default: the instruments the motif '
        'plays), "any" (the model may bring in others) or a list: "Violin, Cello, drums" or "40,42,drums"',
    )

    @field_validator(
        "top_k", "seed", "program", "key", "chords", "density", "low_note", "high_note", "max_polyphony",
        "instruments", "motif_end", "track", mode="before", check_fields=False,
    )  # fmt: skip
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        # HTML forms send an empty string for a field left blank.
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("program", mode="before", check_fields=False)
    @classmethod
    def _program_name(cls, value: Any) -> Any:
        # The command line takes names; so does the form. Exact names only (any case, blanks around): the
        # OpenAPI document spells the rule out as a pattern (server/openapi.py), which a looser match
        # (pretty_midi ignores every non-alphanumeric) could not be.
        if isinstance(value, str) and value.strip() and not value.strip().lstrip("+-").isdigit():
            program = PROGRAMS_BY_NAME.get(value.strip().lower())
            if program is None:
                raise ValueError(f"{value.strip()!r} is not a General MIDI instrument name or number 0-127")
            return program
        return value

    @field_validator("key_strength", "chord_strength", mode="before", check_fields=False)
    @classmethod
    def _empty_is_default(cls, value: Any, info) -> Any:
        return (
            cls.model_fields[info.field_name].default
            if isinstance(value, str) and not value.strip()
            else value
        )

    def controls(self) -> Controls | None:
        """The form's control fields as the library's Controls (ControlError when they cannot be honoured);
        None when none is set."""
        controls = Controls(**self.model_dump(include={f.name for f in dataclasses.fields(Controls)}))
        return None if controls.is_empty else controls

    def library_params(self) -> Sampling:
        """The form's sampling fields and controls, whole, as the library takes them (`library`)."""
        fields = {f.name for f in dataclasses.fields(self.library)} - {"controls"}
        return self.library(**self.model_dump(include=fields), controls=self.controls())


def _retold(name: str, description: str, **changes: Any) -> Any:
    """The shared field `name` as a task tells it: its own description (and default); the bounds stay
    MusicForm's."""
    return FieldInfo.merge_field_infos(MusicForm.model_fields[name], description=description, **changes)


def _program(empty: str, of: str = "the output") -> Any:
    """The `program` field (a number, or a name: MusicForm._program_name); `empty`: what a blank gives."""
    return Field(
        None,
        ge=0,
        le=127,
        description=f'General MIDI program of {of}, by number or by name ("Violin", any case); '
        f"empty: {empty}",
    )


class ContinuationParams(MusicForm):
    """The form fields that go with the uploaded `file`."""

    library: ClassVar[type[Sampling]] = SamplingParams

    seconds: float = Field(_D.seconds, gt=0, le=600, description="length of the continuation, in seconds")
    shift_temperature: float = Field(_D.shift_temperature, gt=0, le=10, description=_SHIFT_TEMPERATURE)
    primer_seconds: float = Field(
        PRIMER_SECONDS, gt=0, le=3600, description="how much of the upload's end is read as the motif"
    )
    motif_end: float | None = Field(
        None,
        gt=0,
        le=CodecConfig.max_seconds,
        description="where the motif ends in the upload, in seconds: the continuation starts there, and the "
        "primer is the primer_seconds before it; empty: at the last note",
    )
    include_primer: bool = Field(
        _D.include_primer,
        description="return the motif followed by the continuation: the motif at its times in the upload, on "
        "the upload's tempo map and time and key signatures up to the cut (its bars), the continuation's "
        "tempo after",
    )
    tracks: str = Field(
        "merge",
        max_length=400,
        description='"merge" (every non-drum track; with a model with instruments every track, drums too) '
        'or comma-separated instrument indices, e.g. "0,2"',
    )
    program: int | None = _program("the motif's")

    @field_validator("tracks")
    @classmethod
    def _tracks(cls, value: str) -> str:
        value = value.strip().lower()
        if value in ("", "merge", "all"):
            return "merge"
        parts = [p.strip() for p in value.split(",")]
        if not all(p.isdigit() for p in parts):
            raise ValueError('must be "merge" or comma-separated instrument indices such as "0,2"')
        indices = sorted({int(p) for p in parts})
        if len(indices) > MAX_TRACKS or indices[-1] > 1023:
            raise ValueError(f"at most {MAX_TRACKS} instrument indices, each below 1024")
        return ",".join(map(str, indices))

    def track_selection(self) -> str | list[int]:
        return "merge" if self.tracks == "merge" else [int(p) for p in self.tracks.split(",")]


# ---------------------------------------------------------------- POST /v1/accompaniments
class AccompanimentParams(MusicForm):
    """The form fields that go with the uploaded melody `file`. Sampling and controls as a continuation's
    (same bounds, same meaning); the controls steer the accompaniment only, never the melody."""

    library: ClassVar[type[Sampling]] = LibraryAccompanimentParams

    track: int | None = Field(
        None,
        ge=0,
        le=1023,
        description="instrument index of the melody in the file (as pretty_midi counts them: tracks with "
        "notes, in file order); empty: the file's only track with notes",
    )
    top_p: float = _retold(
        "top_p",
        "nucleus sampling mass (1 disables it; the accompaniment measured best at the default)",
        default=LibraryAccompanimentParams.top_p,
    )
    program: int | None = _program("Acoustic Grand Piano (0)", of="the accompaniment")
    key: str | None = _retold(
        "key",
        'keep the accompaniment in a key: "C:major", "A:minor", "Bb:dorian", "auto" (the melody\'s key)',
    )
    chords: str | None = _retold(
        "chords",
        "the accompaniment's chords, repeated from the file's start: \"C:2 G:2 Am:2 F:2\" (seconds) or "
        '"C:4b G:4b" (beats)',
    )


class SampleFile(BaseModel):
    """What every answer says of each sample: its file and how many notes and seconds it holds."""

    index: int
    midi_base64: str = Field(description="a complete Standard MIDI File, base64-encoded")
    notes: int
    duration_s: float = Field(description="end of the file's last note, in seconds")


class AccompanimentSample(SampleFile):
    midi_base64: str = Field(
        description="a complete Standard MIDI File, base64-encoded: the melody track unchanged, then the "
        "accompaniment's track (named `accompaniment`)"
    )
    notes: int = Field(description="notes of the accompaniment")


class Timings(BaseModel):
    """Every answer's timings, in milliseconds."""

    parse_ms: float
    queue_ms: float = Field(description="waiting in the engine's queue")
    generation_ms: float
    total_ms: float


class AccompanimentResponse(BaseModel):
    seed: int
    settings: AccompanimentParams = Field(description="the settings used, seed and melody track filled in")
    melody_track: int = Field(description="the instrument index the melody was read from")
    melody_notes: int
    seconds: float = Field(description="length of the accompaniment, in seconds (the melody's and a tail)")
    real_time_factor: float = Field(description="seconds of music per second of generation")
    samples: list[AccompanimentSample]
    instrument: str = Field(description="General MIDI name of the accompaniment's program")
    model: Literal["accompaniment", "instruments"] = Field(
        "accompaniment",
        description="the server's model that wrote it: `accompaniment`, or `instruments` when the "
        "`instruments` control asked for instruments the accompaniment model cannot write",
    )
    controls: dict[str, Any] | None = Field(
        None, description="what the controls applied (the key `auto` found, ...); null when none was set"
    )
    warnings: list[str] = Field(default_factory=list)
    timings: Timings


# ---------------------------------------------------------------- POST /v1/infills
class InfillParams(MusicForm):
    """The form fields that go with the uploaded `file`: the span to regenerate, in seconds (`start`, `end`)
    or in bars (`first_bar`, `last_bar`), and sampling as a continuation's (same bounds, same meaning). The
    span's own rules (start < end, at most MAX_SPAN_SECONDS, inside the music, with notes before and after
    it) are the library's (InfillError codes, 422); bars become seconds once the file is read. The controls
    are a continuation's but program (the new notes join the file's own instrument), read against the music
    around the span (musicrel.generation.infill.around_gap)."""

    # The span once and whole, in seconds or in bars (tasks.infill says which field is missing): the schema
    # says so too, so that a client built from it sends one of the two.
    model_config = ConfigDict(
        **MusicForm.model_config,
        json_schema_extra={
            "oneOf": [
                {"required": [*pair], "not": {"anyOf": [{"required": [name]} for name in other]}}
                for pair, other in (
                    (("start", "end"), ("first_bar", "last_bar")),
                    (("first_bar", "last_bar"), ("start", "end")),
                )
            ]
        },
    )
    library: ClassVar[type[Sampling]] = LibraryInfillParams

    start: float | None = Field(
        None, ge=0, le=CodecConfig.max_seconds, description="where the span to regenerate starts, in seconds"
    )
    end: float | None = Field(
        None,
        gt=0,
        le=CodecConfig.max_seconds,
        description=f"where it ends, in seconds (after start, at most {MAX_SPAN_SECONDS:g} s after it); the "
        "notes that start in [start, end) are regenerated, every other note comes back unchanged",
    )
    first_bar: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="the span in bars instead of seconds: its first bar, counted from 1 at the file's start "
        "by its tempo and time signatures (4/4 at 120 bpm without them); the answer's start and end say the "
        "seconds they came to",
    )
    last_bar: int | None = Field(
        None, ge=1, le=100_000, description="its last bar (included); the span ends where the next begins"
    )
    tracks: str | None = Field(
        None,
        max_length=400,
        description="the tracks whose notes in the span are regenerated, as comma-separated instrument "
        "indices (as pretty_midi counts them, like the accompaniment's `track`), e.g. 2 or 0,2; every other "
        "note comes back unchanged; empty (or merge, all): every track the model reads",
    )
    key: str | None = _retold(
        "key",
        'keep the new notes in a key: "C:major", "A:minor", "Bb:dorian", "auto" (the key of the music '
        "around the span)",
    )
    chords: str | None = _retold(
        "chords",
        'chords for the span, repeated from its start: "C:2 G:2 Am:2 F:2" (seconds) or "C:4b G:4b" (beats '
        "at the tempo the span is at)",
    )

    @field_validator("tracks")
    @classmethod
    def _infill_tracks(cls, value: str | None) -> str | None:
        # "merge" and "all": every track, as a continuation's `tracks` (one pattern: server/openapi.py)
        if value is None or value.strip().lower() in ("", "merge", "all"):
            return None
        parts = [p.strip() for p in value.split(",")]
        if not all(p.isascii() and p.isdigit() for p in parts):
            raise ValueError('must be comma-separated instrument indices such as "2" or "0,2"')
        indices = sorted({int(p) for p in parts})
        if len(indices) > MAX_TRACKS or indices[-1] > 1023:
            raise ValueError(f"at most {MAX_TRACKS} instrument indices, each below 1024")
        return ",".join(map(str, indices))

    def track_indices(self) -> tuple[int, ...] | None:
        """`tracks` as the library's InfillParams.tracks (None: every track)."""
        return None if self.tracks is None else tuple(int(p) for p in self.tracks.split(","))

    def library_params(self) -> Sampling:
        """As every form's, `tracks` as the library spells it (a tuple of indices)."""
        return dataclasses.replace(
            MusicForm.library_params(self.model_copy(update={"tracks": None})), tracks=self.track_indices()
        )


class NewNote(BaseModel):
    pitch: int
    velocity: int
    start: float = Field(description="seconds in the file, in [start, end) of the span")
    end: float = Field(description="seconds in the file, by the span's end")
    track: int = Field(description="the track (instrument index) the note was written to")


class InfillSample(SampleFile):
    midi_base64: str = Field(
        description="a complete Standard MIDI File, base64-encoded: the upload with the span regenerated"
    )
    notes: int = Field(description="new notes in the span")
    new_tokens: int = Field(description="tokens the model wrote for the span")
    new_notes: list[NewNote] = Field(description="the new notes, by onset")


# Which of the server's models wrote an answer (musicrel.midi.instruments.wants_instruments routes them).
SERVED_BY = (
    "the server's model that wrote it: `continuation` (or `infill`), or `instruments` for an upload the "
    "piano model would flatten (drums, or more than one instrument) on a server with an instruments model"
)


class InfillResponse(BaseModel):
    seed: int
    settings: InfillParams = Field(description="the settings used, with the seed filled in")
    start: float
    end: float
    removed: int = Field(description="the upload's notes that started in the span (regenerated)")
    tracks: list[int] = Field(description="the tracks regenerated (instrument indices): those asked, or all")
    prompt_tokens: int = Field(description="tokens the model read: the music after the span, then before it")
    model: Literal["infill", "instruments"] = Field("infill", description=SERVED_BY)
    samples: list[InfillSample]
    controls: dict[str, Any] | None = Field(
        None, description="what the controls applied (the key `auto` found, ...); null when none was set"
    )
    warnings: list[str] = Field(default_factory=list)
    timings: Timings


# ---------------------------------------------------------------- answers
class Copy(BaseModel):
    """The longest stretch of a sample that also occurs in the training data (musicrel.evaluation.novelty)."""

    notes: int = Field(description="notes in the stretch (0: not even two notes in a row are shared)")
    seconds: float = Field(description="onset span of the stretch in the sample")
    # None when nothing is shared (a sample of fewer than two notes has no interval to share): a required
    # float here failed the whole request with a 500, the sample's good siblings with it.
    start_time: float | None = Field(
        description="where the stretch starts in the sample, in seconds; null when notes is 0"
    )
    source: str | None = Field(description="the training piece it occurs in (one of them)")
    source_sha256: str | None
    start_time_in_source: float | None
    occurrences: int = Field(description="places in the training data that hold the stretch")


class TrackInfo(BaseModel):
    """A track of the answer's file (a model with instruments: musicrel.midi.tracks)."""

    index: int = Field(description="the track's place in the file; a stream's note_on `track` refers to it")
    name: str = Field(description="the upload's track name (a new track: its General MIDI name, or Drums)")
    program: int = Field(description="General MIDI program (a drum track's kit program as uploaded)")
    drum: bool = Field(description="a drum track (written on channel 10)")
    source: int | None = Field(
        description="the upload's track index (pretty_midi's instrument index, the `tracks` field's); null "
        "for a track the upload does not have (an instrument the model added)"
    )


class Sample(SampleFile):
    new_tokens: int
    tracks: list[TrackInfo] | None = Field(
        None,
        description="a model with instruments: the file's tracks, the motif's then any the sample added; "
        "null for a piano model (one track)",
    )
    novelty: Copy | None = Field(
        None,
        description="the longest stretch shared with the training data, transposition-invariant; null when "
        "the checkpoint ships no novelty index",
    )


class PrimerInfo(BaseModel):
    """What the model reads of the upload: the window [start_time, end_time) of the file."""

    tokens: int
    start_time: float = Field(description="where the window read starts in the uploaded file, in seconds")
    end_time: float = Field(
        description="where the motif ends (motif_end, or the last note): generation starts"
    )
    requested_seconds: float = Field(description="the primer_seconds asked for")
    cropped: bool = Field(
        description="true when the window is shorter than primer_seconds because the model reads at most so "
        "many tokens (a dense motif): start_time moved later"
    )
    tempo: float = Field(
        description="bpm: the tempo the primer window is at for the longest time, the continuation file's"
    )
    program: int = Field(description="the motif's instrument: General MIDI program of the output by default")
    instrument: str = Field(description="that program's General MIDI name")
    program_reason: str = Field(description="why that program, in words (the share of notes it plays)")
    notes: int


class InstrumentInfo(BaseModel):
    program: int = Field(description="General MIDI program the samples are written with")
    name: str
    reason: str = Field(description='why: "the program field", or the motif\'s (see primer.program_reason)')


class ContinuationTimings(Timings):
    prefill_ms: float | None = None
    decode_ms: float | None = None


class BatchInfo(BaseModel):
    requests: int = Field(description="the most requests decoded together while this request ran")
    rows: int = Field(description="the most rows (samples) decoded together while this request ran")


class ContinuationResponse(BaseModel):
    seed: int
    settings: ContinuationParams = Field(description="the settings used, with the seed filled in")
    primer: PrimerInfo
    samples: list[Sample]
    new_tokens: int
    stopped: bool = Field(description="true when generation stopped early (deadline)")
    instrument: InstrumentInfo = Field(description="the instrument the samples are played on")
    tracks: list[TrackInfo] | None = Field(
        None,
        description="a model with instruments: the motif's tracks, which every sample's file starts with "
        "(each new note on its instrument's track); null for a piano model",
    )
    model: Literal["continuation", "instruments"] = Field("continuation", description=SERVED_BY)
    controls: dict[str, Any] | None = Field(
        None,
        description="what the controls applied: the key `auto` found (key, key_detected), the program and "
        "its instrument name, each chord's length in seconds, ...; null when no control was set",
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="settings honoured that pull against each other, e.g. a chord with notes outside the key",
    )
    timings: ContinuationTimings
    batch: BatchInfo


class MotifParams(BaseModel):
    """The form fields of POST /v1/motifs: those of a continuation that decide its primer."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    primer_seconds: float = ContinuationParams.model_fields["primer_seconds"]
    motif_end: float | None = ContinuationParams.model_fields["motif_end"]
    tracks: str = ContinuationParams.model_fields["tracks"]

    _tracks = field_validator("tracks")(ContinuationParams._tracks.__func__)
    _empty_is_none = field_validator("motif_end", mode="before")(ContinuationParams._empty_is_none.__func__)


class PreparedMotif(BaseModel):
    sha256: str = Field(description="sha256 of the uploaded bytes: the motif the server now holds")
    primer: PrimerInfo
    cached: bool = Field(description="true when the motif was already prepared (nothing was done)")
    parse_ms: float
    prefill_ms: float | None = Field(None, description="the engine's prefill of the primer; null when cached")


class ErrorDetail(BaseModel):
    code: str
    message: str
    field: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ModelInfo(BaseModel):
    checkpoint: str
    sha256: str = Field(
        description="sha256 of model.safetensors (of a sharded checkpoint: of its shards in index order)"
    )
    parameters: int
    weights: Literal[(*DECODE_WEIGHTS, GPU_WEIGHTS)] = Field(
        description="how the model holds its weights while decoding: int8 or float32 as trained, what "
        "MUSICREL_WEIGHTS asked or, under auto, what the probe at load found faster (docs/BENCHMARKS.md); "
        "on a GPU bfloat16 for int8 and auto"
    )
    vocab_size: int
    model: dict[str, Any]
    codec: dict[str, Any]
    limits: dict[str, Any]
    card_url: str | None = Field(
        None,
        description="where this model's card (its checkpoint's MODEL_CARD.md) is served as text/markdown; "
        "null when the checkpoint has none. The accompaniment and infill models' have their own card_url",
    )
    novelty_index: dict[str, int] | None = Field(
        None, description="pieces and notes of the training data's novelty index beside the checkpoint"
    )
    accompaniment: dict[str, Any] | None = Field(
        None,
        description="the accompaniment model of POST /v1/accompaniments (checkpoint, sha256, parameters, "
        "max_melody_seconds, ...); null when this server has none (the route answers 503)",
    )
    infill: dict[str, Any] | None = Field(
        None,
        description="the infill model of POST /v1/infills (checkpoint, sha256, parameters, max_span_seconds, "
        "...); null when this server has none (the route answers 503 infill_unavailable)",
    )
    instruments: dict[str, Any] | None = Field(
        None,
        description="the instruments model (checkpoint, sha256, parameters, fills, ...): it continues, and "
        "fills when `fills` is true, the uploads the continuation model would flatten into one piano stream "
        "(drums, or more than one instrument in the tracks read), each instrument on its own track; null "
        "when this server has none or its continuation model hears every instrument itself",
    )
    programs: list[str] = Field(
        default_factory=gm_program_names,
        description="the General MIDI instrument names by program number (0-127), for the `program` field",
    )


class Example(BaseModel):
    name: str
    file: str
    url: str
    description: str = ""


class Health(BaseModel):
    status: str
