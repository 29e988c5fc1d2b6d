"""`musicrel bench reliability`: issue 15's probes as one command, against a uvicorn it starts (or --url).

- trickle: N connections each sending a real upload one byte per 0.5 s; how long until each is answered, and
  with what (408 cut off, 429 refused at once), or still held when the probe gives up;
- burst: N clients at once posting the same real MIDI file; how long the 429s take to come back, the
  Retry-After they carry against the parse/queue/generation times the accepted requests really had, and what
  a refused client gets when it retries after Retry-After seconds;
- load (--load 1,2,10), soak (--soak SECONDS) and the long API fuzz (--fuzz-api N): musicrel/bench/loadgen.py;
- the long generation fuzz (--fuzz-generation N): musicrel/bench/genfuzz.py, N requests steered into
  degenerate outputs, on a tiny random model with a novelty index unless --checkpoint or --url says otherwise.
Each of those runs alone (no trickle or burst unless asked for).
"""

from __future__ import annotations

import argparse
import collections
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
STAGES = ("parse", "queue", "generation")  # the X-Musicrel-Timing-*-Ms headers of an answer


def register(bench_sub) -> None:
    p = bench_sub.add_parser(
        "reliability",
        help="abuse probes: trickled uploads, a burst against the queue (408/429 times, Retry-After)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--url", default=None, help="probe this server instead of starting one")
    p.add_argument("--checkpoint", type=Path, default=None, help="default: a random default-size model")
    p.add_argument("--midi", type=Path, default=None, help="upload (default: the largest shared real file)")
    p.add_argument(
        "--trickles", type=int, default=None, help="slow connections held open at once (default 40)"
    )
    p.add_argument("--give-up-s", type=float, default=30.0, help="stop trickling after this long")
    p.add_argument("--burst", type=int, default=None, help="requests sent at once (default 120)")
    p.add_argument(
        "--load", default=None, help="open-loop load at these multiples of the capacity, e.g. 1,2,10"
    )
    p.add_argument("--soak", type=float, default=0.0, help="seconds of steady load (RSS, open files sampled)")
    p.add_argument("--soak-load", type=float, default=0.7, help="the soak's load, a multiple of the capacity")
    p.add_argument("--warmup-s", type=float, default=120.0, help="soak: growth is measured after this")
    p.add_argument("--duration", type=float, default=45.0, help="seconds per load level")
    p.add_argument("--capacity", type=float, default=None, help="requests/s (default: measured closed-loop)")
    p.add_argument(
        "--load-midi", type=Path, default=None, help="load/soak upload (default: smallest real file)"
    )
    p.add_argument("--max-in-flight", type=int, default=256, help="the load generator's bound")
    p.add_argument("--fuzz-api", type=int, default=0, help="schemathesis examples per operation and mode")
    p.add_argument(
        "--fuzz-generation",
        type=int,
        default=0,
        help="requests of the generation fuzz (musicrel/bench/genfuzz.py)",
    )
    p.add_argument("--fuzz-seed", type=int, default=0, help="the generation fuzz's seed")
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


Answer = tuple[int, float, str, dict[str, float]]


def _burst(url: str, midi: bytes, n: int, seconds: float) -> list[tuple[Answer, Answer | None]]:
    """Per request, all sent at once: its answer (status, seconds to it, Retry-After, {stage: seconds} from
    the timing headers) and, if that was a 429, the answer to one retry sent Retry-After seconds later."""
    import httpx

    results: list = [None] * n
    go = threading.Event()

    def one(i: int) -> None:
        def send(http: httpx.Client) -> Answer:
            start = time.monotonic()
            r = http.post(
                f"{url}/v1/continuations",
                files={"file": ("m.mid", midi, "audio/midi")},
                data={"seconds": str(seconds), "seed": str(i)},
            )
            stages = {
                stage: float(r.headers[f"x-musicrel-timing-{stage}-ms"]) / 1000
                for stage in STAGES
                if f"x-musicrel-timing-{stage}-ms" in r.headers
            }
            return r.status_code, time.monotonic() - start, r.headers.get("retry-after", ""), stages

        with httpx.Client(timeout=600) as http:
            go.wait()
            first = send(http)
            retry = None
            if first[0] == 429:
                time.sleep(float(first[2] or 0))
                retry = send(http)
            results[i] = (first, retry)

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
        yield args.url, None
        return
    import httpx

    from musicrel.bench.models import random_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or random_checkpoint(Path(tmp) / "ckpt")
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
            yield url, server.pid
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)


def _default_midi() -> Path | None:
    from musicrel.bench.codec import _default_dir

    files = sorted(_default_dir().glob("*.mid"), key=lambda p: p.stat().st_size)
    return files[-1] if files else None


def run(args: argparse.Namespace) -> int:
    if args.fuzz_api:
        from musicrel.bench.loadgen import fuzz_api

        return fuzz_api(args.fuzz_api)
    if args.fuzz_generation:
        return _fuzz_generation(args)
    long_runs = bool(args.load or args.soak)
    if args.trickles is None:
        args.trickles = 0 if long_runs else 40
    if args.burst is None:
        args.burst = 0 if long_runs else 120
    path = args.midi or _default_midi()
    if path is None:
        from musicrel.bench.serve import _motif

        midi, name = _motif(), "a generated motif"
    else:
        midi, name = path.read_bytes(), path.name
    with _server(args) as (url, pid):
        if long_runs:
            _long_runs(args, url, pid)
        host, port = url.removeprefix("http://").split(":")
        if args.trickles:
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

        if not args.burst:
            return 0
        pairs = _burst(url, midi, args.burst, args.seconds)
        results = [first for first, _ in pairs]
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
        for stage in STAGES:
            took = sorted(r[3][stage] for r in results if r[0] == 200 and stage in r[3])
            if took:
                median = statistics.median(took)
                print(f"  accepted: {stage:<10} median {median:6.2f} s, max {took[-1]:6.2f} s")
        retry_after = sorted({r[2] for r in results if r[0] == 429}, key=lambda x: int(x or 0))
        print(f"  Retry-After sent with the 429s: {', '.join(retry_after) or 'none'} s")
        retries = [retry for _, retry in pairs if retry is not None]
        if retries:
            # Honest Retry-After: a client that waits as told finds room (or is told a new time).
            counts = collections.Counter(r[0] for r in retries)
            print(
                "  their retries, each sent Retry-After seconds later: "
                + ", ".join(f"{status} x{count}" for status, count in sorted(counts.items()))
            )
    return 0


def _long_runs(args: argparse.Namespace, url: str, pid: int | None) -> None:
    from musicrel.bench import loadgen

    if args.load_midi is not None:
        path = args.load_midi
    else:
        from musicrel.bench.codec import _default_dir

        files = sorted(_default_dir().glob("*.mid"), key=lambda p: p.stat().st_size)
        path = files[0] if files else None
    if path is None:
        from musicrel.bench.serve import _motif

        midi, name = _motif(), "a generated motif"
    else:
        midi, name = path.read_bytes(), path.name
    timeout_s = 180.0  # past the request deadline (120 s): a client timeout means the server never answered
    capacity = args.capacity
    if capacity is None:
        clients = 16  # the default MUSICREL_MAX_BATCH_ROWS: every row busy
        capacity = loadgen.measure_capacity(url, midi, args.seconds, clients, 30.0)
        print(
            f"capacity: {capacity:.2f} requests/s answered 200 ({clients} closed-loop clients, 30 s, {name}, "
            f"{args.seconds:g} s of music each)"
        )
    if args.load:
        print(
            f"load: open loop, {args.duration:g} s per level, at most {args.max_in_flight} in flight, "
            f"{name}, {args.seconds:g} s of music each"
        )
        for multiple in [float(m) for m in args.load.split(",")]:
            result = loadgen.run_load(
                url, midi, args.seconds, multiple * capacity, args.duration, args.max_in_flight, timeout_s
            )
            loadgen.print_load(result.report(), f"{multiple:g}x")
    if args.soak:
        if pid is None:
            raise SystemExit(
                "--soak samples the server's memory: it needs the server started here, not --url"
            )
        rate = args.soak_load * capacity
        r = loadgen.soak(
            url, pid, midi, args.seconds, rate, args.soak, args.warmup_s, args.max_in_flight, timeout_s
        )
        print(
            f"soak: {args.soak:g} s at {rate:.2f} requests/s ({args.soak_load:g}x capacity), warm-up "
            f"{args.warmup_s:g} s"
        )
        loadgen.print_load(r, "steady")
        print(
            f"  RSS (server + engine): {r['rss_at_warmup_mib']:.1f} MiB after warm-up, "
            f"{r['rss_end_mib']:.1f} "
            f"MiB at the end ({r['rss_growth_pct']:+.2f} %), peak {r['rss_peak_mib']:.1f} MiB; open files "
            f"{r['fds_at_warmup']} -> {r['fds_end']} (max {r['fds_max']})"
        )
        print(f"  RSS every 5 s (MiB): {r['rss_series_mib']}")


def _fuzz_generation(args: argparse.Namespace) -> int:
    """The generation fuzz against a real uvicorn: the counts by answer, then the failures; exit status 1
    when any answer was a 5xx or wrong."""
    import httpx

    from musicrel.bench import genfuzz
    from musicrel.bench.codec import _default_dir

    files = genfuzz.motifs()
    # The real files as well, when shared: their dense windows and many tracks reach other paths.
    files.update({p.name: p.read_bytes() for p in sorted(_default_dir().glob("*.mid"))})
    with tempfile.TemporaryDirectory() as tmp:
        if args.url is None and args.checkpoint is None:
            from musicrel.bench.models import random_checkpoint
            from musicrel.bench.serve import TINY_MODEL

            tiny = random_checkpoint(Path(tmp) / "tiny", **TINY_MODEL)
            args.checkpoint = genfuzz.with_novelty_index(tiny, Path(tmp) / "ckpt")
        start = time.monotonic()
        with _server(args) as (url, _), httpx.Client(base_url=url, timeout=300) as client:

            def progress(done: int, report) -> None:
                if done % 100 == 0:
                    took = time.monotonic() - start
                    print(f"  {done} sent, {report.server_errors} server errors, {took:.0f} s")

            report = genfuzz.run(client, args.fuzz_generation, args.fuzz_seed, files, progress)
    took = time.monotonic() - start
    print(
        f"generation fuzz: {report.sent} requests (seed {args.fuzz_seed}, {len(files)} motifs) in "
        f"{took:.0f} s; "
        f"{report.server_errors} x 5xx, {len(report.failures)} failures, {report.empty_samples} samples of "
        "fewer than two notes"
    )
    for status, count in sorted(report.statuses.items()):
        print(f"  {status:<40} x{count}")
    for failure in report.failures[:20]:
        print(f"  FAIL {failure}")
    return 1 if report.failures or report.server_errors else 0
