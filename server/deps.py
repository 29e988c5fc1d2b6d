"""Dependencies shared by the routes (full-stack template style: `XDep = Annotated[X, Depends(get_x)]`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Form, Request

from server.errors import ApiError
from server.schemas import ContinuationParams, MotifParams
from server.service import Service
from server.settings import Settings


def get_service(request: Request) -> Service:
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(get_service)]


def get_settings(service: ServiceDep) -> Settings:
    return service.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_params(
    form: Annotated[ContinuationParams, Form()], settings: SettingsDep, service: ServiceDep
) -> ContinuationParams:
    """The form fields, checked against the operator's limits on top of the schema's fixed bounds."""
    limits = (
        ("seconds", form.seconds, settings.max_seconds),
        ("primer_seconds", form.primer_seconds, settings.max_primer_seconds),
        ("num_samples", form.num_samples, min(settings.max_num_samples, settings.max_batch_rows)),
    )
    if service.codec is not None:
        limits += (("top_k", form.top_k or 0, service.codec.vocab_size),)
    for name, value, limit in limits:
        if value > limit:
            raise ApiError(
                422, "invalid_request", f"{name}: must be at most {limit:g} on this server", field=name
            )
    # Controls that cannot be honoured whatever the motif (a bad chord symbol, low above high) are refused
    # before the upload is parsed; those that depend on it ("auto" key, key and range) when it is.
    form.controls()
    return form


ParamsDep = Annotated[ContinuationParams, Depends(get_params)]


def get_motif_params(form: Annotated[MotifParams, Form()], settings: SettingsDep) -> ContinuationParams:
    """A motif's fields, as the continuation fields they stand for (the rest at their defaults)."""
    if form.primer_seconds > settings.max_primer_seconds:
        message = f"primer_seconds: must be at most {settings.max_primer_seconds:g} on this server"
        raise ApiError(422, "invalid_request", message, field="primer_seconds")
    return ContinuationParams(primer_seconds=form.primer_seconds, tracks=form.tracks)


MotifParamsDep = Annotated[ContinuationParams, Depends(get_motif_params)]


def wants_json(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return "application/json" in accept and "audio/midi" not in accept.split(",")[0]


WantsJsonDep = Annotated[bool, Depends(wants_json)]
