"""`musicrel bench reliability`: issue 15's probes as one command, against a uvicorn it starts (or --url).

- trickle: N connections each sending a real upload one byte per 0.5 s; how long until each is answered, and
  with what (408 cut off, 429 refused at once), or still held when the probe gives up;
- burst: N clients at once posting the same real MIDI file; how long the 429s take to come back, and the
  Retry-After they carry against the queue wait the accepted requests really had.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BOUNDARY = "probeb0undary"


def register(bench_sub) -> None:
    p = bench_sub.add_parser(
        "reliability",
        help="abuse probes: trickled uploads, a burst against the queue (408/429 times, Retry-After)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--url", default=None, help="probe this server instead of starting one")
    p.add_argument("--checkpoint", type=Path, default=None, help="default: a random default-size model")
    p.add_argument("--midi", type=Path, default=None, help="upload (default: the largest shared real file)")
    p.add_argument("--trickles", type=int, default=40, help="slow connections held open at once")
    p.add_argument("--give-up-s", type=float, default=30.0, help="stop trickling after this long")
    p.add_argument("--burst", type=int, default=120, help="requests sent at once")
    p.add_argument("--seconds", type=float, default=2.0, help="music per burst request")
    p.add_argument("--max-queue", type=int, default=64, help="MUSICREL_MAX_QUEUE of the started server")
    p.set_defaults(func=run)


def _multipart(midi: bytes, **fields: str) -> bytes:
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="m.mid"\r\n\r\n'
    return b"".join(parts) + head.encode() + midi + f"\r\n--{BOUNDARY}--\r\n".encode()


def _trickle(host: str, port: int, body: bytes, give_up_s: float) -> tuple[str, float]:
    """(status line or 'held', seconds) for one connection sending `body` one byte per 0.5 s."""
    start = time.monotonic()
    with socket.create_connection((host, port), timeout=give_up_s) as sock:
        sock.sendall(
            b"POST /v1/continuations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            + f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n\r\n".encode()
        )
        sock.settimeout(0.5)
        for i in range(len(body)):
            if time.monotonic() - start > give_up_s:
                return "held", time.monotonic() - start
            try:
                sock.sendall(b"1\r\n" + body[i : i + 1] + b"\r\n")
                answer = sock.recv(64)
            except TimeoutError:
                continue
            except OSError:
                return "closed", time.monotonic() - start
            return answer.split(b"\r\n")[0].decode(errors="replace") or "closed", time.monotonic() - start
    return "held", time.monotonic() - start


def _burst(url: str, midi: bytes, n: int, seconds: float) -> list[tuple[int, float, str, float | None]]:
    """(status, seconds to the answer, Retry-After, queue ms) per request, all sent at once."""
    import httpx

    results: list = [None] * n
    go = threading.Event()

    def one(i: int) -> None:
        with httpx.Client(timeout=600) as http:
            go.wait()
            start = time.monotonic()
            r = http.post(
                f"{url}/v1/continuations",
                files={"file": ("m.mid", midi, "audio/midi")},
                data={"seconds": str(seconds), "seed": str(i)},
            )
            queue_ms = r.headers.get("x-musicrel-timing-queue-ms")
            results[i] = (
                r.status_code,
                time.monotonic() - start,
                r.headers.get("retry-after", ""),
                float(queue_ms) if queue_ms else None,
            )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join()
    return results


@contextlib.contextmanager
def _server(args: argparse.Namespace):
    if args.url:
        yield args.url
        return
    import httpx

    from server.bench import _random_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or _random_checkpoint(Path(tmp) / "ckpt")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {
            **os.environ,
            "MUSICREL_CHECKPOINT": str(checkpoint),
            "MUSICREL_MAX_QUEUE": str(args.max_queue),
        }
        command = [sys.executable, "-m", "uvicorn", "server.app:app", "--port", str(port)]
        server = subprocess.Popen([*command, "--log-level", "warning"], env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{url}/readyz").status_code == 200:
                        break
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the server did not become ready")
                time.sleep(0.2)
            yield url
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)


def _default_midi() -> Path | None:
    from musicrel.bench.codec import _default_dir

    files = sorted(_default_dir().glob("*.mid"), key=lambda p: p.stat().st_size)
    return files[-1] if files else None


def run(args: argparse.Namespace) -> int:
    path = args.midi or _default_midi()
    if path is None:
        from server.bench import _motif

        midi, name = _motif(), "a generated motif"
    else:
        midi, name = path.read_bytes(), path.name
    with _server(args) as url:
        host, port = url.removeprefix("http://").split(":")
        body = _multipart(midi, seconds="1")
        answers: list = [None] * args.trickles

        def trickler(i: int) -> None:
            answers[i] = _trickle(host, int(port), body, args.give_up_s)

        threads = [threading.Thread(target=trickler, args=(i,)) for i in range(args.trickles)]
        for t in threads:
            t.start()
            time.sleep(0.01)
        for t in threads:
            t.join()
        print(
            f"trickle: {args.trickles} connections sending {name} at 1 byte / 0.5 s "
            f"(give up {args.give_up_s:g} s)"
        )
        for status in sorted({a[0] for a in answers}):
            times = [a[1] for a in answers if a[0] == status]
            print(f"  {status:<40} x{len(times):<4} after {min(times):6.2f}-{max(times):6.2f} s")

        results = _burst(url, midi, args.burst, args.seconds)
        print(
            f"burst: {args.burst} requests at once, {name} ({len(midi)} bytes), "
            f"{args.seconds:g} s of music each"
        )
        for status in sorted({r[0] for r in results}):
            rows = [r for r in results if r[0] == status]
            times = sorted(r[1] for r in rows)
            print(
                f"  {status} x{len(rows):<4} answered after median {statistics.median(times):6.2f} s, "
                f"max {times[-1]:6.2f} s"
            )
        waits = sorted(r[3] / 1000 for r in results if r[0] == 200 and r[3] is not None)
        retry = sorted({r[2] for r in results if r[0] == 429}, key=lambda x: int(x or 0))
        if waits:
            print(
                f"  accepted requests queued median {statistics.median(waits):.2f} s, max {waits[-1]:.2f} s; "
                f"Retry-After sent with the 429s: {', '.join(retry) or 'none'} s"
            )
    return 0
