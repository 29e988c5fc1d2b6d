"""What a task is on the server, once for every task: `Task`, the one definition a task module fills in (its
form, how an upload becomes an engine job, how the job's result becomes the JSON answer, the MIDI answer's
headers, its stream's notes), and the one path every task's request takes through it: `parse` (upload ->
`Parsed`), `submit` (to the engine: 429, 503), `run` (the plain request, to the answer) and `as_midi`. The
routes (server/routes/tasks.py), the form's checks and the NDJSON stream (server/tasks/stream.py) are made
from a Task; no task writes them out."""

from __future__ import annotations

import base64
import io
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
from fastapi import UploadFile
from fastapi.responses import Response
from pydantic import BaseModel

from server.admission import Ticket
from server.errors import ApiError
from server.jobs import Job, JobRequest, OnProgress
from server.schemas import MusicForm, Timings
from server.service import Service
from server.submit import queue_job, read_upload, wait_for_result

if TYPE_CHECKING:
    from musicrel.generation.streaming import NoteStream

log = logging.getLogger("musicrel.server")


def ms(seconds: float) -> float:
    return round(1000 * seconds, 2)


def midi_bytes(pm: Any) -> bytes:
    buffer = io.BytesIO()
    pm.write(buffer)
    return buffer.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass
class Parsed:
    """A request after parsing: the form as used from here on (a drawn seed, a span's bars as seconds), what
    the engine runs, the task's own findings (the primer, the melody's notes, the cut file) and the clock."""

    form: MusicForm
    job: JobRequest
    found: Any
    start: float  # time.monotonic() at the start of parsing
    parsed: float
    deadline: float


@dataclass
class NoteSource:
    """How a task's stream reports notes: one NoteStream per sample (tokens -> note events), the offset its
    times are shifted by (the answer's clock), and the strikes the answer leaves out (`left_out(pitch, time)`
    for a note_on: the note is never reported)."""

    streams: list[NoteStream]
    offset: float = 0.0
    left_out: Callable[[int, float], bool] | None = None


class Task(ABC):
    """One task of the service. A subclass says what is its own; everything else is shared."""

    name: ClassVar[str]  # "continuation": the MIDI file's name, the logs, "the continuation did not finish"
    path: ClassVar[str]  # the plain route; the stream route is path + "/stream"
    form: ClassVar[type[MusicForm]]
    response: ClassVar[type[BaseModel]]
    summary: ClassVar[str]
    description: ClassVar[str | None] = None  # the plain route's, in the OpenAPI document
    file_description: ClassVar[str]
    midi_description: ClassVar[str]  # the 200 answer's, in the OpenAPI document
    errors_422: ClassVar[str] = ""  # the task's own 422 codes, added to the shared description
    errors_503: ClassVar[str | None] = None  # the 503 description when the task's model may be missing
    stream_summary: ClassVar[str | None] = None  # None: the task has no stream route
    stream_description: ClassVar[str] = ""
    warnings_header: ClassVar[bool] = True  # X-Musicrel-Warnings when the answer has warnings
    # A model of its own the server may lack: the Service's attribute that describes it (CheckpointView;
    # `<model>_unavailable` says why it is missing) and the 503 code then. None: the continuation model's.
    model: ClassVar[str | None] = None
    unavailable_code: ClassVar[str] = "not_ready"

    def unavailable(self, service: Service) -> ApiError | None:
        """Why the server cannot run this task (its model is missing): refused before any parsing."""
        if self.model is not None and getattr(service, self.model) is None:
            return ApiError(503, self.unavailable_code, getattr(service, f"{self.model}_unavailable"))
        return None

    def codec(self, service: Service) -> Any:
        """The codec of the task's model."""
        return service.codec if self.model is None else getattr(service, self.model).codec

    def limits(self, service: Service) -> dict[str, float]:
        """The operator's limits on the form's fields (their largest values), on top of the schema's."""
        settings = service.settings
        return {
            "num_samples": min(settings.max_num_samples, settings.max_batch_rows),
            "top_k": self.codec(service).vocab_size,
        }

    def check(self, form: MusicForm) -> None:
        """The task's own checks of the form that need no file (422); none by default."""
        return None

    @abstractmethod
    async def parse(
        self, service: Service, data: bytes, form: MusicForm
    ) -> tuple[MusicForm, JobRequest, Any]:
        """The upload read and checked (on a parse thread, within the deadline): (the form as used from here,
        what the engine runs, the task's findings). 422 for what the file cannot give."""

    @abstractmethod
    async def answer(self, service: Service, request: Parsed, job: Job, result: Any) -> BaseModel:
        """The JSON answer of a finished job (files written on a render thread)."""

    @abstractmethod
    def headers(self, answer: Any) -> dict[str, str]:
        """The MIDI answer's own headers (besides the seed, the timings and the warnings)."""

    def note_source(self, service: Service, request: Parsed) -> NoteSource:
        """How the stream reports the notes of each sample (tasks with a stream route)."""
        raise NotImplementedError

    def start_fields(self, request: Parsed) -> dict[str, Any]:
        """The stream's `start` event's own fields (between settings and samples)."""
        return {}


async def render(
    service: Service, midis: list, write: Callable[[list], list[bytes]] | None = None
) -> list[bytes]:
    """The PrettyMIDIs' files (`write`, else pretty_midi's), written on a render thread (never on the loop,
    never in the engine)."""
    write = write or (lambda ms: [midi_bytes(m) for m in ms])
    return await anyio.to_thread.run_sync(lambda: write(midis), limiter=service.render_limiter)


async def finished_files(
    task: Task,
    service: Service,
    request: Parsed,
    job: Job,
    result: Any,
    what: str,
    write: Callable[[list], list[bytes]] | None = None,
) -> tuple[list[bytes], Timings]:
    """A finished job's files (rendered off the loop, by `write` where the task writes its own) and
    timings, logged once with `what` (the task's own figures, e.g. "span=12.00-18.00 s removed=22")."""
    rendered = await render(service, result.midis, write)
    timings = Timings(**job_timings(request, job, time.monotonic()))
    log.info(
        "%s: seed=%d %s queue=%.0f ms gen=%.0f ms",
        task.name, result.seed, what, timings.queue_ms, timings.generation_ms,
    )  # fmt: skip
    return rendered, timings


def job_timings(request: Parsed, job: Job, done: float) -> dict[str, float]:
    """The timings every answer has: parsing, the wait in the engine's queue, generation, all of it."""
    started = job.started_at or request.parsed
    return {
        "parse_ms": ms(request.parsed - request.start),
        "queue_ms": ms(started - request.parsed),
        "generation_ms": ms(job.generation_s),
        "total_ms": ms(done - request.start),
    }


async def parse(task: Task, service: Service, file: UploadFile, form: MusicForm) -> Parsed:
    """The upload parsed by the task and timed; its deadline starts here."""
    start = time.monotonic()
    data = await read_upload(file)
    form, job, found = await task.parse(service, data, form)
    parsed = time.monotonic()
    service.metrics.parse_seconds.observe(parsed - start)
    return Parsed(form, job, found, start, parsed, start + service.settings.request_timeout_s)


def submit(
    service: Service,
    request: Parsed | JobRequest,
    deadline: float,
    ticket: Ticket | None,
    on_progress: OnProgress = None,
) -> Job:
    """Queue the job (server/submit.py: 429 queue_full, 503 draining); `on_progress`: see
    GenerationWorker.submit."""
    assert service.worker is not None
    worker = service.worker
    job = request.job if isinstance(request, Parsed) else request
    return queue_job(service, lambda: worker.submit(job, deadline, on_progress), ticket)


async def run(
    task: Task,
    service: Service,
    file: UploadFile,
    form: MusicForm,
    ticket: Ticket | None,
    is_disconnected: Callable[[], Awaitable[bool]],
) -> BaseModel | None:
    """The whole plain request after admission: parse, queue, wait, answer; None when the client left."""
    request = await parse(task, service, file, form)
    job = submit(service, request, request.deadline, ticket)
    result = await wait_for_result(job, is_disconnected, service.settings.disconnect_poll_s, what=task.name)
    if result is None:
        log.info("%s: client disconnected; generation stopped", task.name)
        return None
    return await task.answer(service, request, job, result)


def as_midi(task: Task, answer: Any) -> Response:
    """Sample 0 as a MIDI file; the seed, the task's counts and the timings in headers."""
    timings: Timings = answer.timings
    headers = {
        "Content-Disposition": f'attachment; filename="{task.name}-{answer.seed}.mid"',
        "X-Musicrel-Seed": str(answer.seed),
        **task.headers(answer),
        "X-Musicrel-Timing-Parse-Ms": str(timings.parse_ms),
        "X-Musicrel-Timing-Queue-Ms": str(timings.queue_ms),
        "X-Musicrel-Timing-Generation-Ms": str(timings.generation_ms),
        "Server-Timing": f"parse;dur={timings.parse_ms}, queue;dur={timings.queue_ms}, "
        f"generate;dur={timings.generation_ms}, total;dur={timings.total_ms}",
    }
    if task.warnings_header and answer.warnings:
        headers["X-Musicrel-Warnings"] = str(len(answer.warnings))
    data = base64.b64decode(answer.samples[0].midi_base64)
    return Response(data, media_type="audio/midi", headers=headers)
