"""Pure ASGI middleware (no BaseHTTPMiddleware: it would break streaming and `request.is_disconnected()`)."""

from __future__ import annotations

import math
import time
from typing import Any

import anyio
from python_multipart.multipart import parse_options_header
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import ApiError, error_response
from server.metrics import Metrics
from server.settings import Settings

# Scope key: was the service draining when this request arrived? One that arrived before SIGTERM is served
# even if its upload is still being read when the signal comes.
DRAINING_AT_ARRIVAL = "musicrel.draining_at_arrival"
ADMISSION_TICKET = "musicrel.admission_ticket"  # the request's place in the queue bound (server/admission.py)
# Answers of the upload bounds (UploadLimitMiddleware): a request refused with one was never parsed.
UPLOAD_REFUSALS = frozenset((400, 408, 413, 429))


class BodyError(HTTPException):
    """Raised from `receive` when a body breaks a bound. An HTTPException, so FastAPI's body parsing lets it
    through unchanged and the handler answers with it instead of "error parsing the body" (400)."""

    def __init__(self, status: int, code: str, message: str, close: bool = False):
        # Connection: close, so that uvicorn drops a connection whose sender may go on trickling (it would
        # otherwise read and discard the rest of the body for as long as it comes).
        super().__init__(status, message, headers={"Connection": "close"} if close else None)
        self.code = code


def too_large(limit: int) -> BodyError:
    return BodyError(413, "too_large", f"request body is larger than the limit of {limit} bytes")


def _has_body(headers: Headers) -> bool:
    length = headers.get("content-length")
    return (length is not None and length != "0") or "transfer-encoding" in headers


def _closing_delimiter(headers: Headers) -> bytes | None:
    """`--boundary--`, which ends a well-formed multipart body; None for other content types."""
    content_type, options = parse_options_header(headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if content_type != b"multipart/form-data" or not boundary:
        return None
    return b"--" + boundary + b"--"


class UploadLimitMiddleware:
    """Bounds on request bodies, enforced while they are read (before and during multipart parsing):

    - size: 413 at once from Content-Length, or as soon as a chunked body passes `max_bytes`;
    - time: past `grace_s` an upload's average rate must stay above `min_bytes_per_s`, and the whole body must
      arrive within `timeout_s`; else 408 (a body that stops arriving is cut off too);
    - count: at most `max_uploads` bodies being received at once; one more gets 429 before a byte is read;
    - form: a multipart body that ends without its closing boundary is truncated: 400 saying so (the parser
      itself would drop the unfinished part and the route would report its field as missing).
    """

    def __init__(self, app: ASGIApp, settings: Settings):
        self.app = app
        self.max_bytes = settings.max_upload_bytes
        self.timeout_s = settings.upload_timeout_s
        self.min_rate = settings.upload_min_bytes_per_s
        self.grace_s = settings.upload_grace_s
        self.max_uploads = settings.max_uploads
        self.retry_after_s = settings.retry_after_s
        self.uploading = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self._refusal(headers)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        if not _has_body(headers):
            await self.app(scope, receive, send)
            return
        if self.uploading >= self.max_uploads:
            message = f"{self.uploading} uploads are already in progress; retry later"
            retry = {"Retry-After": str(self.retry_after_s), "Connection": "close"}
            await error_response(429, "too_many_uploads", message, headers=retry)(scope, receive, send)
            return

        upload = _Upload(self, receive, _closing_delimiter(headers))
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, upload.receive, tracking_send)
        except BodyError as exc:  # read outside a route (no exception handler saw it)
            if started:
                raise
            await error_response(exc.status_code, exc.code, exc.detail, headers=exc.headers)(
                scope, receive, send
            )
        finally:
            upload.finished()

    def _refusal(self, headers: Headers) -> ASGIApp | None:
        """The answer to a request whose Content-Length alone breaks the bounds, before anything is read."""
        length = headers.get("content-length")
        if length is not None and not length.isdigit():
            return error_response(400, "bad_request", "invalid Content-Length header")
        if length is not None and int(length) > self.max_bytes:
            error = too_large(self.max_bytes)
            return error_response(413, error.code, error.detail)
        return None


class _Upload:
    """One request body being received under its middleware's bounds; it holds one of the middleware's
    `max_uploads` places until `finished`."""

    def __init__(self, limits: UploadLimitMiddleware, receive: Receive, delimiter: bytes | None):
        self.limits = limits
        self._receive = receive
        self.delimiter = delimiter  # the multipart closing boundary, if the body is a form
        self.start = time.monotonic()
        self.received = 0
        self.uploading = True
        self.closed = False  # the closing delimiter was seen
        self.tail = b""  # the end of what came so far, in case the delimiter straddles two chunks
        limits.uploading += 1

    def finished(self) -> None:
        if self.uploading:
            self.uploading = False
            self.limits.uploading -= 1

    def deadline(self) -> float:
        """When more bytes must have arrived: the rate check starts after the grace period and the body
        deadline caps everything."""
        limits = self.limits
        by_rate = self.received / limits.min_rate if limits.min_rate else math.inf
        return self.start + min(limits.timeout_s, max(limits.grace_s, by_rate))

    def too_slow(self) -> BodyError:
        elapsed = time.monotonic() - self.start
        timeout_s, received = self.limits.timeout_s, self.received
        if elapsed >= timeout_s:
            why = f"the request body did not arrive within {timeout_s:g} s ({received} bytes came)"
        else:
            why = (
                f"the request body is arriving too slowly: {received} bytes in {elapsed:.1f} s, below "
                f"the minimum of {self.limits.min_rate:g} bytes/s"
            )
        return BodyError(408, "upload_timeout", why, close=True)

    async def receive(self) -> Message:
        """The app's `receive`: the next chunk, or a BodyError as soon as the body breaks a bound."""
        if not self.uploading:
            return await self._receive()
        with anyio.move_on_after(self.deadline() - time.monotonic()) as waited:
            message = await self._receive()
        if waited.cancelled_caught:
            self.finished()
            raise self.too_slow()
        if message["type"] != "http.request":
            self.finished()  # disconnected
            return message
        chunk = message.get("body", b"")
        self.received += len(chunk)
        if self.received > self.limits.max_bytes:
            self.finished()
            raise too_large(self.limits.max_bytes)
        self._watch_for_delimiter(chunk)
        if not message.get("more_body", False):
            self.finished()
            if self.delimiter is not None and not self.closed:
                raise BodyError(
                    400,
                    "bad_request",
                    f"malformed multipart body: it ends after {self.received} bytes without its closing "
                    f"boundary {self.delimiter.decode('latin-1')} (was the upload cut short?)",
                )
        return message

    def _watch_for_delimiter(self, chunk: bytes) -> None:
        if self.delimiter is not None and not self.closed:
            window = self.tail + chunk
            self.closed = self.delimiter in window
            self.tail = window[-(len(self.delimiter) - 1) :]


class AdmissionMiddleware:
    """The routes that generate (every task's, its stream's, /v1/motifs) are admitted (or refused: 503 not
    ready or draining, 429 queue full) as they arrive, before the upload is read; the route submits with the
    ticket kept in the scope."""

    def __init__(self, app: ASGIApp, service: Any, paths: frozenset[str]):
        self.app = app
        self.service = service
        self.paths = paths  # the routes that generate (server.routes.GENERATION_PATHS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length", "")
        try:
            draining = scope.get(DRAINING_AT_ARRIVAL, self.service.draining)
            ticket = self.service.admit(draining, int(length) if length.isdigit() else None)
        except ApiError as exc:
            await error_response(exc.status, exc.code, exc.message, exc.field, exc.headers)(
                scope, receive, send
            )
            return
        scope[ADMISSION_TICKET] = ticket
        status = 0

        async def status_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, status_send)
        finally:
            ticket.release(served=status not in UPLOAD_REFUSALS)


class MetricsMiddleware:
    """Counts requests by route template, method and status; tracks continuation requests in flight from the
    moment they arrive (upload included) so that a drain waits for them."""

    def __init__(self, app: ASGIApp, metrics: Metrics, service: Any, paths: frozenset[str]):
        self.app = app
        self.metrics = metrics
        self.service = service
        self.paths = paths  # the routes that generate (server.routes.GENERATION_PATHS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # if the app raises before answering, ServerErrorMiddleware sends a 500
        is_generation = scope["path"] in self.paths and scope["method"] == "POST"

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
