"""POST /v1/accompaniments: a melody in (a MIDI file, and which of its tracks is the melody), the same file
out with a piano accompaniment on a track of its own (musicrel.generation.accompaniment).

Everything of the route lives here (its form and answer schemas, the model holder, the route) so that the
continuation modules stay as they are. The accompaniment model is a second checkpoint
(MUSICREL_ACCOMPANY_CHECKPOINT), loaded at start-up when its folder exists; without one the route answers
503 `no_accompaniment_model` and /v1/model says `accompaniment: null`.

It does not join the continuation worker's running batch: the melody grammar places the melody's tokens at
their steps and its rows cannot join a running batch (MelodyGrammar.extend). One accompaniment is generated
at a time, on a worker thread of this process, behind a lock; the request still holds its admission ticket
while it waits, so MUSICREL_MAX_QUEUE bounds how many can wait, as it does for continuations.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, File, Form, Request, UploadFile
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from musicrel.errors import InvalidMidiError
from musicrel.generation.controls import Controls, gm_program_name
from server.deps import ServiceDep, SettingsDep, WantsJsonDep, refuse_unknown_fields
from server.errors import CLIENT_CLOSED, ApiError, limit_message
from server.middleware import ACCOMPANIMENTS_PATH
from server.schemas import ContinuationParams
from server.service import Service
from server.settings import Settings

log = logging.getLogger("musicrel.server")
router = APIRouter()

# Errors about the melody track: the page shows them beside its track menu.
TRACK_CODES = frozenset({"which_track", "no_such_track", "melody_has_chords"})
_P = ContinuationParams.model_fields


# ---------------------------------------------------------------- schemas
class AccompanimentParams(BaseModel):
    """The form fields that go with the uploaded melody `file`. Sampling and controls as a continuation's
    (same bounds, same meaning); the controls steer the accompaniment only, never the melody."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    track: int | None = Field(
        None,
        ge=0,
        le=1023,
        description="instrument index of the melody in the file (as pretty_midi counts them: tracks with "
        "notes, in file order); empty: the file's only track with notes",
    )
    temperature: float = _P["temperature"]
    top_k: int | None = _P["top_k"]
    top_p: float = _P["top_p"]
    seed: int | None = _P["seed"]
    num_samples: int = Field(
        _P["num_samples"].default, ge=1, le=64, description="independent accompaniments of the same melody"
    )
    program: int | None = Field(
        None,
        ge=0,
        le=127,
        description='General MIDI program of the accompaniment, by number or by name ("Violin", any case); '
        "empty: Acoustic Grand Piano (0)",
    )
    key: str | None = Field(
        None,
        max_length=40,
        description='keep the accompaniment in a key: "C:major", "A:minor", "Bb:dorian", "auto" (the '
        "melody's key)",
    )
    key_strength: str = _P["key_strength"]
    chords: str | None = Field(
        None,
        max_length=1000,
        description="the accompaniment's chords, repeated from the file's start: \"C:2 G:2 Am:2 F:2\" "
        '(seconds) or "C:4b G:4b" (beats)',
    )
    chord_strength: str = _P["chord_strength"]
    density: float | None = _P["density"]
    low_note: int | None = _P["low_note"]
    high_note: int | None = _P["high_note"]
    max_polyphony: int | None = _P["max_polyphony"]

    _empty_is_none = field_validator(
        "track", "top_k", "seed", "program", "key", "chords", "density", "low_note", "high_note",
        "max_polyphony", mode="before",
    )(ContinuationParams._empty_is_none.__func__)  # fmt: skip
    _program_name = field_validator("program", mode="before")(ContinuationParams._program_name.__func__)
    _empty_is_default = field_validator("key_strength", "chord_strength", mode="before")(
        ContinuationParams._empty_is_default.__func__
    )

    def controls(self) -> Controls | None:
        """The control fields as the library's Controls (ControlError -> 422); None when none is set."""
        controls = Controls(**self.model_dump(include={f.name for f in dataclasses.fields(Controls)}))
        return None if controls.is_empty else controls

    def library_params(self):
        from musicrel.generation.accompaniment import AccompanimentParams as Library

        fields = self.model_dump(include={"temperature", "top_k", "top_p", "seed", "num_samples"})
        return Library(**fields, controls=self.controls())


class AccompanimentSample(BaseModel):
    index: int
    midi_base64: str = Field(
        description="a complete Standard MIDI File, base64-encoded: the melody track unchanged, then the "
        "accompaniment's track (named `accompaniment`)"
    )
    notes: int = Field(description="notes of the accompaniment")
    duration_s: float = Field(description="end of the file's last note, in seconds")


class AccompanimentTimings(BaseModel):
    parse_ms: float
    queue_ms: float = Field(description="waiting for the accompaniment worker (one generation at a time)")
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
    controls: dict[str, Any] | None = Field(
        None, description="what the controls applied (the key `auto` found, ...); null when none was set"
    )
    warnings: list[str] = Field(default_factory=list)
    timings: AccompanimentTimings


# ---------------------------------------------------------------- the model
class Accompanist:
    """The accompaniment model and codec (loaded once, if the folder exists) and the lock that lets one
    generation run at a time."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.model: Any = None
        self.codec: Any = None
        self.info: dict[str, Any] | None = None
        self.unavailable = "not loaded yet"
        # A threading lock, not only an anyio limiter: a request past its deadline abandons its thread, which
        # still runs to its end; the next generation waits for it here instead of running beside it.
        self.lock = threading.Lock()
        # Kept between requests: a fresh sampler watches the machine 0.1 s before each choice of threads.
        self.cpu: Any = None

    def load(self) -> None:
        """Blocking (start-up thread). No folder is no error: the service runs without the route."""
        from musicrel.model.checkpoint import load_codec, load_model, weights_sha256
        from musicrel.threads import loading_threads

        folder = Path(self.settings.accompany_checkpoint)
        if not (folder / "config.json").is_file():
            self.unavailable = f"no accompaniment model on this server ({folder} holds no checkpoint)"
            log.info("accompaniment: %s", self.unavailable)
            return
        loading_threads()
        model = load_model(folder, device="cpu").eval()
        codec = load_codec(folder)
        if codec.melody_on_offset is None:
            self.unavailable = f"{folder} is not an accompaniment model (its codec has no melody tokens)"
            log.warning("accompaniment: %s", self.unavailable)
            return
        self.model, self.codec = model, codec
        from musicrel.threads import CpuSampler

        self.cpu = CpuSampler()
        card = folder / "MODEL_CARD.md"
        self.info = {
            "checkpoint": str(folder),
            "sha256": weights_sha256(folder),
            "parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": codec.vocab_size,
            "model": model.cfg.to_dict(),
            "card": card.read_text(errors="replace") if card.is_file() else None,
            "max_melody_seconds": self.settings.max_melody_seconds,
        }
        self.unavailable = ""
        if self.settings.warmup:
            self._warm_up()
        log.info("accompaniment: loaded %s (%d parameters)", folder, self.info["parameters"])

    def _warm_up(self) -> None:
        """Every path of a generation once (a four-note melody), so that the first request does not pay it."""
        import pretty_midi

        from musicrel.generation.accompaniment import AccompanimentParams as Library
        from musicrel.generation.accompaniment import accompany_midi

        pm = pretty_midi.PrettyMIDI(initial_tempo=120)
        tune = pretty_midi.Instrument(0)
        tune.notes = [pretty_midi.Note(90, 60 + 2 * i, 0.25 * i, 0.25 * i + 0.2) for i in range(4)]
        pm.instruments.append(tune)
        start = time.perf_counter()
        accompany_midi(self.model, self.codec, pm, params=Library(seed=0))
        log.info("accompaniment: warm-up took %.0f ms", 1000 * (time.perf_counter() - start))

    def stop(self) -> None:
        """At shutdown: let a generation still running (one abandoned by its request included) end first,
        up to the drain timeout, rather than tear torch down under it."""
        if self.lock.acquire(timeout=self.settings.drain_timeout_s):
            self.lock.release()

    @property
    def available(self) -> bool:
        return self.model is not None

    def summary(self) -> dict[str, Any] | None:
        """What /v1/model says of the accompaniment model: null when the route is unavailable."""
        return self.info if self.available else None


def get_accompanist(request: Request) -> Accompanist:
    return request.app.state.accompanist


AccompanistDep = Annotated[Accompanist, Depends(get_accompanist)]


# ---------------------------------------------------------------- the request
async def get_params(
    form: Annotated[AccompanimentParams, Form()],
    settings: SettingsDep,
    accompanist: AccompanistDep,
    request: Request,
) -> AccompanimentParams:
    """The form, checked: unknown fields (422), the operator's limits, controls that cannot be honoured
    whatever the melody; and 503 when there is no model, before anything is parsed."""
    if not accompanist.available:
        raise ApiError(503, "no_accompaniment_model", accompanist.unavailable)
    await refuse_unknown_fields(request, AccompanimentParams)
    limit = min(settings.max_num_samples, settings.max_batch_rows)
    if form.num_samples > limit:
        raise ApiError(422, "invalid_request", limit_message("num_samples", limit), field="num_samples")
    if form.top_k is not None and form.top_k > accompanist.codec.vocab_size:
        message = limit_message("top_k", accompanist.codec.vocab_size)
        raise ApiError(422, "invalid_request", message, field="top_k")
    form.controls()
    return form


ParamsDep = Annotated[AccompanimentParams, Depends(get_params)]


def parse_melody(codec: Any, data: bytes, track: int | None, max_seconds: float) -> tuple[Any, int, int]:
    """(PrettyMIDI, melody track, melody notes) or InvalidMidiError; the library's own checks, run before
    the generation lock is taken so that a bad file is refused at once, with the server's length limit."""
    from musicrel.generation.accompaniment import melody_notes, melody_track

    pm = codec.read(data)
    index = melody_track(pm, track)
    return pm, index, len(melody_notes(pm, index, max_seconds=max_seconds))


def generate(
    accompanist: Accompanist,
    pm: Any,
    track: int,
    params: AccompanimentParams,
    deadline: float,
    gone: threading.Event,
) -> tuple[Any, float, float]:
    """On a worker thread: (AccompanimentResult, when it started, when it ended). A request whose deadline
    passed or whose client left while it waited for the lock is not generated at all."""
    from musicrel.generation.accompaniment import accompany_midi
    from server.worker import generation_threads

    with accompanist.lock:
        if gone.is_set() or time.monotonic() > deadline:
            raise ApiError(504, "timeout", "the accompaniment did not start within the request deadline")
        # OpenMP's count is per calling thread: set in this one
        generation_threads(accompanist.settings.torch_threads, params.num_samples, accompanist.cpu)
        started = time.monotonic()
        result = accompany_midi(
            accompanist.model, accompanist.codec, pm, track=track, params=params.library_params()
        )
        return result, started, time.monotonic()


async def wait(
    worker: Callable[[], Any], deadline: float, is_disconnected: Callable[[], Awaitable[bool]], poll_s: float
) -> Any:
    """Run `worker` on a thread and wait for it while watching the deadline and the client. A deadline or a
    client gone abandons the thread (it cannot be stopped mid-way; it finishes and its result is dropped)."""
    done = anyio.Event()
    box: dict[str, Any] = {}

    async def run() -> None:
        try:
            box["result"] = await anyio.to_thread.run_sync(worker, abandon_on_cancel=True)
        except Exception as exc:  # handed to the waiting request below
            box["error"] = exc
        finally:
            done.set()

    stopped = ""  # set, the body leaves the task group quietly (an exception there would come out grouped)
    async with anyio.create_task_group() as group:
        group.start_soon(run)
        while not done.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                stopped = "deadline"
            else:
                with anyio.move_on_after(min(poll_s, remaining)):
                    await done.wait()
                if not done.is_set() and await is_disconnected():
                    stopped = "disconnected"
            if stopped:
                group.cancel_scope.cancel()
                break
    if stopped == "deadline":
        raise ApiError(504, "timeout", "the accompaniment did not finish within the request deadline")
    if stopped:
        return None
    if "error" in box:
        raise box["error"]
    return box["result"]


def _ms(seconds: float) -> float:
    return round(1000 * seconds, 2)


def _midi_bytes(pm: Any) -> bytes:
    buffer = io.BytesIO()
    pm.write(buffer)
    return buffer.getvalue()


async def create_accompaniment(
    service: Service,
    accompanist: Accompanist,
    file: UploadFile,
    params: AccompanimentParams,
    is_disconnected: Callable[[], Awaitable[bool]],
) -> AccompanimentResponse | None:
    settings = service.settings
    start = time.monotonic()
    deadline = start + settings.request_timeout_s
    data = await file.read()
    if not data:
        raise ApiError(422, "invalid_request", "file: the upload is empty (0 bytes)", field="file")
    try:
        with anyio.fail_after(settings.request_timeout_s):
            pm, track, notes = await anyio.to_thread.run_sync(
                parse_melody,
                accompanist.codec,
                data,
                params.track,
                settings.max_melody_seconds,
                limiter=service.parse_limiter,
                abandon_on_cancel=True,
            )
    except TimeoutError as exc:
        raise ApiError(504, "timeout", "parsing the upload did not finish by the request deadline") from exc
    except InvalidMidiError as exc:
        # The library's code and status; the track's errors name the field the page shows them beside.
        raise ApiError(422, exc.code, str(exc), field="track" if exc.code in TRACK_CODES else None) from exc
    parsed = time.monotonic()
    service.metrics.parse_seconds.observe(parsed - start)

    gone = threading.Event()
    try:
        outcome = await wait(
            lambda: generate(accompanist, pm, track, params, deadline, gone),
            deadline,
            is_disconnected,
            settings.disconnect_poll_s,
        )
    except BaseException:
        gone.set()
        raise
    if outcome is None:
        gone.set()
        log.info("accompaniment: client disconnected")
        return None
    result, started, ended = outcome
    rendered = await anyio.to_thread.run_sync(
        lambda: [_midi_bytes(m) for m in result.midis], limiter=service.render_limiter
    )
    done = time.monotonic()
    generation_s = ended - started
    log.info(
        "accompaniment: seed=%d melody=%d notes, %.1f s, gen=%.0f ms",
        result.seed,
        notes,
        result.seconds,
        1000 * generation_s,
    )
    program = params.program if params.program is not None else 0
    return AccompanimentResponse(
        seed=int(result.seed),
        settings=params.model_copy(update={"seed": int(result.seed), "track": int(result.melody_track)}),
        melody_track=int(result.melody_track),
        melody_notes=notes,
        seconds=round(float(result.seconds), 4),
        real_time_factor=round(float(result.seconds) / max(generation_s, 1e-9), 3),
        samples=[
            AccompanimentSample(
                index=i,
                midi_base64=base64.b64encode(data).decode("ascii"),
                notes=len(part),
                duration_s=round(float(midi.get_end_time()), 4),
            )
            for i, (data, part, midi) in enumerate(zip(rendered, result.notes, result.midis, strict=True))
        ],
        instrument=gm_program_name(program),
        controls=result.controls,
        warnings=list(result.warnings),
        timings=AccompanimentTimings(
            parse_ms=_ms(parsed - start),
            queue_ms=_ms(started - parsed),
            generation_ms=_ms(generation_s),
            total_ms=_ms(done - start),
        ),
    )


def as_midi(answer: AccompanimentResponse) -> Response:
    """Sample 0 as a MIDI file; the seed, track and timings in headers (as a continuation's)."""
    sample, timings = answer.samples[0], answer.timings
    headers = {
        "Content-Disposition": f'attachment; filename="accompaniment-{answer.seed}.mid"',
        "X-Musicrel-Seed": str(answer.seed),
        "X-Musicrel-Melody-Track": str(answer.melody_track),
        "X-Musicrel-Notes": str(sample.notes),
        "X-Musicrel-Samples": str(len(answer.samples)),
        "X-Musicrel-Seconds": str(answer.seconds),
        "X-Musicrel-Real-Time-Factor": str(answer.real_time_factor),
        "X-Musicrel-Timing-Parse-Ms": str(timings.parse_ms),
        "X-Musicrel-Timing-Queue-Ms": str(timings.queue_ms),
        "X-Musicrel-Timing-Generation-Ms": str(timings.generation_ms),
        "Server-Timing": f"parse;dur={timings.parse_ms}, queue;dur={timings.queue_ms}, "
        f"generate;dur={timings.generation_ms}, total;dur={timings.total_ms}",
    }
    if answer.warnings:
        headers["X-Musicrel-Warnings"] = str(len(answer.warnings))
    return Response(base64.b64decode(sample.midi_base64), media_type="audio/midi", headers=headers)


# ---------------------------------------------------------------- the route
FILE_DESCRIPTION = (
    "the melody: a Standard MIDI File with one track of notes, or several and `track` saying which is the "
    "melody; single notes only (a track with chords is refused)"
)


def _responses() -> dict[int | str, dict[str, Any]]:
    from server.routes import ERRORS

    errors = {status: dict(spec) for status, spec in ERRORS.items()}
    errors[422] = {
        **errors[422],
        "description": errors[422]["description"]
        + "; of the melody: which_track (several tracks with notes and no `track`), no_such_track, "
        "melody_has_chords, no_notes, too_long (longer than MUSICREL_MAX_MELODY_SECONDS)",
    }
    errors[503] = {
        **errors[503],
        "description": "no accompaniment model on this server (no_accompaniment_model), loading (not_ready) "
        "or shutting down (draining)",
    }
    return errors


@router.post(
    ACCOMPANIMENTS_PATH,
    summary="Accompany an uploaded melody",
    response_model=AccompanimentResponse,
    responses={
        200: {
            "content": {"audio/midi": {}},
            "description": "audio/midi (sample 0): the melody track unchanged and the accompaniment's track; "
            "JSON with every sample for Accept: application/json",
        },
        **_responses(),
    },
)
async def create(
    request: Request,
    service: ServiceDep,
    accompanist: AccompanistDep,
    params: ParamsDep,
    wants_json: WantsJsonDep,
    file: Annotated[
        UploadFile,
        File(
            description=FILE_DESCRIPTION,
            json_schema_extra={"minLength": 1, "format": "binary", "contentMediaType": "audio/midi"},
        ),
    ],
) -> Any:
    """The melody's track is kept as it is; the accompaniment (a piano unless `program` says otherwise)
    starts with the file and ends a second after the melody's last note. Generated one request at a time on
    a worker of its own; admitted, bounded by MUSICREL_REQUEST_TIMEOUT_S (504) and drained as a
    continuation is."""
    answer = await create_accompaniment(service, accompanist, file, params, request.is_disconnected)
    if answer is None:
        return Response(status_code=CLIENT_CLOSED)
    return answer if wants_json else as_midi(answer)
