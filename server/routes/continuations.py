"""POST /v1/continuations and /v1/continuations/stream: a motif in, its continuations out (whole, or their
notes as NDJSON while they are generated)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, File, Request, UploadFile
from fastapi.responses import Response

from server import continuations, streams
from server.deps import ParamsDep, ServiceDep, WantsJsonDep
from server.errors import CLIENT_CLOSED
from server.middleware import ADMISSION_TICKET
from server.routes.uploads import ERRORS, FILE_SCHEMA, JSON_ERRORS
from server.schemas import ContinuationResponse

router = APIRouter()

FILE_DESCRIPTION = (
    "the MIDI motif: a Standard MIDI File (it starts with MThd). An empty part is out of bounds (422 "
    "invalid_request); bytes that are not usable MIDI get 422 with the codec's code (not_midi, ...)"
)
MotifFile = Annotated[UploadFile, File(description=FILE_DESCRIPTION, json_schema_extra=FILE_SCHEMA)]


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
    file: MotifFile,
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
    file: MotifFile,
) -> Response:
    return await streams.start_stream(service, file, params, request.scope.get(ADMISSION_TICKET))
