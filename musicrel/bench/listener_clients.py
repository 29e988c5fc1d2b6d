"""The load of `musicrel bench listeners`: N streaming clients, each POSTing a motif to the stream route and
recording when each note_on line arrives. Apart from the bench because the client is what must stay light
(one event loop, no JSON parse per note: a loaded client makes streams look late that were not) and what
runs in spawned processes when one loop is not enough; the criterion and the report read its `Stream`s.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field

STREAM_PATH = "/v1/continuations/stream"


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
