"""GET /v1/model: a short summary of each loaded model, its codec and the server's limits (what the page
builds its form from); and each model's card (its checkpoint's MODEL_CARD.md) at a URL of its own."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.deps import ServiceDep, SettingsDep
from server.errors import ApiError
from server.schemas import ContinuationParams, ErrorResponse, ModelInfo
from server.service import MODELS, Service

router = APIRouter()

CARD_PATH = "/v1/model/card"  # the continuation model's; the others' at /v1/model/{name}/card
CARD_TYPE = "text/markdown; charset=utf-8"


def card_url(service: Service, name: str) -> str | None:
    """Where the model `name`'s card is served; None when its checkpoint has none."""
    card = service.model_card(name)
    if card is None or card.text is None:
        return None
    return CARD_PATH if name == "continuation" else f"/v1/model/{name}/card"


def _with_card(service: Service, name: str, info: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if info is None else {**info, "card_url": card_url(service, name)}


def _loaded(service: Service) -> None:
    """503 until the engine has loaded the models (the HTTP process holds none)."""
    if not service.info:
        code, message = service.not_ready_reason()
        raise ApiError(503, code, message)


@router.get(
    "/v1/model",
    response_model=ModelInfo,
    summary="The loaded models in short, their codec, the server limits",
)
async def model_info(request: Request, service: ServiceDep, settings: SettingsDep) -> Any:
    _loaded(service)
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
        "card_url": card_url(service, "continuation"),
        "limits": limits,
        "accompaniment": _with_card(service, "accompaniment", service.accompaniment_info()),
        "infill": _with_card(service, "infill", service.infill_info()),
        "instruments": _with_card(service, "instruments", service.instruments_info()),
    }


CARD_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/markdown": {}}, "description": "the model card, Markdown"},
    404: {
        "model": ErrorResponse,
        "description": "the server has no such model (no_such_model), or its checkpoint has no card "
        "(no_card)",
    },
    503: {"model": ErrorResponse, "description": "the models are not loaded yet (not_ready)"},
}


def _card(service: Service, name: str) -> Response:
    _loaded(service)
    card = service.model_card(name) if name in MODELS else None
    if card is None:
        names = ", ".join(n for n in MODELS if service.model_card(n) is not None)
        raise ApiError(404, "no_such_model", f"this server has no {name!r} model (it has: {names})")
    if card.text is None:
        raise ApiError(404, "no_card", f"the {name} model's checkpoint has no model card")
    return Response(card.text, media_type=CARD_TYPE)


@router.get(
    CARD_PATH,
    summary="The continuation model's card (its MODEL_CARD.md)",
    response_class=Response,
    responses=CARD_RESPONSES,
)
async def model_card(service: ServiceDep) -> Response:
    return _card(service, "continuation")


@router.get(
    "/v1/model/{name}/card",
    summary="A model's card: continuation, accompaniment, infill or instruments",
    response_class=Response,
    responses=CARD_RESPONSES,
)
async def named_model_card(name: str, service: ServiceDep) -> Response:
    return _card(service, name)
