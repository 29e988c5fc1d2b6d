"""GET /v1/model: the loaded model, its codec and the server's limits (what the page builds its form from)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from server.deps import ServiceDep, SettingsDep
from server.errors import ApiError
from server.schemas import ContinuationParams, ModelInfo

router = APIRouter()


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
    return {
        **service.info,
        "limits": limits,
        "accompaniment": service.accompaniment_info(),
        "infill": service.infill_info(),
    }
