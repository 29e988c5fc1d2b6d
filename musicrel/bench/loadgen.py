"""The long reliability runs of `musicrel bench reliability`: a bounded open-loop load generator at multiples
of the measured capacity, a soak (steady load while the server's memory and open files are sampled), and
the long schemathesis run.

- capacity: `clients` closed-loop clients (one request each at a time) for a while; completed requests/s.
- load: requests sent at `rate`/s on a fixed schedule (open loop: a slow server does not slow the senders),
  at most `max_in_flight` at once (the generator is bounded: past it a send is counted as not sent, never
  queued on our side). Per run: requests/s answered, p50/p99 of the answers, the 429 share, other errors
  (anything but 200 and 429), client timeouts, and each 429's Retry-After against the real wait: how long
  the request admitted just before it waited from arrival to the start of its generation (the place the
  refused client would have had).
- soak: load at a steady rate for a long time; the RSS of the server and its engine process, and their open
  file descriptors, every few seconds. Growth is measured after a warm-up (allocator and caches filling).
"""

from __future__ import annotations

import bisect
import collections
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Shot:
    sent: float  # seconds since the run began
    status: int = 0  # 0: client timeout or transport error
    took: float = 0.0
    retry_after: float | None = None
    waited: float | None = None  # parse + queue of an accepted request (its timing headers)
    error: str = ""


@dataclass
class LoadResult:
    rate: float
    duration: float
    shots: list[Shot] = field(default_factory=list)
    not_sent: int = 0  # the generator's own bound was reached

    def report(self) -> dict:
        answered = [s for s in self.shots if s.status]
        ok = [s for s in answered if s.status == 200]
        refused = [s for s in answered if s.status == 429]
        others = [s for s in answered if s.status not in (200, 429)]
        unanswered = [s for s in self.shots if not s.status]
        timeouts = [s for s in unanswered if "Timeout" in s.error]
        transport = collections.Counter(s.error for s in unanswered if "Timeout" not in s.error)
        took = sorted(s.took for s in answered) or [math.nan]
        ok_took = sorted(s.took for s in ok) or [math.nan]
        ratios = _retry_after_ratios(self.shots)
        return {
            "offered_per_s": self.rate,
            "sent": len(self.shots),
            "not_sent": self.not_sent,
            "answered_per_s": len(answered) / self.duration,
            "ok_per_s": len(ok) / self.duration,
            "p50_s": _quantile(took, 0.5),
            "p99_s": _quantile(took, 0.99),
            "ok_p50_s": _quantile(ok_took, 0.5),
            "ok_p99_s": _quantile(ok_took, 0.99),
            "share_429": len(refused) / max(1, len(self.shots)),
            "errors": len(others),
            "error_statuses": sorted({s.status for s in others}),
            "client_timeouts": len(timeouts),
            "transport_errors": dict(transport),
            "retry_after_ratio_median": statistics.median(ratios) if ratios else math.nan,
            "retry_after_within_2x": sum(0.5 <= r <= 2 for r in ratios) / len(ratios) if ratios else math.nan,
            "retry_after_compared": len(ratios),
        }


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def _retry_after_ratios(shots: list[Shot]) -> list[float]:
    """Per 429: its Retry-After over the wait of the request admitted last before it (at least 1 s: the
    header is whole seconds, at least 1)."""
    admitted = sorted((s.sent, s.waited) for s in shots if s.status == 200 and s.waited is not None)
    times = [t for t, _ in admitted]
    ratios = []
    for s in shots:
        if s.status != 429 or s.retry_after is None:
            continue
        i = bisect.bisect_right(times, s.sent) - 1
        if i >= 0:
            ratios.append(s.retry_after / max(1.0, math.ceil(admitted[i][1])))
    return ratios


def _send(http, url: str, midi: bytes, seconds: float, seed: int, shot: Shot, start: float) -> None:
    import httpx

    try:
        r = http.post(
            f"{url}/v1/continuations",
            files={"file": ("m.mid", midi, "audio/midi")},
            data={"seconds": str(seconds), "seed": str(seed)},
        )
    except httpx.HTTPError as exc:
        shot.error = type(exc).__name__
        shot.took = time.monotonic() - start - shot.sent
        return
    shot.took = time.monotonic() - start - shot.sent
    shot.status = r.status_code
    if "retry-after" in r.headers:
        shot.retry_after = float(r.headers["retry-after"])
    if r.status_code == 200:
        parse = float(r.headers.get("x-musicrel-timing-parse-ms", "nan"))
        queue = float(r.headers.get("x-musicrel-timing-queue-ms", "nan"))
        if not math.isnan(parse + queue):
            shot.waited = (parse + queue) / 1000
    elif r.status_code != 429:
        shot.error = r.text[:200]


def measure_capacity(url: str, midi: bytes, seconds: float, clients: int, duration: float) -> float:
    """Requests/s that `clients` closed-loop clients get answered 200 (one request each at a time)."""
    import httpx

    done = 0
    lock = threading.Lock()
    stop = time.monotonic() + duration

    def client(i: int) -> None:
        nonlocal done
        with httpx.Client(timeout=300) as http:
            n = 0
            while time.monotonic() < stop:
                r = http.post(
                    f"{url}/v1/continuations",
                    files={"file": ("m.mid", midi, "audio/midi")},
                    data={"seconds": str(seconds), "seed": str(1000 * i + n)},
                )
                n += 1
                if r.status_code == 200 and time.monotonic() <= stop:
                    with lock:
                        done += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done / duration


def run_load(
    url: str,
    midi: bytes,
    seconds: float,
    rate: float,
    duration: float,
    max_in_flight: int,
    timeout_s: float,
    on_tick=None,
) -> LoadResult:
    """Send at `rate`/s for `duration` s on a fixed schedule; wait for every answer (up to `timeout_s` each).
    `on_tick(elapsed)` is called about once a second from the scheduling thread (the soak samples there)."""
    import httpx

    result = LoadResult(rate=rate, duration=duration)
    slots = threading.BoundedSemaphore(max_in_flight)
    local = threading.local()
    clients: list = []

    def client():
        if not hasattr(local, "http"):
            local.http = httpx.Client(timeout=timeout_s)
            clients.append(local.http)
        return local.http

    def one(shot: Shot, seed: int, start: float) -> None:
        try:
            _send(client(), url, midi, seconds, seed, shot, start)
        finally:
            slots.release()

    start = time.monotonic()
    next_tick = 1.0
    with ThreadPoolExecutor(max_workers=max_in_flight) as pool:
        n = 0
        while True:
            due = n / rate
            if due >= duration:
                break
            now = time.monotonic() - start
            if on_tick is not None and now >= next_tick:
                on_tick(now)
                next_tick += 1.0
            if due > now:
                time.sleep(min(due - now, 0.05))
                continue
            n += 1
            if not slots.acquire(blocking=False):
                result.not_sent += 1
                continue
            shot = Shot(sent=now)
            result.shots.append(shot)
            pool.submit(one, shot, n, start)
    for http in clients:
        http.close()
    return result


def print_load(report: dict, label: str) -> None:
    r = report
    print(
        f"  {label:<10} offered {r['offered_per_s']:6.2f}/s  answered {r['answered_per_s']:6.2f}/s  "
        f"200 {r['ok_per_s']:6.2f}/s  p50 {r['p50_s']:6.2f} s  p99 {r['p99_s']:6.2f} s  "
        f"(200s: p50 {r['ok_p50_s']:6.2f} s, p99 {r['ok_p99_s']:6.2f} s)"
    )
    print(
        f"  {'':<10} 429 share {100 * r['share_429']:5.1f} %  other errors {r['errors']} "
        f"{r['error_statuses'] or ''}  client timeouts {r['client_timeouts']}  transport errors "
        f"{r['transport_errors'] or 0}  not sent {r['not_sent']}  "
        f"Retry-After / real wait: median {r['retry_after_ratio_median']:.2f}, within 2x "
        f"{100 * r['retry_after_within_2x']:.0f} % of {r['retry_after_compared']}"
    )


# ---- soak: memory and open files of the server and its engine ----------------------------------------------


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def sample_process(pid: int) -> tuple[int, int]:
    """(RSS in KiB, open file descriptors) of `pid` and its children together."""
    rss = fds = 0
    for p in [pid, *_children(pid)]:
        try:
            rss += _rss_kib(p)
            fds += len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            continue
    return rss, fds


def soak(
    url: str,
    pid: int,
    midi: bytes,
    seconds: float,
    rate: float,
    duration: float,
    warmup: float,
    max_in_flight: int,
    timeout_s: float,
) -> dict:
    samples: list[tuple[float, int, int]] = []

    def tick(elapsed: float) -> None:
        if int(elapsed) % 5 == 0:
            samples.append((elapsed, *sample_process(pid)))

    result = run_load(url, midi, seconds, rate, duration, max_in_flight, timeout_s, on_tick=tick)
    samples.append((duration, *sample_process(pid)))
    after = [s for s in samples if s[0] >= warmup]
    base, last = after[0], after[-1]
    peak = max(s[1] for s in after)
    report = result.report()
    report.update(
        samples=len(samples),
        rss_at_warmup_mib=base[1] / 1024,
        rss_end_mib=last[1] / 1024,
        rss_peak_mib=peak / 1024,
        rss_growth_pct=100 * (last[1] - base[1]) / base[1],
        fds_at_warmup=base[2],
        fds_end=last[2],
        fds_max=max(s[2] for s in after),
        rss_series_mib=[round(s[1] / 1024, 1) for s in samples],
    )
    return report


def fuzz_api(examples: int) -> int:
    """The schemathesis test with `examples` per operation and mode: the long run of the short one."""
    env = {**os.environ, "MUSICREL_FUZZ_EXAMPLES": str(examples), "PYTHONPATH": str(REPO)}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/server/test_api_fuzz.py",
    ]
    return subprocess.call(command, cwd=REPO, env=env)
