"""Every task's routes, made from its definition (server/tasks/): `task_router(task)` gives POST <path> (the
answer as MIDI, or JSON for Accept: application/json) and, for a task with a stream, POST <path>/stream
(NDJSON), both behind one form dependency (`form_dependency`: the task's form, checked). A new task gets its
routes by being listed in server/tasks/__init__.py; nothing here names a task.

No `from __future__ import annotations` here: FastAPI reads each route's parameters from their annotations,
which name the task's own form class, a local of the factory."""

from typing import Annotated, Any

from fastapi import APIRouter, Depends, File, Form, Request, UploadFile
from fastapi.responses import Response

from server.deps import ServiceDep, WantsJsonDep, check_form
from server.errors import CLIENT_CLOSED
from server.middleware import ADMISSION_TICKET
from server.routes.uploads import ERRORS, FILE_SCHEMA, JSON_ERRORS
from server.tasks import base
from server.tasks.base import Task
from server.tasks.stream import MEDIA_TYPE, NdjsonStream, start_stream


def form_dependency(task: Task) -> Any:
    """The dependency that gives the task's form, checked (deps.check_form): its routes declare it."""

    async def get_form(form: Annotated[task.form, Form()], service: ServiceDep, request: Request) -> Any:
        await check_form(task, form, service, request)
        return form

    get_form.__name__ = f"get_{task.name}_params"
    return Annotated[task.form, Depends(get_form)]


def _responses(task: Task, errors: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """The shared errors, with the task's own 422 codes and 503 reasons."""
    out = {status: dict(spec) for status, spec in errors.items()}
    out[422] = {**out[422], "description": out[422]["description"] + task.errors_422}
    if task.errors_503 is not None:
        out[503] = {**out[503], "description": task.errors_503}
    return out


def task_router(task: Task) -> APIRouter:
    """POST task.path (and task.path/stream when the task streams)."""
    router = APIRouter()
    Params = form_dependency(task)
    Upload = Annotated[UploadFile, File(description=task.file_description, json_schema_extra=FILE_SCHEMA)]

    async def create(
        request: Request, service: ServiceDep, params: Params, wants_json: WantsJsonDep, file: Upload
    ) -> Any:
        ticket = request.scope.get(ADMISSION_TICKET)
        answer = await base.run(task, service, file, params, ticket, request.is_disconnected)
        if answer is None:
            return Response(status_code=CLIENT_CLOSED)
        return answer if wants_json else base.as_midi(task, answer)

    router.add_api_route(
        task.path,
        create,
        methods=["POST"],
        name=f"create_{task.name}",
        summary=task.summary,
        description=task.description,
        response_model=task.response,
        responses={
            200: {"content": {"audio/midi": {}}, "description": task.midi_description},
            **_responses(task, ERRORS),
        },
    )
    if task.stream_summary is None:
        return router

    async def stream(request: Request, service: ServiceDep, params: Params, file: Upload) -> Response:
        return await start_stream(task, service, file, params, request.scope.get(ADMISSION_TICKET))

    router.add_api_route(
        f"{task.path}/stream",
        stream,
        methods=["POST"],
        name=f"stream_{task.name}",
        summary=task.stream_summary,
        response_class=NdjsonStream,
        responses={
            200: {"content": {MEDIA_TYPE: {}}, "description": task.stream_description},
            **_responses(task, JSON_ERRORS),
        },
    )
    return router
