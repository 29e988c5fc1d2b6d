"""`musicrel bench listeners`: how many streaming listeners one service holds at real time (issue 43).

Per N (a list), a fresh `uvicorn server.app:app` (MUSICREL_DEVICE from --device, its batch N rows wide, its
queue and upload bounds above N) and N concurrent clients in this process (asyncio, one httpx.AsyncClient
with a connection per client; --client-processes splits them among processes), all sent at once (--ramp-s
spreads them), each POSTing a real motif to
/v1/continuations/stream for --seconds of music and reading the NDJSON as it comes. Per N, one row:

- on time: the share of streams that a listener hears without a gap, played as the page plays a stream
  (server/static/js/synth.js `liveOn`): the first note_on sounds LEAD_S after it arrives, every later one at
  its distance in music time from the first; a note that arrives later than LEAD_S - SLIP_MARGIN_S before
  its place slips the timeline. A stream is on time when no note_on slips, i.e. when for every note_on i
  (arrival a_i on this client's clock, music time m_i; 0 the first)
      (a_i - a_0) - (m_i - m_0) <= LEAD_S - SLIP_MARGIN_S,
  and it ended with its result (no error, no HTTP refusal, within the phase's time limit) with a note in it.
- dense: the share of streams that decoded at least 40 events a second (EVENTS_PER_SECOND_OF_MUSIC, a dense
  performance) while in the batch: the result's new_tokens / its timings.decode_ms. What the music itself
  needs is the "on time" column; this one says whether a dense performance would still have kept up.
- first note p50 / p99: from sending the request to the arrival of its first note_on line (upload, parse,
  queue, prefill, the tokens before the first note, HTTP).
- tokens/s: the new_tokens of every result (server side) over the phase's wall time (first send to last
  answer); per stream: the median of new_tokens / decode time.
- memory per stream: (peak during the phase - idle before it) / N, the idle and peak sampled every
  MEMORY_PERIOD_S from outside: on cuda the GPU memory nvidia-smi gives the server's processes (the engine's
  CUDA context and its caching allocator's reservation: at least torch.cuda.max_memory_allocated), on cpu
  the resident set of the server and its engine.
- holds: the largest N measured whose on-time share is at least --hold-share.

The client's event loop lag (a ticker's worst delay) is printed with each row: a loaded client would make
streams look late that were not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from musicrel.bench.generate import EVENTS_PER_SECOND_OF_MUSIC
from musicrel.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "server" / "static" / "examples"
STREAM_PATH = "/v1/continuations/stream"
LEAD_S = 0.06  # server/static/js/modes/live.js LIVE_LEAD_S: the page plays the first note this late
SLIP_MARGIN_S = 0.005  # synth.js liveOn: a note starting sooner than this from now slips
DEFAULT_LISTENERS = {"cuda": (1, 64, 256, 1024), "cpu": (1, 4, 8)}
MAX_BATCH_ROWS = 1024  # server/settings.py's bound on MUSICREL_MAX_BATCH_ROWS
MEMORY_PERIOD_S = 0.25
MIB = 1024 * 1024


def register(bench_sub) -> None:
    p = bench_sub.add_parser(
        "listeners",
        help="N concurrent streaming listeners per N: on-time share, first-note p50/p99, tokens/s, memory",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", type=Path, default=Path("checkpoints/default"))
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="MUSICREL_DEVICE of the service")
    p.add_argument(
        "--listeners",
        default=None,
        help="comma list of N; None: 1,64,256,1024 on cuda, 1,4,8 on cpu",
    )
    p.add_argument("--seconds", type=float, default=10.0, help="music each stream asks for")
    p.add_argument(
        "--motif",
        type=Path,
        action="append",
        default=[],
        help="a MIDI file the clients upload in turn (repeatable); none: server/static/examples/*.mid",
    )
    p.add_argument("--ramp-s", type=float, default=0.0, help="spread the N sends over this many seconds")
    p.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="split the N clients among this many processes (when one process's event loop lags: the lag is "
        "printed per N)",
    )
    p.add_argument("--lead-s", type=float, default=LEAD_S, help="the player's lead before the first note")
    p.add_argument("--hold-share", type=float, default=0.99, help="on-time share that counts as held")
    p.add_argument(
        "--phase-timeout-s",
        type=float,
        default=None,
        help="give up on a phase's streams after this long; None: 3 x seconds + 60",
    )
    p.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")


# ---------------------------------------------------------------- the real-time criterion


def lateness(arrivals: list[float], times: list[float]) -> float:
    """The most any note_on arrived after its place on a timeline started at the first one's arrival:
    max over i of (a_i - a_0) - (m_i - m_0), 0 for the first note itself; -inf with no note."""
    if not arrivals:
        return -math.inf
    a0, m0 = arrivals[0], times[0]
    return max((a - a0) - (m - m0) for a, m in zip(arrivals, times, strict=True))


def on_time(arrivals: list[float], times: list[float], lead_s: float = LEAD_S) -> bool:
    """A player that starts the first note `lead_s` after it arrives plays every note_on in its place (none
    slips: see the module docstring). False with no note at all."""
    return bool(arrivals) and lateness(arrivals, times) <= lead_s - SLIP_MARGIN_S


# ---------------------------------------------------------------- one stream


@dataclass
class Stream:
    """What one client saw. Times are seconds on this process's monotonic clock."""

    sent: float = 0.0
    status: int = 0  # HTTP status; 0: no answer (transport error, or given up)
    error: str = ""  # a refusal's or an error event's code, or the transport error's name
    arrivals: list[float] = field(default_factory=list)  # of each note_on line
    times: list[float] = field(default_factory=list)  # each note_on's music time
    done: float | None = None  # the result line's arrival
    new_tokens: int = 0
    decode_ms: float | None = None

    @property
    def first_note_s(self) -> float | None:
        return self.arrivals[0] - self.sent if self.arrivals else None

    @property
    def finished(self) -> bool:
        return self.done is not None and not self.error

    def take(self, line: bytes, at: float) -> None:
        """One NDJSON line, arrived at `at`."""
        if line.startswith(b'{"type":"note_on"'):
            # its last field is the time (server/tasks/stream.py `note_line`): no JSON parse per note, the
            # client's main work at a thousand streams
            self.arrivals.append(at)
            self.times.append(float(line[line.rindex(b'"time":') + 7 : line.rindex(b"}")]))
        elif line.startswith(b'{"type":"result"'):
            event = json.loads(line)
            self.done = at
            self.new_tokens = int(event["new_tokens"])
            self.decode_ms = (event.get("timings") or {}).get("decode_ms")
        elif line.startswith(b'{"type":"error"'):
            event = json.loads(line)
            self.error = (event.get("error") or {}).get("code") or f"error {event.get('status')}"


async def _listen(http, stream: Stream, motif: bytes, seconds: float, seed: int) -> None:
    import httpx

    stream.sent = time.monotonic()
    files = {"file": ("motif.mid", motif, "audio/midi")}
    data = {"seconds": str(seconds), "seed": str(seed)}
    try:
        async with http.stream("POST", STREAM_PATH, files=files, data=data) as r:
            stream.status = r.status_code
            if r.status_code != 200:
                body = await r.aread()
                try:
                    stream.error = json.loads(body)["error"]["code"]
                except (ValueError, KeyError, TypeError):
                    stream.error = f"HTTP {r.status_code}"
                return
            rest = b""
            async for chunk in r.aiter_raw():
                at = time.monotonic()
                *lines, rest = (rest + chunk).split(b"\n")
                for line in lines:
                    stream.take(line, at)
    except httpx.HTTPError as exc:
        stream.error = type(exc).__name__


async def _ticker(lags: list[float], stop: asyncio.Event, period: float = 0.01) -> None:
    """The event loop's lag: how late each `period` sleep wakes."""
    while not stop.is_set():
        start = time.monotonic()
        await asyncio.sleep(period)
        lags.append(time.monotonic() - start - period)


async def _phase(
    url: str,
    motifs: list[bytes],
    n: int,
    seconds: float,
    ramp_s: float,
    timeout_s: float,
    first: int = 0,
    total: int | None = None,
    go_at: float | None = None,
) -> tuple[list[Stream], float, list[float]]:
    """Streams first .. first + n - 1 of `total` (default n), sent at once at `go_at` (time.monotonic(); now
    when None) or spread over ramp_s; (streams, wall seconds from go to the last answer, loop lags)."""
    import httpx

    total = total or n
    if go_at is not None:
        await asyncio.sleep(max(0.0, go_at - time.monotonic()))

    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    timeout = httpx.Timeout(timeout_s, connect=60.0)
    streams = [Stream() for _ in range(n)]
    lags: list[float] = []
    stop = asyncio.Event()
    ticker = asyncio.create_task(_ticker(lags, stop))
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as http:

        async def one(i: int) -> None:
            k = first + i  # the stream's number among all: its motif, seed and place in the ramp
            if ramp_s > 0:
                await asyncio.sleep(ramp_s * k / total)
            await _listen(http, streams[i], motifs[k % len(motifs)], seconds, seed=k)

        start = time.monotonic()
        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        _, pending = await asyncio.wait(tasks, timeout=timeout_s + ramp_s)
        for task in pending:  # given up: counted as not finished
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for s, task in zip(streams, tasks, strict=True):
            if s.done is None and not s.error:  # cut off by the phase's limit, or ended without a result
                s.error = "gave_up" if task in pending else "no_result"
        wall = max([s.done for s in streams if s.done is not None] or [time.monotonic()]) - start
    stop.set()
    await ticker
    return streams, wall, lags


def run_phase(
    url: str, motifs: list[bytes], n: int, seconds: float, ramp_s: float, timeout_s: float, processes: int = 1
) -> tuple[list[Stream], float, list[float]]:
    """N streams from this process, or from `processes` processes (spawned, each a share of the streams on
    its own event loop, all sent at the same moment: arrival times on the one monotonic clock)."""
    processes = max(1, min(processes, n))
    if processes == 1:
        return _run_share(url, motifs, n, seconds, ramp_s, timeout_s)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    shares = [n // processes + (i < n % processes) for i in range(processes)]
    firsts = [sum(shares[:i]) for i in range(processes)]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(processes, mp_context=context) as pool:
        list(pool.map(_ready, range(processes)))  # started and imported before the clock starts
        go_at = time.monotonic() + 1.0
        futures = [
            pool.submit(_run_share, url, motifs, k, seconds, ramp_s, timeout_s, f, n, go_at)
            for k, f in zip(shares, firsts, strict=True)
        ]
        parts = [future.result() for future in futures]
    streams = [stream for part, _, _ in parts for stream in part]
    ends = [s.done for s in streams if s.done is not None]
    wall = (max(ends) - go_at) if ends else max(w for _, w, _ in parts)
    return streams, wall, [lag for _, _, lags in parts for lag in lags]


def _ready(_: int) -> bool:
    import httpx  # noqa: F401  (the import a client process pays before its first request)

    return True


def _run_share(url: str, motifs: list[bytes], n: int, seconds: float, ramp_s: float, timeout_s: float,
               first: int = 0, total: int | None = None, go_at: float | None = None):  # fmt: skip
    """`_phase` on an event loop of its own (uvloop's where installed: the GPU image has it)."""
    coro = _phase(url, motifs, n, seconds, ramp_s, timeout_s, first, total, go_at)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)


# ---------------------------------------------------------------- summary


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile; nan with no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def summarize(n: int, streams: list[Stream], wall: float, lead_s: float) -> dict:
    """One row of the table (memory added by the caller)."""
    finished = [s for s in streams if s.finished]
    timely = [s for s in finished if on_time(s.arrivals, s.times, lead_s)]
    rates = [s.new_tokens / (s.decode_ms / 1000) for s in finished if s.decode_ms]
    firsts = [1000 * s.first_note_s for s in streams if s.first_note_s is not None]
    late = [lateness(s.arrivals, s.times) for s in finished if s.arrivals]
    errors: dict[str, int] = {}
    for s in streams:
        if not s.finished:
            errors[s.error or "no_result"] = errors.get(s.error or "no_result", 0) + 1
    return {
        "listeners": n,
        "finished": len(finished),
        "errors": errors,
        "silent": sum(1 for s in finished if not s.arrivals),
        "on_time_share": len(timely) / n,
        "dense_share": sum(r >= EVENTS_PER_SECOND_OF_MUSIC for r in rates) / n,
        "first_note_p50_ms": quantile(firsts, 0.5),
        "first_note_p99_ms": quantile(firsts, 0.99),
        "lateness_p99_s": quantile(late, 0.99),
        "tokens": sum(s.new_tokens for s in finished),
        "tokens_per_s": sum(s.new_tokens for s in finished) / wall if wall > 0 else math.nan,
        "stream_tokens_per_s_median": statistics.median(rates) if rates else math.nan,
        "wall_s": wall,
    }


def holds(rows: list[dict], share: float) -> int | None:
    """The largest N measured whose on-time share reaches `share`."""
    held = [r["listeners"] for r in rows if r["on_time_share"] >= share]
    return max(held) if held else None


COLUMNS = (
    ("N", "listeners", "{:d}"),
    ("on time", "on_time_share", "{:.1%}"),
    (">=40 ev/s", "dense_share", "{:.1%}"),
    ("first note p50 ms", "first_note_p50_ms", "{:.0f}"),
    ("p99 ms", "first_note_p99_ms", "{:.0f}"),
    ("tokens/s", "tokens_per_s", "{:,.0f}"),
    ("per stream tok/s", "stream_tokens_per_s_median", "{:,.0f}"),
    ("MiB per stream", "memory_per_stream_mib", "{:.2f}"),
    ("errors", "errors", "{}"),
)


def table(rows: list[dict]) -> list[str]:
    def cell(fmt: str, value) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "n/a"
        if isinstance(value, dict):
            return ", ".join(f"{k} x{v}" for k, v in value.items()) or "0"
        return fmt.format(value)

    cells = [[cell(fmt, r.get(key)) for _, key, fmt in COLUMNS] for r in rows]
    header = [name for name, _, _ in COLUMNS]
    widths = [max(len(c[i]) for c in [header, *cells]) for i in range(len(header))]
    line = " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    return [line, "-" * len(line)] + [
        " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells
    ]


# ---------------------------------------------------------------- memory, from outside the service


def _family(pid: int) -> list[int]:
    """`pid` and its descendants (the uvicorn process and its engine)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
    return out


def _rss_bytes(pids: list[int]) -> int:
    total = 0
    for p in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def _smi(query: str) -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10
    ).stdout
    return [[x.strip() for x in row.split(",")] for row in out.splitlines()]


def _gpu_bytes(pids: list[int]) -> int:
    """GPU memory nvidia-smi gives these processes; where it names none of them (a sandbox whose process ids
    it does not see), the memory used on GPU 0, nothing else running there."""
    wanted, total, seen = set(pids), 0, False
    for row in _smi("--query-compute-apps=pid,used_memory"):
        if len(row) == 2 and row[0].isdigit() and int(row[0]) in wanted and row[1].isdigit():
            total, seen = total + int(row[1]) * MIB, True
    if seen:
        return total
    rows = _smi("--query-gpu=memory.used")
    return int(rows[0][0]) * MIB if rows and rows[0] and rows[0][0].isdigit() else 0


class MemorySampler:
    """Samples the service's memory (GPU on cuda, RSS on cpu) every MEMORY_PERIOD_S on a thread."""

    def __init__(self, pid: int, device: str) -> None:
        self.pid, self.kind = pid, "gpu" if device == "cuda" else "rss"
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read(self) -> int:
        """Bytes now; 0 when they cannot be read (no nvidia-smi: the row says n/a)."""
        pids = _family(self.pid)
        try:
            return _gpu_bytes(pids) if self.kind == "gpu" else _rss_bytes(pids)
        except (OSError, subprocess.SubprocessError):
            return 0

    def _loop(self) -> None:
        while not self._stop.wait(MEMORY_PERIOD_S):
            self.peak = max(self.peak, self.read())

    def __enter__(self) -> MemorySampler:
        self.peak = self.read()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak = max(self.peak, self.read())


# ---------------------------------------------------------------- the service


def service_env(checkpoint: Path, device: str, n: int, seconds: float, timeout_s: float, none: Path) -> dict:
    """The started service's environment: its batch N rows wide, every admission bound above N, only the
    continuation model loaded (`none`: a folder with no checkpoint)."""
    return {
        **os.environ,
        "MUSICREL_CHECKPOINT": str(checkpoint),
        "MUSICREL_DEVICE": device,
        "MUSICREL_MAX_BATCH_ROWS": str(min(MAX_BATCH_ROWS, max(1, n))),
        "MUSICREL_MAX_QUEUE": str(n + 16),
        "MUSICREL_MAX_UPLOADS": str(n + 16),
        "MUSICREL_MAX_SECONDS": str(max(60.0, seconds)),
        "MUSICREL_REQUEST_TIMEOUT_S": str(max(120.0, timeout_s)),
        "MUSICREL_ACCOMPANY_CHECKPOINT": str(none),
        "MUSICREL_INFILL_CHECKPOINT": str(none),
    }


@contextlib.contextmanager
def service(env: dict, backlog: int, ready_timeout_s: float = 300.0):
    """A uvicorn process of server.app:app on a free port; yields (url, pid) once /readyz answers 200."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "uvicorn", "server.app:app", "--port", str(port)]
    command += ["--backlog", str(backlog), "--log-level", "warning"]
    path = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    server = subprocess.Popen(command, env={**env, "PYTHONPATH": path}, cwd=REPO)
    try:
        started = time.monotonic()
        deadline = started + ready_timeout_s
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/readyz").status_code == 200:
                    break
            if server.poll() is not None:
                raise RuntimeError(f"the service exited with code {server.returncode} before it was ready")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the service was not ready within {ready_timeout_s:g} s")
            time.sleep(0.2)
        # what the device check's listener steps budget for a start (gpucheck.LISTENER_START_S)
        print(f"  service ready in {time.monotonic() - started:.1f} s", flush=True)
        yield url, server.pid
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)


def _raise_open_files(n: int) -> None:
    """Every stream holds a socket here and one in the service: lift the soft limit of open files (the
    service inherits it) to the hard one, which 1,024 streams pass on many systems' default of 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 4 * n + 1024)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def phase_timeout_s(seconds: float) -> float:
    """The default limit of a phase's streams: three times their music, and a minute."""
    return 3 * seconds + 60


def listener_counts(text: str | None, device: str) -> list[int]:
    if text is None:
        return list(DEFAULT_LISTENERS[device])
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--listeners must be a comma list of whole numbers, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise ConfigError(f"--listeners must be at least 1 each, got {text!r}")
    return counts


def load_motifs(paths: list[Path]) -> list[bytes]:
    files = paths or sorted(EXAMPLES.glob("*.mid"))
    if not files:
        raise ConfigError(f"no motif: give --motif FILE (none in {EXAMPLES})", code="no_motif")
    return [p.read_bytes() for p in files]


def measure_one(args: argparse.Namespace, n: int, uploads: list[bytes], timeout_s: float, none: Path) -> dict:
    """N's row: a fresh service, N streams, its memory sampled meanwhile."""
    env = service_env(args.checkpoint, args.device, n, args.seconds, timeout_s, none)
    with service(env, backlog=max(2048, 2 * n)) as (url, pid):
        memory = MemorySampler(pid, args.device)
        with memory:
            idle = memory.peak
            streams, wall, lags = run_phase(
                url, uploads, n, args.seconds, args.ramp_s, timeout_s, args.client_processes
            )
    row = summarize(n, streams, wall, args.lead_s)
    row.update(
        memory_kind=memory.kind,
        memory_idle_mib=idle / MIB,
        memory_peak_mib=memory.peak / MIB,
        memory_per_stream_mib=(memory.peak - idle) / MIB / n if memory.peak else math.nan,
        client_lag_max_ms=1000 * max(lags, default=0.0),
        client_lag_p99_ms=1000 * quantile(lags, 0.99),
    )
    return row


def measure(args: argparse.Namespace) -> dict:
    """Every N's row (a fresh service each) and what was measured with; written to --out after each N, so
    that a run cut off (the device check's time limit) keeps the rows it has. A service that fails (does not
    start, dies) fails its row, not the rows after it."""
    counts = listener_counts(args.listeners, args.device)
    if args.seconds <= 0:
        raise ConfigError(f"--seconds must be > 0, got {args.seconds}")
    if not (args.checkpoint / "config.json").is_file():
        raise ConfigError(f"{args.checkpoint} holds no checkpoint (config.json)", code="no_checkpoint")
    uploads = load_motifs(args.motif)
    timeout_s = args.phase_timeout_s or phase_timeout_s(args.seconds)
    _raise_open_files(max(counts))
    rows: list[dict] = []
    report = {
        "checkpoint": str(args.checkpoint),
        "device": args.device,
        "seconds": args.seconds,
        "motifs": [p.name for p in args.motif] or sorted(p.name for p in EXAMPLES.glob("*.mid")),
        "ramp_s": args.ramp_s,
        "client_processes": args.client_processes,
        "lead_s": args.lead_s,
        "hold_share": args.hold_share,
        "phase_timeout_s": timeout_s,
        "rows": rows,
        "holds": None,
        "gpu": _gpu_name() if args.device == "cuda" else None,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            try:
                row = measure_one(args, n, uploads, timeout_s, Path(tmp))
            except (RuntimeError, OSError) as exc:
                row = {"listeners": n, "failed": f"{type(exc).__name__}: {exc}", "errors": {"failed": n}}
                print(f"  N={n}: failed: {row['failed']}", flush=True)
            else:
                print(
                    f"  N={n}: {row['finished']} finished in {row['wall_s']:.1f} s, on time "
                    f"{row['on_time_share']:.1%}, client loop lag p99 {row['client_lag_p99_ms']:.0f} ms, "
                    f"max {row['client_lag_max_ms']:.0f} ms",
                    flush=True,
                )
            rows.append(row)
            report["holds"] = holds([r for r in rows if "failed" not in r], args.hold_share)
            if args.out is not None:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(_plain(report), indent=1, allow_nan=False) + "\n")
    return report


def _gpu_name() -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or None
    return None


def run(args: argparse.Namespace) -> int:
    print(
        f"musicrel bench listeners: {args.checkpoint} on {args.device}, {args.seconds:g} s of music per "
        f"stream, a fresh service per N",
        flush=True,
    )
    report = measure(args)
    for line in table(report["rows"]):
        print(line)
    held = report["holds"]
    print(
        f"holds: {held if held is not None else 'none'} (the largest N measured with >= "
        f"{args.hold_share:.0%} of its streams on time)"
    )
    print(
        f"on time: no note_on later than a player that starts the first {1000 * args.lead_s:.0f} ms after "
        f"it arrives needs it; >=40 ev/s: new_tokens / decode time; memory: "
        f"({'GPU' if args.device == 'cuda' else 'RSS'} peak - idle) / N"
    )
    if args.out is not None:
        print(f"wrote {args.out}")
    return 0


def _plain(value):
    """`value` with every nan or infinite float as None: strict JSON."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
