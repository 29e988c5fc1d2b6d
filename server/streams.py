"""The service layer behind POST /v1/continuations/stream: the plain endpoint's upload, limits and job, then
the continuation as NDJSON events (one JSON object per line) while it is generated.

Until the job is queued everything is as on the plain endpoint, errors included (a plain JSON error with
its HTTP status: 413, 422, 429, 503, ...). Then the 200 goes out with these lines, `type` first:

- `start`: seed (drawn here when the request left it empty, so that it is known at once), settings, primer
  (as in the plain response) and the number of samples;
- `note_on` {sample, id, pitch, velocity, time} as soon as the note-on is generated; `note_off` {sample, id,
  time} when its end is known; `note_drop` {sample, id} for a strike the MIDI file leaves out (see
  musicrel/generation/streaming.py). Times are seconds from the start of the continuation;
- `result`: the plain JSON response (every sample's MIDI in base64, timings, ...) plus `first_note_ms`;
- or `error` {status, error: {code, message}}: what the plain endpoint would have answered (504 timeout,
  503 draining, 500 internal, ...); nothing follows it.

Each sample's notes, applied in order, are exactly the notes of its MIDI file in `result`.
The worker reports new tokens after every decoding step; lines are written as they are ready, several at
once when the loop was busy. When the client goes away the response is cancelled and so is the job: its rows
leave the batch at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import UploadFile
from starlette.responses import StreamingResponse
from starlette.types import Send

from musicrel.generation.primer import Primer
from musicrel.generation.sampling import draw_seed
from musicrel.generation.streaming import NoteEvent, NoteStream
from server.admission import Ticket
from server.continuations import as_json, finish, parse_upload, primer_info, submit
from server.errors import ApiError, describe
from server.jobs import Job, WorkerStoppedError
from server.schemas import ContinuationParams
from server.service import Service

if TYPE_CHECKING:
    from musicrel.generation.sampling import ContinuationResult

log = logging.getLogger("musicrel.server")

MEDIA_TYPE = "application/x-ndjson"
DEADLINE_MESSAGE = "the continuation did not finish within the request deadline"


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


def _note_line(sample: int, e: NoteEvent) -> bytes:
    if e.kind == "on":
        event = {"type": "note_on", "sample": sample, "id": e.id, "pitch": e.pitch, "velocity": e.velocity,
                 "time": round(e.time, 6)}  # fmt: skip
    elif e.kind == "off":
        event = {"type": "note_off", "sample": sample, "id": e.id, "time": round(e.time, 6)}
    else:
        event = {"type": "note_drop", "sample": sample, "id": e.id}
    return _line(event)


class ContinuationStream:
    """One streamed continuation: collects the worker's progress (on the loop) and writes the events."""

    def __init__(
        self, service: Service, params: ContinuationParams, primer: Primer, start: float, parsed: float
    ) -> None:
        self.service, self.params, self.primer = service, params, primer
        self.start, self.parsed = start, parsed
        self.job: Job | None = None
        assert service.codec is not None
        self.notes = [
            NoteStream(service.codec, primer.tokens, primer.tail_steps) for _ in range(params.num_samples)
        ]
        self.pending: list[list[int]] = [[] for _ in range(params.num_samples)]  # reported, not yet decoded
        self.decoded = [0] * params.num_samples  # tokens decoded so far, per sample
        self.first_note_at: float | None = None
        self._wake = asyncio.Event()

    def progress(self, tokens: list[list[int]]) -> None:
        """on_progress, called on the loop: keep the new tokens for the writer."""
        for pending, new in zip(self.pending, tokens, strict=True):
            pending.extend(new)
        self._wake.set()

    def _decode(self) -> bytes:
        out = []
        for i, (stream, pending) in enumerate(zip(self.notes, self.pending, strict=True)):
            if pending:
                out += [_note_line(i, e) for e in stream.feed(pending)]
                self.decoded[i] += len(pending)
                pending.clear()
        if out and self.first_note_at is None and any(b'"note_on"' in line for line in out):
            self.first_note_at = time.monotonic()
        return b"".join(out)

    def _start_event(self) -> bytes:
        primer = primer_info(self.primer, len(self.primer.tokens))
        return _line({
            "type": "start", "seed": self.params.seed, "settings": self.params.model_dump(mode="json"),
            "primer": primer.model_dump(mode="json"), "samples": self.params.num_samples,
        })  # fmt: skip

    async def _result(self, result: ContinuationResult) -> bytes:
        """The tokens the reports did not carry yet, the notes still open, then the result event."""
        assert self.job is not None
        tails = []
        for i, (stream, tokens) in enumerate(zip(self.notes, result.tokens, strict=True)):
            events = stream.feed(tokens[self.decoded[i] :]) + stream.close()
            tails += [_note_line(i, e) for e in events]
        c = await finish(self.service, self.params, self.primer, self.job, result, self.start, self.parsed)
        first = None if self.first_note_at is None else round(1000 * (self.first_note_at - self.start), 2)
        body = as_json(c).model_dump(mode="json")
        return b"".join(tails) + _line({"type": "result", **body, "first_note_ms": first})

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
                    raise ApiError(504, "timeout", DEADLINE_MESSAGE)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), remaining)
            # The worker may reach the deadline first and end the job with what it has: still a timeout,
            # as on the plain endpoint (under load this race answered a cut-short continuation as a result).
            if job.stop_reason == "deadline":
                raise ApiError(504, "timeout", DEADLINE_MESSAGE)
            try:
                result = job.future.result()
            except WorkerStoppedError as exc:
                raise ApiError(503, "draining", str(exc)) from exc
            yield await self._result(result)
        except Exception as exc:
            status, body = describe(exc)
            yield _line({"type": "error", "status": status, **body})
        finally:
            # Cancelled (the client left, or a forced shutdown) or closed early: free the rows.
            if not job.future.done() and job.stop_reason is None:
                job.cancel("disconnected")
                log.info("stream client disconnected; generation stopped")


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
    service: Service, file: UploadFile, params: ContinuationParams, ticket: Ticket | None
) -> NdjsonStream:
    """Parse and queue as the plain endpoint does (its errors are plain HTTP errors), then the response."""
    start = time.monotonic()
    deadline = start + service.settings.request_timeout_s
    primer = await parse_upload(service, file, params)
    parsed = time.monotonic()
    service.metrics.parse_seconds.observe(parsed - start)
    if params.seed is None:
        params = params.model_copy(update={"seed": draw_seed()})
    stream = ContinuationStream(service, params, primer, start, parsed)
    stream.job = submit(service, primer, params.library_params(), deadline, ticket, stream.progress)
    headers = {
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",  # nginx would otherwise hold the lines back until its buffer fills
        "X-Musicrel-Seed": str(params.seed),
    }
    return NdjsonStream(stream.events(), headers=headers)
