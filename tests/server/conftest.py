"""Server fixtures: a tiny random checkpoint made by code, and a real uvicorn process serving it.

`tiny_checkpoint` and `live_server` are session-scoped (the page and deployment tests use them too);
`start_server` is a context manager for tests that need their own process (e.g. to send it SIGTERM).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 60.0


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A 1-layer, d_model=32 random MusicTransformer saved with the default codec (fast to load and run)."""
    import torch

    from musicrel.midi.codec import EventCodec
    from musicrel.model.checkpoint import save_model
    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import MusicTransformer

    torch.manual_seed(0)
    codec = EventCodec()
    config = ModelConfig(
        vocab_size=codec.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=256
    )
    folder = tmp_path_factory.mktemp("tiny_checkpoint")
    save_model(MusicTransformer(config), folder, codec=codec)
    return folder


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A running `python -m uvicorn server.app:app` subprocess; `log()` returns what it printed so far."""

    def __init__(self, proc: subprocess.Popen, url: str, log_path: Path):
        self.proc = proc
        self.url = url
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


@contextlib.contextmanager
def start_server(
    checkpoint: Path, log_dir: Path, cli: bool = False, workers: int = 1, **env: str
) -> Iterator[ServerProcess]:
    """Start uvicorn on a free loopback port with MUSICREL_CHECKPOINT=checkpoint (plus `env`, e.g.
    MUSICREL_BATCH_WINDOW_MS="500"), wait until /readyz answers 200, yield, and stop it at the end.
    cli=True runs `musicrel serve` (what `make run` and the container do) instead of bare uvicorn, with
    `--workers workers`."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    full_env = {**os.environ, "MUSICREL_CHECKPOINT": str(checkpoint), "PYTHONUNBUFFERED": "1", **env}
    log_path = log_dir / f"uvicorn-{port}.log"
    with open(log_path, "wb") as log:
        if cli:
            command = [sys.executable, "-m", "musicrel.cli", "serve", "--checkpoint", str(checkpoint)]
            command += ["--workers", str(workers)]
        else:
            command = [sys.executable, "-m", "uvicorn", "server.app:app"]
        proc = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = ServerProcess(proc, url, log_path)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"uvicorn exited with {proc.returncode} before ready:\n{server.log()[-4000:]}")
            try:
                if httpx.get(f"{url}/readyz", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"uvicorn not ready after {STARTUP_TIMEOUT_S:.0f} s:\n{server.log()[-4000:]}")
            time.sleep(0.1)
        yield server
    finally:
        server.terminate()


@pytest.fixture(scope="session")
def live_server(tiny_checkpoint, tmp_path_factory) -> Iterator[str]:
    """Base URL (http://127.0.0.1:PORT) of a real uvicorn process serving `tiny_checkpoint`."""
    with start_server(tiny_checkpoint, tmp_path_factory.mktemp("live_server")) as server:
        yield server.url
