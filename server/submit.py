"""A request's job, from the HTTP process to the engine and back, whatever its kind: `queue_job` hands it
over (429 `queue_full`, 503 `draining`; the admission ticket goes with it) and `wait_for_result` awaits it
while watching the deadline (504) and the client (None when it left: the job is cancelled in the engine)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from fastapi import UploadFile

from server.admission import Ticket
from server.errors import ApiError
from server.jobs import Job, QueueFullError, WorkerStoppedError
from server.service import Service


def queue_job(service: Service, enqueue: Callable[[], Job], ticket: Ticket | None) -> Job:
    """Queue the job `enqueue()` submits; its admission ticket is handed over to the queue (the job now counts
    there). Refused, the ticket stays with the request, whose end releases it."""
    assert service.worker is not None
    try:
        job = enqueue()
    except QueueFullError as exc:  # only if admission was bypassed (the ticket reserves a place)
        service.metrics.rejected.labels("queue_full").inc()
        retry = service.admission.retry_after_s(service.worker.queue_depth)
        raise ApiError(
            429, "queue_full", f"server busy: {exc}; retry later", headers={"Retry-After": str(retry)}
        ) from exc
    except WorkerStoppedError as exc:
        retry = {"Retry-After": str(service.settings.retry_after_s)}
        raise ApiError(503, "draining", str(exc), headers=retry) from exc
    if ticket is not None:
        ticket.handed_over()
    return job


async def wait_for_result(
    job: Job, is_disconnected: Callable[[], Awaitable[bool]], poll_s: float, what: str = "continuation"
) -> Any:
    """Await the job's result while watching the deadline and the client; None if the client left."""
    assert job.future is not None
    try:
        while not job.future.done():
            remaining = job.deadline - time.monotonic()
            if remaining <= 0:
                job.cancel("deadline")
                break
            await asyncio.wait({job.future}, timeout=min(poll_s, remaining))
            if not job.future.done() and await is_disconnected():
                job.cancel("disconnected")
                return None
    except asyncio.CancelledError:  # the server is cancelling this request (forced shutdown)
        job.cancel("cancelled")
        raise
    if job.stop_reason == "deadline":
        raise ApiError(504, "timeout", f"the {what} did not finish within the request deadline")
    try:
        return job.future.result()
    except WorkerStoppedError as exc:
        raise ApiError(503, "draining", str(exc)) from exc


PARSE_TIMEOUT = "parsing the upload did not finish by the request deadline"


async def read_upload(file: UploadFile) -> bytes:
    """The upload's bytes; 422 for an empty one (the OpenAPI schema says minLength 1: the same verdict as any
    other field out of bounds)."""
    data = await file.read()
    if not data:
        raise ApiError(422, "invalid_request", "file: the upload is empty (0 bytes)", field="file")
    return data


async def parse_on_thread(service: Service, parse: Callable[..., Any], *args: Any) -> Any:
    """`parse(*args)` on a parse thread (the service's limiter) within the request deadline; 504 past it.
    Abandoned on cancel: a parse that hangs then costs its own request and a thread, not a place in the parse
    limiter for every later upload."""
    try:
        with anyio.fail_after(service.settings.request_timeout_s):
            return await anyio.to_thread.run_sync(
                parse, *args, limiter=service.parse_limiter, abandon_on_cancel=True
            )
    except TimeoutError as exc:
        raise ApiError(504, "timeout", PARSE_TIMEOUT) from exc
