"""Every error leaves the service as JSON `{"error": {"code": ..., "message": ...}}` (+ `field` if any).

Library errors keep their stable codes (the codec's `not_midi`, `truncated`, `no_notes`, ...); the service
adds bad_request (400), upload_timeout (408), too_large (413), invalid_request (422), queue_full and
too_many_uploads (429), not_ready / draining (503), timeout (504), not_found, method_not_allowed and, should a
bug slip through, internal (500) without a traceback.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from musicrel.errors import CheckpointError, InfillError, MusicrelError
from musicrel.generation.controls import ControlError
from server.openapi import form_limits

log = logging.getLogger("musicrel.server")

HTTP_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    408: "upload_timeout",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "queue_full",
    503: "unavailable",
    504: "timeout",
}
CLIENT_CLOSED = 499  # nginx's code for "the client went away"; nobody receives it, the metrics count it


class ApiError(Exception):
    """An error the service itself raises, already shaped for the client."""

    def __init__(
        self, status: int, code: str, message: str, *, field: str | None = None, headers: dict | None = None
    ):
        super().__init__(message)
        self.status, self.code, self.message, self.field, self.headers = status, code, message, field, headers


def error_body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        error["field"] = field
    return {"error": error}


def error_response(
    status: int, code: str, message: str, field: str | None = None, headers: dict | None = None
) -> JSONResponse:
    return JSONResponse(error_body(code, message, field), status_code=status, headers=headers)


def describe(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The status and JSON body an exception answers with, as the handlers below shape it: a stream that
    has already sent its 200 reports a failure with the same code as an error event."""
    if isinstance(exc, ApiError):
        return exc.status, error_body(exc.code, exc.message, exc.field)
    if isinstance(exc, MusicrelError):
        return _library_status(exc), error_body(exc.code, exc.message, library_field(exc))
    log.error("unhandled error while streaming", exc_info=exc)
    return 500, error_body("internal", "internal error; it has been logged")


# A control error names its field in its message ("key_strength must be ...", "chord 'X': the duration"); the
# code alone settles the rest. The page shows the message next to that field's input.
_CONTROL_WORDS = (
    *("key_strength", "chord_strength", "program", "density", "low_note", "high_note", "max_polyphony"),
    "instruments",
    "chord",
    "key",
)
_CONTROL_CODE_FIELDS = {
    "unknown_chord": "chords",
    "unknown_key": "key",
    "empty_range": "low_note",
    "no_instruments": "instruments",
}
# An infill's span (musicrel.generation.span, POST /v1/infills): the field each InfillError code is about (the
# page shows the message beside that input). invalid_span names its field first when it is one number's fault.
_INFILL_CODE_FIELDS = {
    "invalid_span": "start",
    "span_too_long": "end",
    "span_outside_music": "start",
    "nothing_before": "start",
    "nothing_after": "end",
    "invalid_tracks": "tracks",
    "no_such_track": "tracks",
    "track_not_read": "tracks",
}
# The same for a span given in bars (`first_bar`, `last_bar`): the fields the client sent, not the seconds.
_INFILL_BAR_FIELDS = {
    "invalid_span": "first_bar",
    "nothing_before": "first_bar",
    "span_too_long": "last_bar",
    "span_outside_music": "last_bar",
    "nothing_after": "last_bar",
    "invalid_tracks": "tracks",
    "no_such_track": "tracks",
    "track_not_read": "tracks",
}


def in_bars(exc: InfillError) -> ApiError:
    """A span's InfillError when the client gave the span in bars: 422 naming the bar field it is about."""
    return ApiError(422, exc.code, str(exc), field=_INFILL_BAR_FIELDS.get(exc.code))


def library_field(exc: MusicrelError) -> str | None:
    """The request field a library error is about, when it is one of the controls' or the infill span's."""
    if isinstance(exc, InfillError):
        if exc.code == "invalid_span" and exc.message.startswith("end"):
            return "end"
        return _INFILL_CODE_FIELDS.get(exc.code)
    if not isinstance(exc, ControlError):
        return None
    if exc.code in _CONTROL_CODE_FIELDS:
        return _CONTROL_CODE_FIELDS[exc.code]
    message = exc.message
    named = [w for w in _CONTROL_WORDS if w in message]  # the earliest wins; on a tie, the longer word
    if not named:
        return None
    word = min(named, key=message.index)
    return "chords" if word == "chord" else word


def limit_message(name: str, limit: float) -> str:
    return f"{name}: must be at most {limit:g} on this server"


def _validation_response(exc: RequestValidationError, limits: dict[str, float]) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {}
    # loc is ("body", "seconds") or ("query", ...): the client knows the field by its bare name.
    loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "header", "path")]
    field = ".".join(loc) or None
    message = first.get("msg", "invalid request").removeprefix("Value error, ")
    if field in limits and first.get("type") in ("less_than_equal", "less_than"):
        # Above the schema's fixed bound is above the operator's tighter one too: say the one that holds
        # ("seconds=1e6" was told "<= 600" by a server whose limit is 60).
        message = limit_message(field, limits[field])
    elif field:
        message = f"{field}: {message}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more)"
    return error_response(422, "invalid_request", message, field)


def _library_status(exc: MusicrelError) -> int:
    # A bad checkpoint is the operator's problem, not the client's; so is a model that cannot infill (the
    # HTTP process refuses infills without an infill model first: 503 infill_unavailable).
    if isinstance(exc, InfillError) and exc.code == "model_cannot_infill":
        return 503
    return 500 if isinstance(exc, CheckpointError) else 422


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.field, exc.headers)

    @app.exception_handler(MusicrelError)
    async def library_error(request: Request, exc: MusicrelError) -> JSONResponse:
        return error_response(_library_status(exc), exc.code, exc.message, library_field(exc))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        service = request.app.state.service
        vocab = service.codec.vocab_size if service.codec is not None else None
        return _validation_response(exc, form_limits(service.settings, vocab))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = getattr(exc, "code", None) or HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        return error_response(exc.status_code, code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal", "internal error; it has been logged")
