"""Dependencies shared by the routes (full-stack template style: `XDep = Annotated[X, Depends(get_x)]`)."""

from __future__ import annotations

import difflib
from typing import Annotated

from fastapi import Depends, Form, Request
from pydantic import BaseModel

from server.errors import ApiError, in_bars, limit_message
from server.openapi import form_limits
from server.schemas import AccompanimentParams, ContinuationParams, InfillParams, MotifParams
from server.service import Service
from server.settings import Settings


def get_service(request: Request) -> Service:
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(get_service)]


def get_settings(service: ServiceDep) -> Settings:
    return service.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


async def refuse_unknown_fields(request: Request, model: type[BaseModel]) -> None:
    """422 naming the first form field `model` does not have: a typo (`temprature`) silently did nothing.
    (The model itself cannot forbid extras: FastAPI hands it the `file` part too.) The form is parsed
    already, so reading it again costs nothing."""
    known = set(model.model_fields) | {"file"}
    unknown = [name for name in await request.form() if name not in known]
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f" (did you mean {close[0]}?)" if close else f" (fields: {', '.join(sorted(known))})"
        raise ApiError(422, "invalid_request", f"{name}: no such field{hint}", field=name)


async def get_params(
    form: Annotated[ContinuationParams, Form()], settings: SettingsDep, service: ServiceDep, request: Request
) -> ContinuationParams:
    """The form fields, checked against the operator's limits on top of the schema's fixed bounds."""
    await refuse_unknown_fields(request, ContinuationParams)
    limits = form_limits(settings, service.codec.vocab_size if service.codec is not None else None)
    for name, limit in limits.items():
        value = getattr(form, name) or 0
        if value > limit:
            raise ApiError(422, "invalid_request", limit_message(name, limit), field=name)
    # Controls that cannot be honoured whatever the motif (a bad chord symbol, low above high) are refused
    # before the upload is parsed; those that depend on it ("auto" key, key and range) when it is.
    form.controls()
    return form


ParamsDep = Annotated[ContinuationParams, Depends(get_params)]


async def get_motif_params(
    form: Annotated[MotifParams, Form()], settings: SettingsDep, request: Request
) -> ContinuationParams:
    """A motif's fields, as the continuation fields they stand for (the rest at their defaults)."""
    await refuse_unknown_fields(request, MotifParams)
    if form.primer_seconds > settings.max_primer_seconds:
        message = limit_message("primer_seconds", settings.max_primer_seconds)
        raise ApiError(422, "invalid_request", message, field="primer_seconds")
    return ContinuationParams(
        primer_seconds=form.primer_seconds, motif_end=form.motif_end, tracks=form.tracks
    )


MotifParamsDep = Annotated[ContinuationParams, Depends(get_motif_params)]


async def get_accompaniment_params(
    form: Annotated[AccompanimentParams, Form()],
    settings: SettingsDep,
    service: ServiceDep,
    request: Request,
) -> AccompanimentParams:
    """The form, checked: unknown fields (422), the operator's limits, controls that cannot be honoured
    whatever the melody; and 503 when there is no model, before anything is parsed."""
    accompaniment = service.accompaniment
    if accompaniment is None:
        raise ApiError(503, "no_accompaniment_model", service.accompaniment_unavailable)
    await refuse_unknown_fields(request, AccompanimentParams)
    limit = min(settings.max_num_samples, settings.max_batch_rows)
    if form.num_samples > limit:
        raise ApiError(422, "invalid_request", limit_message("num_samples", limit), field="num_samples")
    vocab_size = accompaniment.codec.vocab_size
    if form.top_k is not None and form.top_k > vocab_size:
        message = limit_message("top_k", vocab_size)
        raise ApiError(422, "invalid_request", message, field="top_k")
    form.controls()
    return form


AccompanimentParamsDep = Annotated[AccompanimentParams, Depends(get_accompaniment_params)]


async def get_infill_params(
    form: Annotated[InfillParams, Form()],
    settings: SettingsDep,
    service: ServiceDep,
    request: Request,
) -> InfillParams:
    """The form, checked: 503 when there is no infill model (before anything is parsed), unknown fields
    (422), the operator's limits, the span's own rules that need no file (given once, in seconds or in bars;
    start < end, at most 30 s: InfillError, 422 naming its field) and controls that cannot be honoured
    whatever the file."""
    infill = service.infill
    if infill is None:
        raise ApiError(503, "infill_unavailable", service.infill_unavailable)
    await refuse_unknown_fields(request, InfillParams)
    limit = min(settings.max_num_samples, settings.max_batch_rows)
    if form.num_samples > limit:
        raise ApiError(422, "invalid_request", limit_message("num_samples", limit), field="num_samples")
    vocab_size = infill.codec.vocab_size
    if form.top_k is not None and form.top_k > vocab_size:
        message = limit_message("top_k", vocab_size)
        raise ApiError(422, "invalid_request", message, field="top_k")
    _check_span_fields(form)
    form.controls()
    return form


def _check_span_fields(form: InfillParams) -> None:
    """The span given once and whole: start and end (seconds, checked here as far as no file is needed), or
    first_bar and last_bar (in order; the file says what seconds they are). 422 naming the missing field."""
    from musicrel.errors import InfillError
    from musicrel.generation.span import check_bars, check_span

    seconds = {"start": form.start, "end": form.end}
    bars = {"first_bar": form.first_bar, "last_bar": form.last_bar}
    given = [name for name, value in {**seconds, **bars}.items() if value is not None]
    if any(name in bars for name in given) and any(name in seconds for name in given):
        message = "give the span in seconds (start, end) or in bars (first_bar, last_bar), not both"
        raise ApiError(422, "invalid_request", message, field=next(n for n in given if n in bars))
    pair = bars if any(name in bars for name in given) else seconds
    missing = [name for name, value in pair.items() if value is None]
    if missing:
        message = f"{missing[0]} is missing: give the span as start and end, or as first_bar and last_bar"
        raise ApiError(422, "invalid_request", message, field=missing[0])
    if pair is seconds:
        check_span(form.start, form.end)
        return
    try:
        check_bars(form.first_bar, form.last_bar)
    except InfillError as exc:  # named by the bar fields the client sent
        raise in_bars(exc) from exc


InfillParamsDep = Annotated[InfillParams, Depends(get_infill_params)]


def wants_json(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return "application/json" in accept and "audio/midi" not in accept.split(",")[0]


WantsJsonDep = Annotated[bool, Depends(wants_json)]
