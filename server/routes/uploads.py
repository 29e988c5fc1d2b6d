"""What the upload routes share in the OpenAPI document: the file part's schema and the errors they answer."""

from __future__ import annotations

from typing import Any

from server.schemas import ErrorResponse

# The part's schema says what the route accepts: at least one byte of a MIDI file, sent as a file part (with a
# filename). Without `format: binary` (OpenAPI 3.1 reads contentMediaType other than octet-stream as annotated
# text) clients such as schemathesis send a plain field, which the route refuses (422 "Expected UploadFile").
FILE_SCHEMA = {"minLength": 1, "format": "binary", "contentMediaType": "audio/midi"}
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {
        "model": ErrorResponse,
        "description": "a malformed body, e.g. a multipart body cut short before its closing boundary "
        "(bad_request)",
    },
    408: {
        "model": ErrorResponse,
        "description": "the upload came slower than MUSICREL_UPLOAD_MIN_BYTES_PER_S after "
        "MUSICREL_UPLOAD_GRACE_S, or took longer than MUSICREL_UPLOAD_TIMEOUT_S (upload_timeout)",
    },
    413: {"model": ErrorResponse, "description": "upload larger than MUSICREL_MAX_UPLOAD_BYTES (too_large)"},
    422: {
        "model": ErrorResponse,
        "description": "a field out of bounds or an empty file (invalid_request), or bytes that are not "
        "usable MIDI: not_midi, truncated, bad_data_byte, no_notes, smpte_division, zero_division, "
        "too_large, too_many_tracks, too_many_events, too_long",
    },
    429: {
        "model": ErrorResponse,
        "description": "the queue is full (queue_full; Retry-After from the queue's measured drain rate) or "
        "too many uploads are in progress (too_many_uploads)",
    },
    503: {"model": ErrorResponse, "description": "loading (not_ready) or shutting down (draining)"},
    504: {"model": ErrorResponse, "description": "past MUSICREL_REQUEST_TIMEOUT_S (timeout)"},
}
# The stream route's own media type is NDJSON; its errors (before the job is queued) are plain JSON.
JSON_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {
        "description": spec["description"],
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
    }
    for status, spec in ERRORS.items()
}
