"""Dependencies shared by the routes (full-stack template style: `XDep = Annotated[X, Depends(get_x)]`); a
task's form dependency is made from the task (server/routes/tasks.py) and checked here (`check_form`)."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Form, Request
from pydantic import BaseModel

from server.errors import ApiError, limit_message
from server.schemas import ContinuationParams, MotifParams, MusicForm
from server.service import Service
from server.settings import Settings

if TYPE_CHECKING:
    from server.tasks.base import Task


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


async def check_form(task: Task, form: MusicForm, service: Service, request: Request) -> None:
    """A task's form, checked as every task's is: 503 when the task's model is missing (before anything is
    parsed), unknown fields (422), the operator's limits on top of the schema's fixed bounds, the task's own
    checks that need no file, and controls that cannot be honoured whatever the upload (a bad chord symbol,
    low above high; those that depend on it, an "auto" key, are checked when it is parsed)."""
    unavailable = task.unavailable(service)
    if unavailable is not None:
        raise unavailable
    await refuse_unknown_fields(request, task.form)
    for name, limit in task.limits(service).items():
        value = getattr(form, name, None) or 0
        if value > limit:
            raise ApiError(422, "invalid_request", limit_message(name, limit), field=name)
    task.check(form)
    form.controls()


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


def wants_json(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return "application/json" in accept and "audio/midi" not in accept.split(",")[0]


WantsJsonDep = Annotated[bool, Depends(wants_json)]
