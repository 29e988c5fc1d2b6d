"""Server fixtures: a tiny random checkpoint made by code, and a real uvicorn process serving it.

`tiny_checkpoint` and `live_server` are session-scoped (the page and deployment tests use them too);
`start_server` is a context manager for tests that need their own process (e.g. to send it SIGTERM).
The in-process helpers the API tests share (`serve`, `post`, `Gate`, `MOTIF`, ...) are here too, and
`engine_app`, one in-process app a session whose engine is a process of its own.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import httpx
import pretty_midi
import pytest
from fastapi.testclient import TestClient

from musicrel.generation.decode_batch import DecodeBatch
from server.admission import Admission
from server.app import create_app
from server.settings import Settings
from tests.conftest import SHARED_MIDI

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 60.0
# No app made here loads the shipped checkpoints/accompany by accident (a second model to load in every test
# app and server); the tests that serve accompaniments name their tiny one.
os.environ.setdefault("MUSICREL_ACCOMPANY_CHECKPOINT", str(REPO / "tests" / "no-accompaniment-model"))
# Nor a checkpoints/infill trained later: the infill tests name their tiny one (`tiny_infill_checkpoint`).
os.environ.setdefault("MUSICREL_INFILL_CHECKPOINT", str(REPO / "tests" / "no-infill-model"))
# Nor the shipped checkpoints/multi as the instruments model: its tests name their tiny one.
os.environ.setdefault("MUSICREL_INSTRUMENTS_CHECKPOINT", str(REPO / "tests" / "no-instruments-model"))


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


@pytest.fixture(scope="session")
def tiny_accompany_checkpoint(tmp_path_factory) -> Path:
    """A tiny random accompaniment model: the melody codec (MELODY_ON/OFF tokens, tracks 0 and 1) and a
    1-layer MusicTransformer, as tests/musicrel/generation/test_accompaniment.py builds it."""
    import torch

    from musicrel.midi.codec import CodecConfig, EventCodec
    from musicrel.model.checkpoint import save_model
    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import MusicTransformer

    torch.manual_seed(0)
    codec = EventCodec(CodecConfig(melody=True, tracks=[0, 1]))
    config = ModelConfig(
        vocab_size=codec.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=256
    )
    folder = tmp_path_factory.mktemp("tiny_accompany_checkpoint")
    save_model(MusicTransformer(config), folder, codec=codec)
    return folder


@pytest.fixture(scope="session")
def tiny_infill_checkpoint(tmp_path_factory) -> Path:
    """A tiny random infill model: the codec with infill tokens (FUTURE, PAST, FILL after eos) and a 1-layer
    MusicTransformer, as tests/musicrel/generation/test_infill.py builds it."""
    import torch

    from musicrel.midi.codec import CodecConfig, EventCodec
    from musicrel.model.checkpoint import save_model
    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import MusicTransformer

    torch.manual_seed(0)
    codec = EventCodec(CodecConfig(infill=True))
    config = ModelConfig(
        vocab_size=codec.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=256
    )
    folder = tmp_path_factory.mktemp("tiny_infill_checkpoint")
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
    # One client for the polls: each httpx.get builds an SSL context (60 ms of CPU), and ten polls a second
    # took half a core from the server starting beside them.
    poller = httpx.Client(timeout=2.0)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"uvicorn exited with {proc.returncode} before ready:\n{server.log()[-4000:]}")
            try:
                if poller.get(f"{url}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"uvicorn not ready after {STARTUP_TIMEOUT_S:.0f} s:\n{server.log()[-4000:]}")
            time.sleep(0.1)
        poller.close()
        yield server
    finally:
        poller.close()
        server.terminate()


# The live server's upload bounds, low enough for test_live's trickling sockets to meet them in a second; an
# upload on the loopback (a browser's, a client's) is received in milliseconds, so no other test meets them.
LIVE_UPLOAD_GRACE_S = 1
LIVE_MAX_UPLOADS = 3


@pytest.fixture(scope="session")
def live_process(
    tiny_checkpoint, tiny_accompany_checkpoint, tiny_infill_checkpoint, tmp_path_factory
) -> Iterator[ServerProcess]:
    """A real uvicorn process serving `tiny_checkpoint` (and `tiny_accompany_checkpoint` for the page's
    Accompany mode, `tiny_infill_checkpoint` for its Fill mode), one a session: a start costs seconds of CPU.
    A test must not stop it."""
    folder = tmp_path_factory.mktemp("live_server")
    env = {
        "MUSICREL_ACCOMPANY_CHECKPOINT": str(tiny_accompany_checkpoint),
        "MUSICREL_INFILL_CHECKPOINT": str(tiny_infill_checkpoint),
        "MUSICREL_UPLOAD_GRACE_S": str(LIVE_UPLOAD_GRACE_S),
        "MUSICREL_MAX_UPLOADS": str(LIVE_MAX_UPLOADS),
    }
    with start_server(tiny_checkpoint, folder, **env) as server:
        yield server


@pytest.fixture(scope="session")
def live_server(live_process) -> str:
    """Base URL (http://127.0.0.1:PORT) of `live_process`."""
    return live_process.url


FAST = {"seconds": "0.3", "seed": "7"}  # a short continuation keeps each generation cheap on the tiny model


def motif(n_notes: int = 16, programs: tuple[int, ...] = (0,)) -> bytes:
    """A small pretty_midi-written file: one rising line per program."""
    pm = pretty_midi.PrettyMIDI(initial_tempo=100)
    for k, program in enumerate(programs):
        inst = pretty_midi.Instrument(program=program)
        for i in range(n_notes):
            inst.notes.append(pretty_midi.Note(70 + 5 * k, 48 + 12 * k + i % 12, i * 0.2, i * 0.2 + 0.18))
        pm.instruments.append(inst)
    buffer = io.BytesIO()
    pm.write(buffer)
    return buffer.getvalue()


MOTIF = motif()


class Gate:
    """Makes the worker's running batch (create_app's `decoder=`): a DecodeBatch whose decoding steps wait at
    the gate until it is opened (or until every live job should stop, so deadlines and disconnects still end
    it), then really run. Records the results of the jobs that finish."""

    def __init__(self, open_: bool = True):
        self.opened = threading.Event()
        self.entered = threading.Event()
        self.results: list = []
        if open_:
            self.opened.set()

    def hold(self) -> None:
        """Close the gate and forget what passed it so far (the warm-up)."""
        self.opened.clear()
        self.entered.clear()
        self.results.clear()

    def __call__(self, model, codec, max_rows, **options):
        gate = self

        class Gated(DecodeBatch):
            def step(self, should_stop=None):
                gate.entered.set()
                while not gate.opened.wait(0.01):
                    if should_stop is not None and all(should_stop(j) for j in self.live_jobs):
                        break
                finished = super().step(should_stop)
                gate.results += [result for _, result in finished]
                return finished

        return Gated(model, codec, max_rows, **options)


# Every app times its parse speed at start-up (Admission.calibrate: a 24 KB file parsed twice, 0.7-2 s of the
# 1-2.5 s a `serve` took on 2 cores); the apps of one test process share the first measurement per codec.
# `fresh_calibration=True` measures again (the test of the calibration itself).
_PARSE_SPEED: dict[str, float] = {}
_CALIBRATE = Admission.calibrate  # the real one, whatever serve() is open (engine_app's lasts a session)


def _calibrate_once(fresh: bool) -> Callable:
    def calibrate(admission: Admission, codec) -> None:
        key = repr(codec.config)
        if fresh or key not in _PARSE_SPEED:
            _CALIBRATE(admission, codec)
            _PARSE_SPEED[key] = admission.parse_s_per_byte
        admission.parse_s_per_byte = _PARSE_SPEED[key]

    return calibrate


@contextlib.contextmanager
def serve(
    checkpoint,
    *,
    decoder=None,
    wait_ready: bool = True,
    raise_errors: bool = True,
    fresh_calibration: bool = False,
    **overrides,
):
    overrides.setdefault("engine", "thread")  # fast to start; the engine process has its own tests
    app = create_app(Settings(checkpoint=checkpoint, **overrides), decoder=decoder)
    calibrate = _calibrate_once(fresh_calibration)
    with (
        mock.patch.object(Admission, "calibrate", calibrate),
        TestClient(app, raise_server_exceptions=raise_errors) as client,
    ):
        service = app.state.service
        if wait_ready:
            assert service.worker.ready.wait(60), service.worker.failed
        yield client, service


@pytest.fixture(scope="session")
def engine_app(tiny_checkpoint, tiny_accompany_checkpoint, tiny_infill_checkpoint):
    """`serve`'s (client, service) with the engine in a process of its own, holding the three tiny models, one
    a session: an engine start costs seconds of CPU. No batch window, the client checked every 20 ms, 600 s
    of melody accompanied. A test must not stop or kill its engine, and reads its metrics as differences."""
    with serve(
        tiny_checkpoint,
        engine="process",
        accompany_checkpoint=tiny_accompany_checkpoint,
        infill_checkpoint=tiny_infill_checkpoint,
        batch_window_ms=0,
        disconnect_poll_s=0.02,
        max_melody_seconds=600,
    ) as pair:
        yield pair


def post(client: TestClient, data: bytes = MOTIF, json: bool = False, **fields) -> httpx.Response:
    headers = {"accept": "application/json"} if json else {}
    return client.post(
        "/v1/continuations", files={"file": ("motif.mid", data, "audio/midi")}, data=fields, headers=headers
    )


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def metric(service, name: str, **labels) -> float:
    return service.metrics.registry.get_sample_value(name, labels) or 0.0


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


def concurrently(fn, n: int) -> list:
    results: list = [None] * n

    def run(i: int) -> None:
        results[i] = fn(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


class Broken(DecodeBatch):
    """Admission fails for primers over 40 tokens (the warm-up's is shorter)."""

    def admit(self, jobs):
        if any(len(primer.tokens) > 40 for primer, _ in jobs):
            raise RuntimeError("boom")
        return super().admit(jobs)


def post_then_leave(
    client: TestClient,
    fields: dict,
    leave: Callable[[], bool],
    path: str = "/v1/continuations",
    data: bytes = MOTIF,
) -> list:
    """POST a continuation (or `data` to `path`) straight to the ASGI app, the client going away once
    `leave()` is true after its body was sent (TestClient itself cannot disconnect). Returns the ASGI
    messages the app sent."""
    request = httpx.Request("POST", f"http://test{path}", files={"file": ("m.mid", data)}, data=fields)
    body = request.read()
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(),
        "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": ("test", 80),
        "headers": [(k.lower().encode(), v.encode()) for k, v in request.headers.items()],
    }  # fmt: skip
    messages: list = []

    async def call_and_leave() -> None:
        import anyio

        sent = False

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            while not leave():
                await anyio.sleep(0.005)
            return {"type": "http.disconnect"}

        async def send(message):
            messages.append(message)

        await client.app(scope, receive, send)

    client.portal.call(call_and_leave)
    return messages


# ---- the page in headless Chromium (test_page_browser.py, test_page_modes_browser.py) ------------
CHROMIUM = os.environ.get("MUSICREL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
GENERATION_TIMEOUT_MS = 30_000


def _require_chromium() -> None:
    if Path(CHROMIUM).is_file() or shutil.which(CHROMIUM):
        return
    message = f"headless Chromium not found at {CHROMIUM}: run `make browser` (apt-get install chromium)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)  # CI must run the browser test, never skip it silently
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser():
    _require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


VIEWPORT = {"width": 1200, "height": 900}


@pytest.fixture(scope="module")
def browser_page(browser):
    """One tab a module, which `page` loads the app in afresh for each test: a new context and tab cost 1.5 s
    a test on 2 busy cores, a new load in the same tab 0.7 (the page keeps nothing but the HTTP cache)."""
    context = browser.new_context(accept_downloads=True, viewport=VIEWPORT)
    yield context.new_page()
    context.close()


@pytest.fixture
def page(browser_page, live_server):
    """The app freshly loaded (a new document: no state of the test before), at the default viewport, with
    no routes; a test fails on any uncaught JavaScript error."""
    page = browser_page
    errors: list[str] = []

    def uncaught(exc) -> None:
        errors.append(str(exc))

    page.on("pageerror", uncaught)
    page.goto(f"{live_server}/")
    yield page
    page.remove_listener("pageerror", uncaught)
    page.unroute_all()
    page.goto("about:blank")  # the test's document ends here, its requests and sounds with it
    page.set_viewport_size(VIEWPORT)
    assert errors == [], f"uncaught JavaScript errors: {errors}"


@pytest.fixture(scope="module")
def motif_file(tmp_path_factory) -> Path:
    """A short real file from the shared set when present, else a pretty_midi-written motif."""
    shared = SHARED_MIDI / "real" / "POP909_008.mid"
    if shared.is_file():
        return shared
    pm = pretty_midi.PrettyMIDI(initial_tempo=100)
    piano = pretty_midi.Instrument(program=0)
    for i, pitch in enumerate([60, 64, 67, 72, 67, 64, 62, 65, 69, 74, 69, 65]):
        piano.notes.append(pretty_midi.Note(90, pitch, i * 0.3, i * 0.3 + 0.28))
    pm.instruments.append(piano)
    path = tmp_path_factory.mktemp("motif") / "motif.mid"
    pm.write(str(path))
    return path
