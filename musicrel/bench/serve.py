"""`musicrel bench serve`: requests per second of a real uvicorn process, serial vs concurrent, side by side.

Both phases send the same requests (same motif, same seeds, so the same music and token counts); the ratio
shows what continuous batching buys over HTTP. The same requests are then decoded in this process, one at a
time vs `concurrency` in flight on one DecodeBatch: what batching the model gives at this moment on this
machine without HTTP or the engine process. Without --checkpoint a random model of the default ModelConfig
size is used.

Machine speed drifts over tens of seconds, so each pair runs in --rounds rounds with the order alternating
(serial first in even rounds, concurrent first in odd ones): drift hits both modes alike. The table sums walls
and tokens over all rounds; a line per pair gives the per-round ratios and their median.

Each client sends requests back to back until the phase's requests are gone, so the concurrent phase starts
with 8 in flight and ends with fewer (the last requests finish alone). With 2 requests per client half of that
phase was this ramp-down, which measures how a finite workload ends rather than throughput at concurrency N:
so the default is 6 requests per client.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from musicrel.bench.models import random_checkpoint
from musicrel.bench.timing import cpu_name, side_by_side

T = TypeVar("T")


def register(bench_subparsers) -> None:
    p = bench_subparsers.add_parser(
        "serve",
        help="service throughput: serial vs N concurrent clients (continuous batching)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--checkpoint", type=Path, default=None, help="default: a random default-size model")
    p.add_argument(
        "--requests", type=int, default=None, help="requests per phase (default: 6 per concurrent client)"
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds of both phases, order alternating per round")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seconds", type=float, default=2.0, help="music per request")
    p.add_argument("--batch-window-ms", type=float, default=20.0)
    p.add_argument("--torch-threads", type=int, default=None, help="MUSICREL_TORCH_THREADS for the server")
    p.add_argument(
        "--primer-cache",
        type=int,
        default=16,
        help="MUSICREL_PRIMER_CACHE: every request here has the same motif, so with it only the first one "
        "prefills; 0 makes each request pay its prefill",
    )
    p.set_defaults(func=run)


def _motif() -> bytes:
    import io

    import pretty_midi

    pm = pretty_midi.PrettyMIDI(initial_tempo=110)
    piano = pretty_midi.Instrument(program=0)
    for i in range(32):
        piano.notes.append(pretty_midi.Note(80, 55 + (i * 5) % 19, i * 0.25, i * 0.25 + 0.22))
    pm.instruments.append(piano)
    buffer = io.BytesIO()
    pm.write(buffer)
    return buffer.getvalue()


# The tests' tiny model (tests/server/conftest.py): where what is measured is the service, not the model.
TINY_MODEL = {"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64, "max_seq_len": 256}


def _side_by_side(rounds: int, serial: Callable[[], T], concurrent: Callable[[], T]) -> list[tuple[T, T]]:
    """(serial(), concurrent()) per round, serial run first in even rounds and second in odd ones."""
    results = side_by_side({"serial": serial, "concurrent": concurrent}, rounds, warmup=False, alternate=True)
    return list(zip(results["serial"], results["concurrent"], strict=True))


def _phase(url: str, motif: bytes, seeds: list[int], seconds: float, concurrency: int) -> tuple[float, int]:
    import httpx

    tokens: list[int] = []
    errors: list[str] = []
    todo = list(seeds)
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(base_url=url, timeout=600) as http:
            while True:
                with lock:
                    if not todo:
                        return
                    seed = todo.pop(0)
                r = http.post(
                    "/v1/continuations",
                    files={"file": ("motif.mid", motif, "audio/midi")},
                    data={"seconds": str(seconds), "seed": str(seed)},
                )
                if r.status_code != 200:
                    errors.append(r.text)
                    return
                tokens.append(int(r.headers["x-musicrel-tokens"]))

    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"request failed: {errors[0]}")
    return wall, sum(tokens)


def _in_process(
    checkpoint: Path,
    motif: bytes,
    seeds: list[int],
    seconds: float,
    concurrency: int,
    primer_cache: int,
    rounds: int,
) -> list[tuple[tuple[float, int], tuple[float, int]]]:
    """Per round, (wall s, tokens) of the same requests on a DecodeBatch: one vs `concurrency` in flight."""
    from musicrel.generation.decode_batch import DecodeBatch
    from musicrel.generation.primer import default_max_primer_tokens, prepare_primer
    from musicrel.generation.sampling import SamplingParams
    from musicrel.model.checkpoint import load_codec, load_model
    from musicrel.model.weights import DEFAULT_DECODE_WEIGHTS

    model, codec = load_model(checkpoint, weights=DEFAULT_DECODE_WEIGHTS), load_codec(checkpoint)  # as served
    primer = prepare_primer(codec, motif, max_tokens=default_max_primer_tokens(model))

    def closed_loop(width: int) -> tuple[float, int]:
        batch = DecodeBatch(model, codec, width, primer_cache=primer_cache)
        todo = [(primer, SamplingParams(seconds=seconds, seed=seed)) for seed in seeds]
        tokens = 0
        start = time.perf_counter()
        while todo or batch.rows:
            free = width - len(batch.rows)
            if todo and free:
                batch.admit(todo[:free])
                del todo[:free]
            tokens += sum(result.new_tokens for _, result in batch.step())
        return time.perf_counter() - start, tokens

    closed_loop(1)  # warm-up
    return _side_by_side(rounds, lambda: closed_loop(1), lambda: closed_loop(concurrency))


def run(args: argparse.Namespace) -> int:
    import httpx

    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    args.requests = args.requests or 6 * args.concurrency
    # The in-process rows run with the server's thread count, so that they compare with its numbers: the
    # count asked for, else what the server's "auto" chooses for this concurrency. (This tool talks to the
    # server over HTTP only: it does not import it.)
    threads = args.torch_threads or os.environ.get("MUSICREL_TORCH_THREADS", "auto")
    if threads == "auto":
        from musicrel.runtime.threads import choose_threads, request_reserve

        threads = choose_threads(args.concurrency, reserve=request_reserve()).threads
    threads = int(threads) if str(threads).isdigit() else None
    engine = os.environ.get("MUSICREL_ENGINE", "the server's default")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or random_checkpoint(Path(tmp) / "ckpt")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        env = {
            **os.environ,
            "MUSICREL_CHECKPOINT": str(checkpoint),
            "MUSICREL_BATCH_WINDOW_MS": str(args.batch_window_ms),
            "MUSICREL_MAX_BATCH_ROWS": str(max(16, args.concurrency)),
            "MUSICREL_MAX_SECONDS": str(max(60.0, args.seconds)),
            "MUSICREL_PRIMER_CACHE": str(args.primer_cache),
        }
        if args.torch_threads:
            env["MUSICREL_TORCH_THREADS"] = str(args.torch_threads)
        command = [sys.executable, "-m", "uvicorn", "server.app:app", "--port", str(port)]
        command += ["--log-level", "warning"]
        server = subprocess.Popen(command, env=env, cwd=Path(__file__).resolve().parents[2])
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"{url}/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the server did not become ready")
                time.sleep(0.2)
            motif = _motif()
            seeds = list(range(args.requests))
            http = _side_by_side(
                args.rounds,
                lambda: _phase(url, motif, seeds, args.seconds, 1),
                lambda: _phase(url, motif, seeds, args.seconds, args.concurrency),
            )
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
        if threads:
            import torch

            torch.set_num_threads(threads)
        local = _in_process(
            checkpoint, motif, seeds, args.seconds, args.concurrency, args.primer_cache, args.rounds
        )

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"{args.rounds} rounds of {args.requests} requests of {args.seconds:g} s each per mode, order "
        f"alternating per round, batch window {args.batch_window_ms:g} ms, torch threads "
        f"{threads or 'default'}, engine {engine}, primer cache {args.primer_cache}, load average "
        f"{load:.1f} on {cpu_name()}"
    )
    header = ("mode", "clients", "wall s", "req/s", "tokens", "tok/s", "vs serial")
    print(f"{header[0]:<26} " + " ".join(f"{h:>{max(7, len(h))}}" for h in header[1:]))
    pairs = [
        ("HTTP", http, "HTTP serial", f"HTTP concurrent x{args.concurrency}"),
        ("in-process", local, "in-process, one at a time", f"in-process, {args.concurrency} in flight"),
    ]
    requests = args.rounds * args.requests
    ratios = []
    for label, results, serial_name, concurrent_name in pairs:
        serial_wall = sum(serial[0] for serial, _ in results)
        for mode, name, clients in ((0, serial_name, 1), (1, concurrent_name, args.concurrency)):
            wall = sum(pair[mode][0] for pair in results)
            tokens = sum(pair[mode][1] for pair in results)
            print(
                f"{name:<26} {clients:>7} {wall:>7.2f} {requests / wall:>7.2f} {tokens:>7} "
                f"{tokens / wall:>7.0f} {serial_wall / wall:>8.2f}x"
            )
        per_round = [serial[0] / concurrent[0] for serial, concurrent in results]
        ratios.append(
            f"per-round ratio ({label}): {' '.join(f'{x:.2f}x' for x in per_round)}; "
            f"median {statistics.median(per_round):.2f}x"
        )
    print("\n".join(ratios))
    print("in-process rows: the same requests on a DecodeBatch in this process (no HTTP, no engine process)")
    return 0
