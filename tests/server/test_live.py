"""A real uvicorn process on a loopback port: a shared MIDI file end to end, SIGTERM in mid-request, and slow
uploads over raw sockets."""

from __future__ import annotations

import base64
import contextlib
import io
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pretty_midi
import pytest

from tests.server.conftest import FAST, LIVE_MAX_UPLOADS, LIVE_UPLOAD_GRACE_S, MOTIF, start_server
from tests.server.test_abuse import BOUNDARY, multipart


def test_live_continuation_of_a_shared_file(live_server, real_midi_files):
    path = min(real_midi_files, key=lambda p: p.stat().st_size)
    files = {"file": (path.name, path.read_bytes(), "audio/midi")}
    fields = {"seconds": "1", "seed": "5", "num_samples": "2", "primer_seconds": "10"}
    with httpx.Client(base_url=live_server, timeout=60) as client:
        assert client.get("/readyz").status_code == 200
        response = client.post(
            "/v1/continuations", files=files, data=fields, headers={"accept": "application/json"}
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["seed"] == 5 and len(body["samples"]) == 2
        assert 0 < body["primer"]["end_time"] - body["primer"]["start_time"] <= 10 + 1e-6
        for sample in body["samples"]:
            pm = pretty_midi.PrettyMIDI(io.BytesIO(base64.b64decode(sample["midi_base64"])))
            assert pm.get_end_time() <= 1.05

        midi = client.post("/v1/continuations", files=files, data=fields)
        assert midi.status_code == 200 and midi.headers["content-type"] == "audio/midi"
        # Sample 0 of the MIDI form is sample 0 of the JSON form: same seed, same music.
        assert midi.content == base64.b64decode(body["samples"][0]["midi_base64"])

        bad = client.post("/v1/continuations", files={"file": ("x.mid", b"MThd\x00\x00", "audio/midi")})
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "truncated"
        metrics = client.get("/metrics").text
        assert (
            'musicrel_http_requests_total{method="POST",route="/v1/continuations",status="200"} 2.0'
            in metrics
        )
        assert 'status="422"' in metrics


def new_connections() -> httpx.Client:
    """A client that opens a connection per request as httpx.get does, without building an SSL context per
    call as it does (60 ms of CPU: polling with httpx.get took a core from the server it polled)."""
    return httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


def _sample(metrics_text: str, name: str) -> float:
    for line in metrics_text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} missing from /metrics")


@pytest.mark.long(15)
def test_metrics_add_up_over_workers(tiny_checkpoint, tmp_path):
    """`musicrel serve --workers 2`: whichever worker answers a scrape reports every worker's numbers."""
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    with (
        start_server(
            tiny_checkpoint, tmp_path, cli=True, workers=2, PROMETHEUS_MULTIPROC_DIR=str(metrics_dir)
        ) as server,
        new_connections() as poll,
    ):
        deadline = time.monotonic() + 60
        ready = 0
        while ready < 10:  # both workers answer ready (each new connection may reach either)
            assert time.monotonic() < deadline, "the workers did not both become ready"
            ready = ready + 1 if poll.get(f"{server.url}/readyz").status_code == 200 else 0
            time.sleep(0.05)
        tokens: list[int] = []

        def client() -> None:
            with new_connections() as fresh:
                for i in range(3):  # a new connection per request, so the workers share them
                    r = fresh.post(f"{server.url}/v1/continuations", files={"file": ("m.mid", MOTIF)},
                                   data={"seconds": "0.5", "seed": str(i)}, timeout=60)  # fmt: skip
                    assert r.status_code == 200, r.text
                    tokens.append(int(r.headers["x-musicrel-tokens"]))

        clients = [threading.Thread(target=client) for _ in range(8)]
        for t in clients:
            t.start()
        for t in clients:
            t.join(120)
        assert len(tokens) == 24
        # Both workers served some: each keeps a counter file named after its pid.
        assert len({p.name for p in metrics_dir.glob("counter_*.db")}) >= 2
        for _ in range(6):
            text = poll.get(f"{server.url}/metrics").text
            assert _sample(text, "musicrel_tokens_generated_total") == sum(tokens)
            assert _sample(text, "musicrel_batched_jobs_total") == 24


def test_the_server_process_loads_neither_torch_nor_weights(live_process):
    """The engine process holds the models (server/model.py); the process that answers HTTP reads only the
    checkpoints' configs and receives tokens, so libtorch is never mapped into it, even after a continuation,
    a stream and an accompaniment."""
    from tests.server.test_accompaniments import MELODY

    server = live_process
    files = {"file": ("m.mid", MOTIF, "audio/midi")}
    assert (
        httpx.post(f"{server.url}/v1/continuations", files=files, data={"seconds": "0.3"}).status_code == 200
    )
    streamed = httpx.post(f"{server.url}/v1/continuations/stream", files=files, data={"seconds": "0.3"})
    assert streamed.status_code == 200
    melody = {"file": ("t.mid", MELODY, "audio/midi")}
    assert httpx.post(f"{server.url}/v1/accompaniments", files=melody, timeout=60).status_code == 200
    info = httpx.get(f"{server.url}/v1/model").json()
    assert info["parameters"] > 0 and info["accompaniment"]["parameters"] > 0  # the engine's cards
    maps = Path(f"/proc/{server.proc.pid}/maps").read_text()
    assert "libtorch" not in maps, "the HTTP process loaded torch"
    children = Path(f"/proc/{server.proc.pid}/task/{server.proc.pid}/children").read_text().split()
    assert any("libtorch" in Path(f"/proc/{pid}/maps").read_text() for pid in children)  # the engine's


@pytest.mark.long(10)
def test_sigterm_under_load_drains_and_loses_no_accepted_request(
    tiny_checkpoint, tiny_accompany_checkpoint, tmp_path
):
    """Eight continuations (held together by a 2 s batch window, long enough to watch the drain from outside)
    and an accompaniment (an engine job like a continuation) in flight when SIGTERM comes: readiness turns 503
    `draining`, a continuation or an accompaniment sent after the signal is refused, never dropped, every
    accepted one is answered 200, and the process exits 0 having said it drained. (One server for what were
    three tests, one continuation, eight, and an accompaniment in flight: each start costs seconds.)"""
    from tests.server.test_accompaniments import MELODY, melody

    n = 8
    env = {
        "MUSICREL_BATCH_WINDOW_MS": "2000",
        "MUSICREL_ACCOMPANY_CHECKPOINT": str(tiny_accompany_checkpoint),
        "MUSICREL_MAX_MELODY_SECONDS": "600",
    }
    with start_server(tiny_checkpoint, tmp_path, cli=True, **env) as server, new_connections() as poll:
        answers: list = [None] * (n + 1)
        # 40 s of melody: queued behind the batch window with the continuations, then a second or more of
        # decoding on the tiny model after them (120 s took 4-9 s more for the same checks)
        long_tune = melody(n=100, step=0.4)

        def continuation(i: int) -> None:
            answers[i] = httpx.post(
                f"{server.url}/v1/continuations",
                files={"file": ("m.mid", MOTIF, "audio/midi")},
                data={"seconds": "0.5", "seed": str(i)},
                timeout=60,
            )

        def accompaniment() -> None:
            files = {"file": ("t.mid", long_tune, "audio/midi")}
            answers[n] = httpx.post(f"{server.url}/v1/accompaniments", files=files, timeout=120)

        threads = [threading.Thread(target=continuation, args=(i,)) for i in range(n)]
        threads.append(threading.Thread(target=accompaniment))
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 20
        while f"musicrel_in_flight {n + 1}.0" not in poll.get(f"{server.url}/metrics").text:
            assert time.monotonic() < deadline, "the requests never were all in flight"
            time.sleep(0.02)

        server.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while (ready := poll.get(f"{server.url}/readyz")).status_code == 200:
            assert time.monotonic() < deadline, "readiness did not turn 503 after SIGTERM"
            time.sleep(0.02)
        assert ready.status_code == 503 and ready.json()["error"]["code"] == "draining"
        late = httpx.post(f"{server.url}/v1/continuations", files={"file": ("m.mid", MOTIF, "audio/midi")})
        assert late.status_code == 503 and late.json()["error"]["code"] == "draining"
        refused = httpx.post(
            f"{server.url}/v1/accompaniments", files={"file": ("t.mid", MELODY, "audio/midi")}
        )
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"

        for thread in threads:
            thread.join(120)
        assert [a.status_code for a in answers] == [200] * (n + 1), [a.text for a in answers]
        assert pretty_midi.PrettyMIDI(io.BytesIO(answers[1].content)).instruments  # seed 1 gives notes
        assert len(pretty_midi.PrettyMIDI(io.BytesIO(answers[n].content)).instruments) == 2
        assert server.proc.wait(60) == 0, server.log()[-3000:]
        assert "draining" in server.log()


def test_a_trickling_socket_gets_408_from_real_uvicorn_and_the_connection_is_closed(live_process):
    """Issue 15's slow uploads (test_abuse.py) against real uvicorn over raw sockets: with every upload place
    taken by a trickle one more is refused 429 at once, and a trickle is cut off 408 past the grace period and
    its connection closed. On the shared live server (its bounds: LIVE_UPLOAD_GRACE_S, LIVE_MAX_UPLOADS);
    a server of its own cost 6-16 s to start."""
    server = live_process
    port = int(server.url.rsplit(":", 1)[1])
    head = (
        "POST /v1/continuations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n\r\n"
    ).encode()

    body = multipart(**FAST)

    def chunk(i: int) -> bytes:  # the i-th byte of a real upload as an HTTP chunk of its own
        return b"1\r\n" + body[i : i + 1] + b"\r\n"

    def open_trickler() -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(head + chunk(0))
        return sock

    tricklers = [open_trickler() for _ in range(LIVE_MAX_UPLOADS)]
    time.sleep(0.3)  # let the server take them all in
    extra = open_trickler()
    start = time.monotonic()
    assert extra.recv(4096).startswith(b"HTTP/1.1 429"), "a fourth upload must be refused at once"
    assert time.monotonic() - start < 1.0

    start = time.monotonic()
    first = tricklers[0]
    answer = b""
    sent = 1
    while b"\r\n\r\n" not in answer:
        try:
            first.sendall(chunk(sent))  # one byte every 0.2 s: far below 1 KB/s
        except OSError:
            break
        sent += 1
        first.settimeout(0.2)
        with contextlib.suppress(TimeoutError):
            answer += first.recv(4096)
        assert time.monotonic() - start < 5, "the trickle was never cut off"
    assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
    assert time.monotonic() - start < LIVE_UPLOAD_GRACE_S + 1.5  # the grace period and a little
    first.settimeout(2)
    try:  # the server hangs up rather than read the rest of the trickle
        while first.recv(4096):
            pass
    except ConnectionResetError:
        pass  # closed with our unread bytes in its buffer: closed all the same
    for sock in [*tricklers, extra]:
        sock.close()
    assert (
        httpx.post(
            f"{server.url}/v1/continuations", files={"file": ("m.mid", MOTIF)}, data=FAST, timeout=30
        ).status_code
        == 200
    )
