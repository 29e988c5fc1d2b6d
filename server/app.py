"""The musicrel service: `uvicorn server.app:app` (settings from MUSICREL_* environment variables), or
`create_app(Settings(...))` in tests.

Start-up loads the checkpoint once, then the generation worker warms up with a tiny generation; /readyz says
503 until that is done.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline

import musicrel
from server import openapi
from server.errors import install_error_handlers
from server.metrics import Metrics, worker_exited
from server.middleware import AdmissionMiddleware, MetricsMiddleware, UploadLimitMiddleware
from server.routes import FORMS, GENERATION_PATHS, router
from server.service import Service
from server.settings import Settings

log = logging.getLogger("musicrel.server")

DESCRIPTION = """Upload a MIDI motif; a Music Transformer continues it.

`POST /v1/continuations` answers `audio/midi` (the first sample) or, with `Accept: application/json`,
every sample as base64 MIDI with the seed, the settings used and timings. `POST /v1/continuations/stream`
takes the same form and answers NDJSON events while it generates: each note as it is generated, then the
same JSON. `POST /v1/accompaniments` takes a melody and answers it with a piano accompaniment on a
track of its own (when the server has an accompaniment model). Every error is JSON
`{"error": {"code": ..., "message": ...}}`.
"""


def _share_uvicorn_logging() -> None:
    """Under uvicorn our log lines go where uvicorn's go, at its level (it sets up only its own loggers)."""
    theirs = logging.getLogger("uvicorn")
    if not log.handlers and theirs.handlers:
        for handler in theirs.handlers:
            log.addHandler(handler)
        log.setLevel(logging.getLogger("uvicorn.error").getEffectiveLevel())
        log.propagate = False


def create_app(settings: Settings | None = None, decoder: Callable[..., Any] | None = None) -> FastAPI:
    """`decoder(model, codec, max_rows, primer_cache=n)` makes the worker's running batch (default:
    generation.decode_batch.DecodeBatch); tests pass a subclass that holds the worker or fails on purpose."""
    settings = settings or Settings()
    metrics = Metrics()
    service = Service(settings, metrics, decoder=decoder)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        _share_uvicorn_logging()
        await anyio.to_thread.run_sync(service.load)
        service.start()
        service.install_sigterm_handler()
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(service.stop)
            worker_exited()

    # /docs and /redoc with their scripts, styles and icon served from here (fastapi-offline ships them): the
    # default pages load them from a CDN and stay blank on a machine without internet.
    app = FastAPIOffline(
        title="musicrel",
        version=musicrel.__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        static_url="/docs-assets",
    )
    app.state.service = service
    install_error_handlers(app)
    app.include_router(router)
    vocab_size = lambda: service.codec.vocab_size if service.codec is not None else None  # noqa: E731
    openapi.install(app, settings, vocab_size, FORMS)
    if settings.static_dir.is_dir():
        app.mount("/static", StaticFiles(directory=settings.static_dir), name="static")
    # Last added runs first: metrics see every answer (refusals included); admission refuses a continuation
    # (503, 429) before its body is read; the upload bounds (413, 408, 429) apply to every read of it.
    app.add_middleware(UploadLimitMiddleware, settings=settings)
    app.add_middleware(AdmissionMiddleware, service=service, paths=GENERATION_PATHS)
    app.add_middleware(MetricsMiddleware, metrics=metrics, service=service, paths=GENERATION_PATHS)
    return app


app = create_app()
