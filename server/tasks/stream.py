"""A task's stream route (POST <path>/stream), one for every task that has one: the plain route's upload,
limits and job, then the task's notes as NDJSON events (one JSON object per line) while they are generated.

Until the job is queued everything is as on the plain route, errors included (a plain JSON error with its
HTTP status: 413, 422, 429, 503, ...). Then the 200 goes out with these lines, `type` first:

- `start`: seed (drawn here when the request left it empty, so that it is known at once), settings, the
  task's own fields (a continuation's primer, an infill's start and end) and the number of samples;
- `note_on` {sample, id, pitch, velocity, time; a model with instruments adds track, the note's track in
  the answer's file, and instrument, 0-127 or 128 for drums} as soon as the note-on is generated;
  `note_off` {sample, id, time} when its end is known; `note_drop` {sample, id} for a strike the MIDI
  file leaves out (see musicrel/generation/streaming.py). Times are the answer's (`NoteSource.offset`):
  seconds from the start of a continuation, seconds of the file for an infill; a strike the answer leaves
  out (an infill's note under a kept one) is never reported;
- `result`: the plain JSON answer (every sample's MIDI in base64, timings, ...) plus `first_note_ms`;
- or `error` {status, error: {code, message}}: what the plain route would have answered (504 timeout,
  503 draining, 500 internal, ...); nothing follows it.

Each sample's notes, applied in order, are exactly the notes of its MIDI file in `result`.
The worker reports new tokens after every decoding step; lines are written as they are ready, several at
once when the loop was busy. When the client goes away the response is cancelled and so is the job: its rows
leave the batch at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import UploadFile
from starlette.responses import StreamingResponse
from starlette.types import Send

from musicrel.generation.sampling import draw_seed
from musicrel.generation.streaming import NoteEvent
from server.admission import Ticket
from server.errors import ApiError, describe
from server.jobs import Job, WorkerStoppedError
from server.schemas import MusicForm
from server.service import Service
from server.tasks.base import Parsed, Task, parse, submit

log = logging.getLogger("musicrel.server")

MEDIA_TYPE = "application/x-ndjson"


def line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


def note_line(sample: int, e: NoteEvent) -> bytes:
    if e.kind == "on":
        event = {"type": "note_on", "sample": sample, "id": e.id, "pitch": e.pitch, "velocity": e.velocity,
                 "time": round(e.time, 6)}  # fmt: skip
        if e.track is not None:  # a model with instruments: the note's track in the answer's file
            event["track"] = e.track
        if e.instrument is not None:  # and its instrument (a General MIDI program, 128: drums)
            event["instrument"] = e.instrument
    elif e.kind == "off":
        event = {"type": "note_off", "sample": sample, "id": e.id, "time": round(e.time, 6)}
    else:
        event = {"type": "note_drop", "sample": sample, "id": e.id}
    return line(event)


class TaskStream:
    """One streamed request of any task: collects the worker's progress (on the loop), writes the events."""

    def __init__(self, task: Task, service: Service, request: Parsed) -> None:
        self.task, self.service, self.request = task, service, request
        source = task.note_source(service, request)
        self.notes, self.offset, self.left_out = source.streams, source.offset, source.left_out
        n = len(self.notes)
        self.dropped: list[set[int]] = [set() for _ in range(n)]  # per sample, ids of the notes left out
        self.pending: list[list[int]] = [[] for _ in range(n)]  # reported, not yet decoded
        self.decoded = [0] * n  # tokens decoded so far, per sample
        self.first_note_at: float | None = None
        self.job: Job | None = None
        self._wake = asyncio.Event()
        self.deadline_message = f"the {task.name} did not finish within the request deadline"

    def progress(self, tokens: list[list[int]]) -> None:
        """on_progress, called on the loop: keep the new tokens for the writer."""
        for pending, new in zip(self.pending, tokens, strict=True):
            pending.extend(new)
        self._wake.set()

    def _events(self, i: int, events: list[NoteEvent]) -> list[bytes]:
        """Sample i's events in the answer's time, the strikes it leaves out dropped with their ends."""
        out = []
        for e in events:
            at = e.time + self.offset
            if e.kind == "on" and self.left_out is not None and self.left_out(e.pitch, at):
                self.dropped[i].add(e.id)
            if e.id not in self.dropped[i]:
                out.append(note_line(i, dataclasses.replace(e, time=at) if self.offset else e))
        return out

    def _decode(self) -> bytes:
        out = []
        for i, (stream, pending) in enumerate(zip(self.notes, self.pending, strict=True)):
            if pending:
                out += self._events(i, stream.feed(pending))
                self.decoded[i] += len(pending)
                pending.clear()
        if out and self.first_note_at is None and any(b'"note_on"' in line for line in out):
            self.first_note_at = time.monotonic()
        return b"".join(out)

    def _start_event(self) -> bytes:
        form = self.request.form
        return line({
            "type": "start", "seed": form.seed, "settings": form.model_dump(mode="json"),
            **self.task.start_fields(self.request), "samples": form.num_samples,
        })  # fmt: skip

    async def _result(self, result: Any) -> bytes:
        """The tokens the reports did not carry yet, the notes still open, then the result event."""
        assert self.job is not None
        tails = []
        for i, (stream, tokens) in enumerate(zip(self.notes, result.tokens, strict=True)):
            tails += self._events(i, stream.feed(tokens[self.decoded[i] :]) + stream.close())
        body = await self.task.answer(self.service, self.request, self.job, result)
        first = self.first_note_at
        first_ms = None if first is None else round(1000 * (first - self.request.start), 2)
        return b"".join(tails) + line(
            {"type": "result", **body.model_dump(mode="json"), "first_note_ms": first_ms}
        )

    async def events(self) -> AsyncIterator[bytes]:
        job = self.job
        assert job is not None and job.future is not None
        job.future.add_done_callback(lambda _: self._wake.set())
        try:
            yield self._start_event()
            while True:
                self._wake.clear()  # before decoding: a report that comes meanwhile wakes the next wait
                lines = self._decode()
                if lines:
                    yield lines
                if job.future.done():
                    break
                remaining = job.deadline - time.monotonic()
                if remaining <= 0:
                    job.cancel("deadline")
                    raise ApiError(504, "timeout", self.deadline_message)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), remaining)
            # The worker may reach the deadline first and end the job with what it has: still a timeout,
            # as on the plain route (under load this race answered a cut-short continuation as a result).
            if job.stop_reason == "deadline":
                raise ApiError(504, "timeout", self.deadline_message)
            try:
                result = job.future.result()
            except WorkerStoppedError as exc:
                raise ApiError(503, "draining", str(exc)) from exc
            yield await self._result(result)
        except Exception as exc:
            status, body = describe(exc)
            yield line({"type": "error", "status": status, **body})
        finally:
            # Cancelled (the client left, or a forced shutdown) or closed early: free the rows.
            if not job.future.done() and job.stop_reason is None:
                job.cancel("disconnected")
                log.info("%s stream client disconnected; generation stopped", self.task.name)


class NdjsonStream(StreamingResponse):
    """Closes its event iterator however the response ends: with ASGI servers that report a disconnect only
    as a failed send (spec 2.4), StreamingResponse leaves the iterator suspended and the job running."""

    media_type = MEDIA_TYPE

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


async def start_stream(
    task: Task, service: Service, file: UploadFile, form: MusicForm, ticket: Ticket | None
) -> NdjsonStream:
    """Parse and queue as the plain route does (its errors are plain HTTP errors), then the NDJSON."""
    if form.seed is None:  # drawn here, so that the start event can say it at once
        form = form.model_copy(update={"seed": draw_seed()})
    request = await parse(task, service, file, form)
    stream = TaskStream(task, service, request)
    stream.job = submit(service, request, request.deadline, ticket, stream.progress)
    headers = {
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",  # nginx would otherwise hold the lines back until its buffer fills
        "X-Musicrel-Seed": str(request.form.seed),
    }
    return NdjsonStream(stream.events(), headers=headers)
