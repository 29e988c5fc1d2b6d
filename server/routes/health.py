"""What the platform polls: GET /healthz (liveness), /readyz (readiness) and /metrics (Prometheus)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from server.deps import ServiceDep
from server.errors import error_response
from server.metrics import exposition_registry
from server.schemas import ErrorResponse, Health

router = APIRouter()


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
