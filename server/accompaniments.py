"""POST /v1/accompaniments: a melody in (a MIDI file, and which of its tracks is the melody), the same file
out with a piano accompaniment on a track of its own (musicrel.generation.accompaniment).

The accompaniment model is a second checkpoint (MUSICREL_ACCOMPANY_CHECKPOINT), described at start-up when its
folder exists (server/model.py); without one the route answers 503 `no_accompaniment_model` and /v1/model says
`accompaniment: null`. Here: parse the melody (this process checks it and its track, so a bad file is refused
at once), submit an accompaniment job to the engine, which holds the model and runs it beside the
continuation batch (server/worker.py), and render the answer. It is admitted, queued (429), cancelled and
drained as a continuation is. The route is server/routes/accompaniments.py, its form's checks
`deps.get_accompaniment_params`.
"""

from __future__ import annotations

import base64
import io
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from fastapi import UploadFile
from fastapi.responses import Response

from musicrel.errors import InvalidMidiError
from musicrel.generation.controls import gm_program_name
from server.admission import Ticket
from server.errors import ApiError
from server.jobs import Accompany
from server.schemas import (
    AccompanimentParams,
    AccompanimentResponse,
    AccompanimentSample,
    AccompanimentTimings,
)
from server.service import Service
from server.submit import parse_on_thread, queue_job, read_upload, wait_for_result

log = logging.getLogger("musicrel.server")

# Errors about the melody track: the page shows them beside its track menu.
TRACK_CODES = frozenset({"which_track", "no_such_track", "melody_has_chords"})


def parse_melody(codec: Any, data: bytes, track: int | None, max_seconds: float) -> tuple[Any, int, int]:
    """(PrettyMIDI, melody track, melody notes) or InvalidMidiError; the library's own checks, run here before
    the job is queued so that a bad file is refused at once, with the server's length limit."""
    from musicrel.generation.melody import melody_notes, melody_track

    pm = codec.read(data)
    index = melody_track(pm, track)
    return pm, index, len(melody_notes(pm, index, max_seconds=max_seconds))


def _ms(seconds: float) -> float:
    return round(1000 * seconds, 2)


def _midi_bytes(pm: Any) -> bytes:
    buffer = io.BytesIO()
    pm.write(buffer)
    return buffer.getvalue()


async def accompany_upload(
    service: Service,
    file: UploadFile,
    params: AccompanimentParams,
    ticket: Ticket | None,
    is_disconnected: Callable[[], Awaitable[bool]],
) -> AccompanimentResponse | None:
    """The whole request after admission: parse, queue, wait, render; None when the client left."""
    settings = service.settings
    start = time.monotonic()
    deadline = start + settings.request_timeout_s
    pm, track, notes = await parse_upload(service, file, params)
    parsed = time.monotonic()
    service.metrics.parse_seconds.observe(parsed - start)

    assert service.worker is not None
    worker, request = service.worker, Accompany(pm, track, params.library_params())
    job = queue_job(service, lambda: worker.submit_accompaniment(request, deadline), ticket)
    result = await wait_for_result(job, is_disconnected, settings.disconnect_poll_s, what="accompaniment")
    if result is None:
        log.info("accompaniment: client disconnected; generation stopped")
        return None
    rendered = await anyio.to_thread.run_sync(
        lambda: [_midi_bytes(m) for m in result.midis], limiter=service.render_limiter
    )
    done = time.monotonic()
    started = job.started_at or parsed
    log.info(
        "accompaniment: seed=%d melody=%d notes, %.1f s, queue=%.0f ms gen=%.0f ms",
        result.seed,
        notes,
        result.seconds,
        1000 * (started - parsed),
        1000 * job.generation_s,
    )
    program = params.program if params.program is not None else 0
    return AccompanimentResponse(
        seed=int(result.seed),
        settings=params.model_copy(update={"seed": int(result.seed), "track": int(result.melody_track)}),
        melody_track=int(result.melody_track),
        melody_notes=notes,
        seconds=round(float(result.seconds), 4),
        real_time_factor=round(float(result.seconds) / max(job.generation_s, 1e-9), 3),
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
            generation_ms=_ms(job.generation_s),
            total_ms=_ms(done - start),
        ),
    )


async def parse_upload(
    service: Service, file: UploadFile, params: AccompanimentParams
) -> tuple[Any, int, int]:
    """The melody of the upload, on a parse thread within the request deadline: (PrettyMIDI, melody track,
    melody notes); 422 for an empty file or one that cannot be accompanied."""
    data = await read_upload(file)
    codec, seconds = service.accompaniment.codec, service.settings.max_melody_seconds
    try:
        return await parse_on_thread(service, parse_melody, codec, data, params.track, seconds)
    except InvalidMidiError as exc:
        # The library's code and status; the track's errors name the field the page shows them beside.
        raise ApiError(422, exc.code, str(exc), field="track" if exc.code in TRACK_CODES else None) from exc


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
