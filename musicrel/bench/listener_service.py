"""The service `musicrel bench listeners` measures, from outside: a fresh uvicorn process of server.app:app
per N (its batch and admission bounds sized for N) and its memory sampled by process id (nvidia-smi on a
GPU, the resident set on a CPU). Apart from the bench because it never imports `server` and knows nothing
of streams: only processes, ports, environment and bytes.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_BATCH_ROWS = 1024  # server/settings.py's bound on MUSICREL_MAX_BATCH_ROWS
MEMORY_PERIOD_S = 0.25
MIB = 1024 * 1024


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
        "MUSICREL_INSTRUMENTS_CHECKPOINT": str(none),
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


def raise_open_files(n: int) -> None:
    """Every stream holds a socket here and one in the service: lift the soft limit of open files (the
    service inherits it) to the hard one, which 1,024 streams pass on many systems' default of 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 4 * n + 1024)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


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


def gpu_name() -> str | None:
    """nvidia-smi's name and memory of the GPUs, for the report; None without one."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or None
    return None
