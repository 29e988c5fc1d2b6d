"""`musicrel serve`: the HTTP API and web page under uvicorn. Heavy imports stay inside the handler."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from musicrel.errors import ConfigError
from musicrel.model.checkpoint import check_checkpoint  # no torch: cheap at start-up

# After the drain (MUSICREL_DRAIN_TIMEOUT_S) uvicorn gives responses still open this long, then cancels them.
GRACEFUL_SHUTDOWN_S = 5


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve the continuation API and web page",
        description="Serve POST /v1/continuations, the web page at /, /docs, /metrics. Every limit is an "
        "environment variable (MUSICREL_MAX_UPLOAD_BYTES, MUSICREL_MAX_QUEUE, MUSICREL_BATCH_WINDOW_MS, "
        "MUSICREL_MAX_BATCH_ROWS, MUSICREL_REQUEST_TIMEOUT_S, MUSICREL_DRAIN_TIMEOUT_S, "
        "MUSICREL_MAX_SECONDS, ...).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=Path(os.environ.get("MUSICREL_CHECKPOINT", "checkpoints/default")),
        help="checkpoint folder (config.json + model.safetensors or shards); default $MUSICREL_CHECKPOINT",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--workers", type=int, default=1, help="processes, each with its own model copy and generation worker"
    )
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=serve)


def serve(args: argparse.Namespace) -> int:
    import signal

    import uvicorn
    from pydantic import ValidationError

    from server.settings import Settings

    if args.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {args.workers}")
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port must be in 1..65535, got {args.port}")
    check_checkpoint(args.checkpoint)
    # Every worker process reads its settings from the environment (uvicorn imports "server.app:app" anew).
    os.environ["MUSICREL_CHECKPOINT"] = str(args.checkpoint.resolve())
    try:
        Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        name = "MUSICREL_" + str(first["loc"][0]).upper() if first.get("loc") else "MUSICREL_*"
        raise ConfigError(f"{name}: {first['msg']}") from None

    metrics_dir = None
    if args.workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Workers share their metrics through files here (prometheus_client's multiprocess mode): set before
        # uvicorn starts them, so each imports prometheus_client with it.
        metrics_dir = tempfile.mkdtemp(prefix="musicrel-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir

    # uvicorn re-raises SIGTERM once it has shut down gracefully; with the default disposition that would kill
    # the process by the signal. A Python-level handler makes a drained shutdown exit 0.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        uvicorn.run(
            "server.app:app",
            host=args.host,
            port=args.port,
            workers=args.workers,
            log_level=args.log_level,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
    finally:
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0
