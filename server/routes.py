"""HTTP routes: the continuation endpoints (plain and streamed), model info, examples, health, readiness
and metrics."""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from fastapi import APIRouter, File, Request, UploadFile
from fastapi.responses import FileResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from server import continuations, streams
from server.deps import MotifParamsDep, ParamsDep, ServiceDep, SettingsDep, WantsJsonDep
from server.errors import CLIENT_CLOSED, ApiError, error_response
from server.metrics import exposition_registry
from server.middleware import ADMISSION_TICKET
from server.schemas import (
    ContinuationParams,
    ContinuationResponse,
    ErrorResponse,
    Example,
    Health,
    ModelInfo,
    PreparedMotif,
)

log = logging.getLogger("musicrel.server")
router = APIRouter()

FILE_DESCRIPTION = (
    "the MIDI motif: a Standard MIDI File (it starts with MThd). An empty part is out of bounds (422 "
    "invalid_request); bytes that are not usable MIDI get 422 with the codec's code (not_midi, ...)"
)
# The part's schema says what the route accepts: at least one byte of a MIDI file, sent as a file part (with a
# filename). Without `format: binary` (OpenAPI 3.1 reads contentMediaType other than octet-stream as annotated
# text) clients such as schemathesis send a plain field, which the route refuses (422 "Expected UploadFile").
FILE_SCHEMA = {"minLength": 1, "format": "binary", "contentMediaType": "audio/midi"}
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {
        "model": ErrorResponse,
        "description": "a malformed body, e.g. a multipart body cut short before its closing boundary "
        "(bad_request)",
    },
    408: {
        "model": ErrorResponse,
        "description": "the upload came slower than MUSICREL_UPLOAD_MIN_BYTES_PER_S after "
        "MUSICREL_UPLOAD_GRACE_S, or took longer than MUSICREL_UPLOAD_TIMEOUT_S (upload_timeout)",
    },
    413: {"model": ErrorResponse, "description": "upload larger than MUSICREL_MAX_UPLOAD_BYTES (too_large)"},
    422: {
        "model": ErrorResponse,
        "description": "a field out of bounds or an empty file (invalid_request), or bytes that are not "
        "usable MIDI: not_midi, truncated, bad_data_byte, no_notes, smpte_division, zero_division, "
        "too_large, too_many_tracks, too_many_events, too_long",
    },
    429: {
        "model": ErrorResponse,
        "description": "the queue is full (queue_full; Retry-After from the queue's measured drain rate) or "
        "too many uploads are in progress (too_many_uploads)",
    },
    503: {"model": ErrorResponse, "description": "loading (not_ready) or shutting down (draining)"},
    504: {"model": ErrorResponse, "description": "past MUSICREL_REQUEST_TIMEOUT_S (timeout)"},
}
# The stream route's own media type is NDJSON; its errors (before the job is queued) are plain JSON.
JSON_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {
        "description": spec["description"],
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
    }
    for status, spec in ERRORS.items()
}


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
    file: Annotated[UploadFile, File(description=FILE_DESCRIPTION, json_schema_extra=FILE_SCHEMA)],
) -> Any:
    continuation = await continuations.continue_upload(
        service, file, params, request.scope.get(ADMISSION_TICKET), request.is_disconnected
    )
    if continuation is None:
        return Response(status_code=CLIENT_CLOSED)
    return continuations.as_json(continuation) if wants_json else continuations.as_midi(continuation)


@router.post(
    "/v1/continuations/stream",
    summary="Continue an uploaded MIDI motif, streaming its notes as they are generated",
    response_class=streams.NdjsonStream,
    responses={
        200: {
            "content": {streams.MEDIA_TYPE: {}},
            "description": "NDJSON events, one JSON object per line: `start` (seed, settings, primer), "
            "`note_on` / `note_off` / `note_drop` per sample as generation goes, then `result` (the plain "
            "JSON response, every sample's MIDI in base64) or `error` (status and the error body the plain "
            "endpoint would have answered). Failures before the job is queued are plain JSON errors.",
        },
        **JSON_ERRORS,
    },
)
async def stream_continuation(
    request: Request,
    service: ServiceDep,
    params: ParamsDep,
    file: Annotated[UploadFile, File(description=FILE_DESCRIPTION, json_schema_extra=FILE_SCHEMA)],
) -> Response:
    return await streams.start_stream(service, file, params, request.scope.get(ADMISSION_TICKET))


@router.post(
    "/v1/motifs",
    summary="Prepare a motif: parse it and prefill its primer ahead of its continuations",
    response_model=PreparedMotif,
    responses=ERRORS,
)
async def prepare_motif(
    request: Request,
    service: ServiceDep,
    params: MotifParamsDep,
    file: Annotated[UploadFile, File(description=FILE_DESCRIPTION, json_schema_extra=FILE_SCHEMA)],
) -> Any:
    """What the page sends when a motif is chosen, before Continue is pressed: the continuations of the same
    file with the same `primer_seconds`, `motif_end` and `tracks` then skip parsing and prefill (the server
    keeps the last `MUSICREL_PRIMER_CACHE` motifs, least recently used out first). Its answer says what the
    model will read of the file (`primer`), before anything is generated. Admitted, bounded and drained as a
    continuation is; a motif already prepared costs nothing (`cached`)."""
    prepared = await continuations.prepare_motif(
        service, file, params, request.scope.get(ADMISSION_TICKET), request.is_disconnected
    )
    if prepared is None:
        return Response(status_code=CLIENT_CLOSED)
    return prepared


@router.get(
    "/v1/model", response_model=ModelInfo, summary="The loaded model, its codec and the server limits"
)
async def model_info(request: Request, service: ServiceDep, settings: SettingsDep) -> Any:
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
    return {**service.info, "limits": limits, "accompaniment": service.accompaniment_info()}


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
    if service.worker is not None and service.worker.failed:
        return error_response(503, "failed", service.worker.failed)
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
    if service.worker is not None:
        service.metrics.queue_depth.set(service.worker.queue_depth)
    return Response(generate_latest(exposition_registry(service.metrics)), media_type=CONTENT_TYPE_LATEST)


@router.get("/", include_in_schema=False)
async def index(settings: SettingsDep) -> Response:
    page = settings.static_dir / "index.html"
    if page.is_file():
        return FileResponse(page, media_type="text/html")
    return JSONResponse({"name": "musicrel", "docs": "/docs", "api": "/v1/continuations"})
