"""HTTP routes: the continuation endpoint, model info, examples, health, readiness and metrics."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import time
from functools import partial
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, File, Request, UploadFile
from fastapi.responses import FileResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from server.batcher import Job, QueueFullError, WorkerStoppedError
from server.deps import ParamsDep, ServiceDep, SettingsDep, WantsJsonDep
from server.errors import ApiError, error_response
from server.metrics import exposition_registry
from server.middleware import DRAINING_AT_ARRIVAL
from server.schemas import (
    BatchInfo,
    ContinuationParams,
    ContinuationResponse,
    ErrorResponse,
    Example,
    Health,
    ModelInfo,
    PrimerInfo,
    Sample,
    Timings,
)

log = logging.getLogger("musicrel.server")
router = APIRouter()

ERRORS: dict[int | str, dict[str, Any]] = {
    413: {"model": ErrorResponse, "description": "upload larger than MUSICREL_MAX_UPLOAD_BYTES (too_large)"},
    422: {
        "model": ErrorResponse,
        "description": "a field out of bounds (invalid_request) or unusable MIDI: not_midi, truncated, "
        "bad_data_byte, no_notes, smpte_division, zero_division, too_large, too_many_tracks, "
        "too_many_events, too_long",
    },
    429: {"model": ErrorResponse, "description": "the queue is full (queue_full); see Retry-After"},
    503: {"model": ErrorResponse, "description": "loading (not_ready) or shutting down (draining)"},
    504: {"model": ErrorResponse, "description": "past MUSICREL_REQUEST_TIMEOUT_S (timeout)"},
}
CLIENT_CLOSED = 499  # nginx's code for "the client went away"; nobody receives it, the metrics count it


def _ms(seconds: float) -> float:
    return round(1000 * seconds, 2)


async def _wait(request: Request, job: Job, poll_s: float) -> Any | None:
    """Await the job's result while watching the deadline and the client; None if the client left."""
    try:
        while not job.future.done():
            remaining = job.deadline - time.monotonic()
            if remaining <= 0:
                job.cancel("deadline")
                break
            await asyncio.wait({job.future}, timeout=min(poll_s, remaining))
            if not job.future.done() and await request.is_disconnected():
                job.cancel("disconnected")
                return None
    except asyncio.CancelledError:  # the server is cancelling this request (forced shutdown)
        job.cancel("cancelled")
        raise
    if job.stop_reason == "deadline":
        raise ApiError(504, "timeout", "the continuation did not finish within the request deadline")
    try:
        return job.future.result()
    except WorkerStoppedError as exc:
        raise ApiError(503, "draining", str(exc)) from exc


def _encode(result: Any) -> list[tuple[bytes, Sample]]:
    out = []
    for i, (midi, tokens) in enumerate(zip(result.midis, result.tokens, strict=True)):
        buffer = io.BytesIO()
        midi.write(buffer)
        data = buffer.getvalue()
        sample = Sample(
            index=i,
            midi_base64=base64.b64encode(data).decode("ascii"),
            new_tokens=len(tokens),
            notes=sum(len(inst.notes) for inst in midi.instruments),
            duration_s=round(float(midi.get_end_time()), 4),
        )
        out.append((data, sample))
    return out


@router.post(
    "/v1/continuations",
    summary="Continue an uploaded MIDI motif",
    response_model=ContinuationResponse,
    responses={
        200: {
            "content": {"audio/midi": {}},
            "description": "audio/midi (sample 0); JSON with every sample for Accept: application/json",
        },
        **ERRORS,
    },
)
async def create_continuation(
    request: Request,
    service: ServiceDep,
    params: ParamsDep,
    wants_json: WantsJsonDep,
    file: Annotated[UploadFile, File(description="the MIDI motif (Standard MIDI File)")],
) -> Any:
    from musicrel.primer import default_max_primer_tokens, prepare_primer
    from musicrel.sampling import SamplingParams

    service.check_accepting(request.scope.get(DRAINING_AT_ARRIVAL, service.draining))
    settings, metrics = service.settings, service.metrics
    start = time.monotonic()
    deadline = start + settings.request_timeout_s

    data = await file.read()
    prepare = partial(
        prepare_primer,
        service.codec,
        data,
        primer_seconds=params.primer_seconds,
        tracks=params.track_selection(),
        max_tokens=default_max_primer_tokens(service.model),
    )
    primer = await anyio.to_thread.run_sync(prepare, limiter=service.parse_limiter)
    parsed = time.monotonic()
    metrics.parse_seconds.observe(parsed - start)

    sampling = SamplingParams(
        seconds=params.seconds,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        seed=params.seed,
        num_samples=params.num_samples,
        include_primer=params.include_primer,
    )
    retry = {"Retry-After": str(settings.retry_after_s)}
    try:
        job = service.batcher.submit(primer, sampling, deadline)
    except QueueFullError as exc:
        metrics.rejected.labels("queue_full").inc()
        raise ApiError(429, "queue_full", f"server busy: {exc}; retry later", headers=retry) from exc
    except WorkerStoppedError as exc:
        raise ApiError(503, "draining", str(exc), headers=retry) from exc

    result = await _wait(request, job, settings.disconnect_poll_s)
    if result is None:
        log.info("client disconnected; generation stopped")
        return Response(status_code=CLIENT_CLOSED)

    rendered = await anyio.to_thread.run_sync(_encode, result, limiter=service.parse_limiter)
    done = time.monotonic()
    queue_s = (job.started_at or parsed) - parsed
    timings = Timings(
        parse_ms=_ms(parsed - start),
        queue_ms=_ms(queue_s),
        generation_ms=_ms(job.generation_s),
        total_ms=_ms(done - start),
        prefill_ms=_ms(result.timings["prefill"]) if "prefill" in result.timings else None,
        decode_ms=_ms(result.timings["decode"]) if "decode" in result.timings else None,
    )
    used = params.model_copy(update={"seed": int(result.seed)})
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
    if wants_json:
        return ContinuationResponse(
            seed=int(result.seed),
            settings=used,
            primer=PrimerInfo(
                tokens=int(result.primer_tokens),
                start_time=float(primer.start_time),
                end_time=float(primer.end_time),
                tempo=float(primer.tempo),
                program=int(primer.program),
                notes=len(primer.notes),
            ),
            samples=[sample for _, sample in rendered],
            new_tokens=int(result.new_tokens),
            stopped=bool(result.stopped),
            timings=timings,
            batch=BatchInfo(requests=job.batch_jobs, rows=job.batch_rows),
        )
    data0, sample0 = rendered[0]
    headers = {
        "Content-Disposition": f'attachment; filename="continuation-{result.seed}.mid"',
        "X-Musicrel-Seed": str(result.seed),
        "X-Musicrel-Tokens": str(sample0.new_tokens),
        "X-Musicrel-Primer-Tokens": str(result.primer_tokens),
        "X-Musicrel-Samples": str(len(rendered)),
        "X-Musicrel-Stopped": str(bool(result.stopped)).lower(),
        "X-Musicrel-Timing-Parse-Ms": str(timings.parse_ms),
        "X-Musicrel-Timing-Queue-Ms": str(timings.queue_ms),
        "X-Musicrel-Timing-Generation-Ms": str(timings.generation_ms),
        "Server-Timing": f"parse;dur={timings.parse_ms}, queue;dur={timings.queue_ms}, "
        f"generate;dur={timings.generation_ms}, total;dur={timings.total_ms}",
    }
    return Response(content=data0, media_type="audio/midi", headers=headers)


@router.get(
    "/v1/model", response_model=ModelInfo, summary="The loaded model, its codec and the server limits"
)
async def model_info(service: ServiceDep, settings: SettingsDep) -> Any:
    if not service.info:
        code, message = service.not_ready_reason()
        raise ApiError(503, code, message)
    limits = {
        "max_upload_bytes": settings.max_upload_bytes,
        "max_seconds": settings.max_seconds,
        "max_primer_seconds": settings.max_primer_seconds,
        "max_num_samples": min(settings.max_num_samples, settings.max_batch_rows),
        "max_queue": settings.max_queue,
        "max_batch_rows": settings.max_batch_rows,
        "batch_window_ms": settings.batch_window_ms,
        "request_timeout_s": settings.request_timeout_s,
        "defaults": ContinuationParams().model_dump(),
    }
    return {**service.info, "limits": limits}


@router.get("/v1/examples", response_model=list[Example], summary="Bundled example motifs for the web page")
async def examples(settings: SettingsDep) -> Any:
    folder = settings.static_dir / "examples"
    index = folder / "index.json"
    entries: list[dict[str, Any]] = []
    if index.is_file():
        try:
            entries = [e for e in json.loads(index.read_text()) if (folder / e["file"]).is_file()]
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring unreadable %s", index)
    if not entries and folder.is_dir():
        entries = [{"name": p.stem.replace("_", " "), "file": p.name} for p in sorted(folder.glob("*.mid"))]
    return [
        Example(
            name=e["name"],
            file=e["file"],
            url=f"/static/examples/{e['file']}",
            description=e.get("description", ""),
        )
        for e in entries
    ]


@router.get(
    "/healthz",
    response_model=Health,
    summary="Liveness: the process answers, and its generation worker has not failed for good",
    responses={503: {"model": ErrorResponse}},
)
async def healthz(service: ServiceDep) -> Any:
    if service.batcher is not None and service.batcher.failed:
        return error_response(503, "failed", service.batcher.failed)
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Health,
    summary="Readiness: 200 once the model is loaded and warmed up; 503 before and while draining",
    responses={503: {"model": ErrorResponse}},
)
async def readyz(service: ServiceDep) -> Any:
    if not service.ready:
        code, message = service.not_ready_reason()
        return error_response(
            503, code, message, headers={"Retry-After": str(service.settings.retry_after_s)}
        )
    return Health(status="ready")


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(service: ServiceDep) -> Response:
    if service.batcher is not None:
        service.metrics.queue_depth.set(service.batcher.queue_depth)
    return Response(generate_latest(exposition_registry(service.metrics)), media_type=CONTENT_TYPE_LATEST)


@router.get("/", include_in_schema=False)
async def index(settings: SettingsDep) -> Response:
    page = settings.static_dir / "index.html"
    if page.is_file():
        return FileResponse(page, media_type="text/html")
    return JSONResponse({"name": "musicrel", "docs": "/docs", "api": "/v1/continuations"})
