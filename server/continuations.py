"""The service layer behind POST /v1/continuations (the route only wires HTTP to it): parse the upload,
build the sampling parameters, submit to the generation worker, wait while watching the client and the
deadline, and shape the answer as MIDI or JSON."""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import anyio
from fastapi import UploadFile
from fastapi.responses import Response

from musicrel.evaluation.novelty import longest_copy
from musicrel.generation.controls import gm_program_name
from musicrel.generation.primer import Primer, prepare_primer, render_result
from musicrel.generation.sampling import SamplingParams
from server.admission import Ticket
from server.errors import ApiError
from server.jobs import Job
from server.schemas import (
    BatchInfo,
    ContinuationParams,
    ContinuationResponse,
    Copy,
    InstrumentInfo,
    PreparedMotif,
    PrimerInfo,
    Sample,
    Timings,
)
from server.service import Service
from server.submit import PARSE_TIMEOUT, queue_job, read_upload, wait_for_result

if TYPE_CHECKING:
    from musicrel.generation.sampling import ContinuationResult

log = logging.getLogger("musicrel.server")


@dataclass
class Continuation:
    """A finished continuation: what the route answers with, as MIDI (`as_midi`) or JSON (`as_json`)."""

    primer: Primer
    job: Job
    result: ContinuationResult
    rendered: list[tuple[bytes, Sample]]  # each sample's MIDI file and its description
    timings: Timings
    settings: ContinuationParams  # as used: the seed filled in


def _ms(seconds: float) -> float:
    return round(1000 * seconds, 2)


def primer_key(data: bytes, params: ContinuationParams) -> tuple:
    return (hashlib.sha256(data).digest(), params.primer_seconds, params.motif_end, params.tracks)


async def parse_upload(service: Service, file: UploadFile, params: ContinuationParams) -> Primer:
    """The motif to continue (on a parse thread, unless it is one of the last MUSICREL_PRIMER_CACHE motifs
    parsed with the same primer settings); the codec's InvalidMidiError for unusable MIDI."""
    data = await read_upload(file)
    assert service.codec is not None and service.view is not None  # admitted only once loaded
    # The same motif again (a re-roll with another seed) is not parsed again: a dense file's parse and
    # primer window take 100-600 ms on 2 busy cores, most of the wait for a streamed first note.
    key = primer_key(data, params)
    primer = service.parsed_primers.get(key)
    if primer is not None:
        return primer
    prepare = partial(
        prepare_primer,
        service.codec,
        data,
        primer_seconds=params.primer_seconds,
        tracks=params.track_selection(),
        max_tokens=service.view.max_primer_tokens,
        motif_end=params.motif_end,
    )
    # Abandoned on cancel (the request's deadline): a parse that hangs then costs its own request and a
    # thread, not a place in the parse limiter for every later upload.
    primer = await anyio.to_thread.run_sync(prepare, limiter=service.parse_limiter, abandon_on_cancel=True)
    service.parsed_primers.put(key, primer)
    return primer


# Preparing a motif decodes one token: enough for the engine to prefill the primer and keep its K/V.
PREPARE_SAMPLING = SamplingParams(seconds=0.01, max_new_tokens=1, seed=0, num_samples=1)


async def prepare_motif(
    service: Service,
    file: UploadFile,
    params: ContinuationParams,
    ticket: Ticket | None,
    is_disconnected: Callable[[], Awaitable[bool]],
) -> PreparedMotif | None:
    """Parse the motif and prefill its primer now, so that a continuation of it (the same bytes,
    primer_seconds, motif_end and tracks) finds both in the caches (MUSICREL_PRIMER_CACHE, least recently
    used first out) and starts decoding at once. None when the client left."""
    start = time.monotonic()
    data = await file.read()
    await file.seek(0)
    cached = primer_key(data, params) in service.parsed_primers
    primer = await parse_upload(service, file, params)
    parsed = time.monotonic()
    prefill_ms = None
    if not cached:
        deadline = start + service.settings.request_timeout_s
        job = submit(service, primer, PREPARE_SAMPLING, deadline, ticket)
        result = await wait_for_result(job, is_disconnected, service.settings.disconnect_poll_s)
        if result is None:
            return None
        prefill_ms = _ms(result.timings["prefill"]) if "prefill" in result.timings else None
    return PreparedMotif(
        sha256=hashlib.sha256(data).hexdigest(),
        primer=primer_info(primer, len(primer.tokens)),
        cached=cached,
        parse_ms=_ms(parsed - start),
        prefill_ms=prefill_ms,
    )


def primer_info(primer: Primer, tokens: int) -> PrimerInfo:
    return PrimerInfo(
        tokens=int(tokens),
        start_time=float(primer.start_time),
        end_time=float(primer.end_time),
        requested_seconds=float(primer.requested_seconds or primer.end_time - primer.start_time),
        cropped=bool(primer.cropped),
        tempo=float(primer.tempo),
        program=int(primer.program),
        instrument=gm_program_name(primer.program),
        program_reason=primer.program_reason,
        notes=len(primer.notes),
    )


def instrument_info(primer: Primer, applied: dict | None) -> InstrumentInfo:
    """The instrument the samples are written with: the program field's when set, else the motif's."""
    if applied and "program" in applied:
        return InstrumentInfo(
            program=applied["program"], name=applied["instrument"], reason="the program field"
        )
    program = int(primer.program)
    return InstrumentInfo(program=program, name=gm_program_name(program), reason=primer.program_reason)


def submit(
    service: Service,
    primer: Primer,
    sampling: SamplingParams,
    deadline: float,
    ticket: Ticket | None,
    on_progress: Callable[[list[list[int]]], None] | None = None,
) -> Job:
    """Queue the continuation (server/submit.py). `on_progress`: see GenerationWorker.submit."""
    assert service.worker is not None
    worker = service.worker
    return queue_job(
        service, lambda: worker.submit(primer, sampling, deadline, on_progress=on_progress), ticket
    )


def write_samples(
    codec, primer: Primer, job: Job, result: ContinuationResult, novelty=None
) -> list[tuple[bytes, Sample]]:
    """Each sample's MIDI file (rendered from its tokens here, on a render thread, never in the decoding
    loop) and its description; with a novelty index, what it copied (the generated notes alone: the motif
    may itself be a training piece)."""
    out = []
    midis = render_result(codec, primer, result, job.params.include_primer)
    for i, (midi, tokens) in enumerate(zip(midis, result.tokens, strict=True)):
        buffer = io.BytesIO()
        midi.write(buffer)
        data = buffer.getvalue()
        sample = Sample(
            index=i,
            midi_base64=base64.b64encode(data).decode("ascii"),
            new_tokens=len(tokens),
            notes=sum(len(inst.notes) for inst in midi.instruments),
            duration_s=round(float(midi.get_end_time()), 4),
            novelty=None if novelty is None else Copy(**longest_copy(novelty, codec, tokens)),
        )
        out.append((data, sample))
    return out


async def continue_upload(
    service: Service,
    file: UploadFile,
    params: ContinuationParams,
    ticket: Ticket | None,
    is_disconnected: Callable[[], Awaitable[bool]],
) -> Continuation | None:
    """The whole request after admission; None when the client left before the result."""
    settings, metrics = service.settings, service.metrics
    start = time.monotonic()
    deadline = start + settings.request_timeout_s
    try:
        with anyio.fail_after(settings.request_timeout_s):
            primer = await parse_upload(service, file, params)
    except TimeoutError as exc:
        raise ApiError(504, "timeout", PARSE_TIMEOUT) from exc
    parsed = time.monotonic()
    metrics.parse_seconds.observe(parsed - start)

    job = submit(service, primer, params.library_params(), deadline, ticket)
    result = await wait_for_result(job, is_disconnected, settings.disconnect_poll_s)
    if result is None:
        log.info("client disconnected; generation stopped")
        return None

    return await finish(service, params, primer, job, result, start, parsed)


async def finish(
    service: Service,
    params: ContinuationParams,
    primer: Primer,
    job: Job,
    result: ContinuationResult,
    start: float,
    parsed: float,
) -> Continuation:
    """Write the samples' MIDI (on a render thread) and measure: the finished continuation."""
    rendered = await anyio.to_thread.run_sync(
        write_samples, service.codec, primer, job, result, service.novelty, limiter=service.render_limiter
    )
    done = time.monotonic()
    timings = Timings(
        parse_ms=_ms(parsed - start),
        queue_ms=_ms((job.started_at or parsed) - parsed),
        generation_ms=_ms(job.generation_s),
        total_ms=_ms(done - start),
        prefill_ms=_ms(result.timings["prefill"]) if "prefill" in result.timings else None,
        decode_ms=_ms(result.timings["decode"]) if "decode" in result.timings else None,
    )
    log.info(
        "continuation: seed=%d primer=%d new=%d batch=%d/%d parse=%.0fms queue=%.0fms gen=%.0fms",
        result.seed,
        result.primer_tokens,
        result.new_tokens,
        job.batch_jobs,
        job.batch_rows,
        timings.parse_ms,
        timings.queue_ms,
        timings.generation_ms,
    )
    used = params.model_copy(update={"seed": int(result.seed)})
    return Continuation(primer, job, result, rendered, timings, used)


def as_json(c: Continuation) -> ContinuationResponse:
    primer, result = c.primer, c.result
    return ContinuationResponse(
        seed=int(result.seed),
        settings=c.settings,
        primer=primer_info(primer, result.primer_tokens),
        samples=[sample for _, sample in c.rendered],
        new_tokens=int(result.new_tokens),
        stopped=bool(result.stopped),
        instrument=instrument_info(primer, result.controls),
        controls=result.controls,
        warnings=list(result.warnings),
        timings=c.timings,
        batch=BatchInfo(requests=c.job.batch_jobs, rows=c.job.batch_rows),
    )


def as_midi(c: Continuation) -> Response:
    """The first sample as a MIDI file; seed, token counts and timings in headers."""
    result, timings = c.result, c.timings
    data, sample = c.rendered[0]
    headers = {
        "Content-Disposition": f'attachment; filename="continuation-{result.seed}.mid"',
        "X-Musicrel-Seed": str(result.seed),
        "X-Musicrel-Tokens": str(sample.new_tokens),
        "X-Musicrel-Primer-Tokens": str(result.primer_tokens),
        "X-Musicrel-Samples": str(len(c.rendered)),
        "X-Musicrel-Stopped": str(bool(result.stopped)).lower(),
        "X-Musicrel-Timing-Parse-Ms": str(timings.parse_ms),
        "X-Musicrel-Timing-Queue-Ms": str(timings.queue_ms),
        "X-Musicrel-Timing-Generation-Ms": str(timings.generation_ms),
        "Server-Timing": f"parse;dur={timings.parse_ms}, queue;dur={timings.queue_ms}, "
        f"generate;dur={timings.generation_ms}, total;dur={timings.total_ms}",
    }
    return Response(content=data, media_type="audio/midi", headers=headers)
