"""POST /v1/motifs: a motif parsed and its primer prefilled ahead of its continuations."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, File, Request, UploadFile
from fastapi.responses import Response

from server.deps import MotifParamsDep, ServiceDep
from server.errors import CLIENT_CLOSED
from server.middleware import ADMISSION_TICKET
from server.routes.uploads import ERRORS, FILE_SCHEMA
from server.schemas import PreparedMotif
from server.tasks import continuation

router = APIRouter()
MOTIFS_PATH = "/v1/motifs"
MotifFile = Annotated[
    UploadFile, File(description=continuation.CONTINUATION.file_description, json_schema_extra=FILE_SCHEMA)
]


@router.post(
    MOTIFS_PATH,
    summary="Prepare a motif: parse it and prefill its primer ahead of its continuations",
    response_model=PreparedMotif,
    responses=ERRORS,
)
async def prepare_motif(
    request: Request,
    service: ServiceDep,
    params: MotifParamsDep,
    file: MotifFile,
) -> Any:
    """What the page sends when a motif is chosen, before Continue is pressed: the continuations of the same
    file with the same `primer_seconds`, `motif_end` and `tracks` then skip parsing and prefill (the server
    keeps the last `MUSICREL_PRIMER_CACHE` motifs, least recently used out first). Its answer says what the
    model will read of the file (`primer`), before anything is generated. Admitted, bounded and drained as a
    continuation is; a motif already prepared costs nothing (`cached`)."""
    prepared = await continuation.prepare_motif(
        service, file, params, request.scope.get(ADMISSION_TICKET), request.is_disconnected
    )
    if prepared is None:
        return Response(status_code=CLIENT_CLOSED)
    return prepared
