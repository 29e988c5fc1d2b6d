"""Pure ASGI middleware (no BaseHTTPMiddleware: it would break streaming and `request.is_disconnected()`)."""

from __future__ import annotations

import time
from typing import Any

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import error_response
from server.metrics import Metrics

CONTINUATIONS_PATH = "/v1/continuations"
# Scope key: was the service draining when this request arrived? One that arrived before SIGTERM is served
# even if its upload is still being read when the signal comes.
DRAINING_AT_ARRIVAL = "musicrel.draining_at_arrival"


class BodyTooLargeError(HTTPException):
    """Raised from `receive` once a streamed body passes the cap. An HTTPException, so FastAPI's body parsing
    lets it through unchanged and the handler answers 413 instead of "error parsing the body" (400)."""

    code = "too_large"

    def __init__(self, limit: int):
        super().__init__(413, f"request body is larger than the limit of {limit} bytes")


class BodyLimitMiddleware:
    """413 for bodies over `max_bytes`: at once from Content-Length, before the app (and the multipart
    parser) reads anything; for chunked uploads without Content-Length, as soon as the count passes it."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length")
        if length is not None:
            if not length.isdigit():
                await error_response(400, "bad_request", "invalid Content-Length header")(
                    scope, receive, send
                )
                return
            if int(length) > self.max_bytes:
                await error_response(413, "too_large", str(BodyTooLargeError(self.max_bytes).detail))(
                    scope, receive, send
                )
                return

        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLargeError(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLargeError as exc:  # read outside a route (no exception handler saw it)
            if started:
                raise
            await error_response(413, "too_large", str(exc.detail))(scope, receive, send)


class MetricsMiddleware:
    """Counts requests by route template, method and status; tracks continuation requests in flight from the
    moment they arrive (upload included) so that a drain waits for them."""

    def __init__(self, app: ASGIApp, metrics: Metrics, service: Any):
        self.app = app
        self.metrics = metrics
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # if the app raises before answering, ServerErrorMiddleware sends a 500
        is_generation = scope["path"] == CONTINUATIONS_PATH and scope["method"] == "POST"

        async def status_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        if is_generation:
            scope[DRAINING_AT_ARRIVAL] = self.service.draining
            self.service.in_flight += 1
            self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, status_send)
        finally:
            if is_generation:
                self.service.in_flight -= 1
                self.metrics.in_flight.dec()
            route = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(label, scope["method"], str(status)).inc()
            self.metrics.request_seconds.labels(label).observe(time.perf_counter() - start)
