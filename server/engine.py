"""The generation engine in a process of its own (MUSICREL_ENGINE=process, the default).

In one process, every request's Python work (multipart parsing, reading and writing MIDI, HTTP) competes with
the decoding loop for the GIL: torch releases the GIL inside each op and the loop has to win it back about a
hundred times per step. On a 2-core machine a thread busy 5 % of the time made decoding steps 10-25 % slower.
So the server process only parses and answers, and a child process (spawned: no fork of a process holding
threads and an OpenMP pool) owns the models (server/model.py: the continuation model, and the accompaniment
model, the infill model and the instruments model when the server has them) and runs the same
`GenerationThread` on its own GIL: continuations, accompaniments and infills are jobs through it alike. It is
a plain `python -m server.engine FD` with one end of a socket pair, so it never re-imports the server's main
module.

They talk over one pipe in typed messages (server/messages.py); the engine's metric updates are applied to
the server's own registry, and results are tokens (the server renders them). Deadlines and timings are
time.monotonic(), one clock for both processes. The server keeps the bounded queue (429) itself: it counts
the jobs not yet started. The first message is the Settings; if the server goes away the engine sees
end-of-file and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from server.jobs import (
    Failed,
    Finished,
    Job,
    JobEvent,
    JobRequest,
    OnProgress,
    Progress,
    QueueFullError,
    Started,
    WorkerStoppedError,
    to_loop,
)
from server.messages import (
    CancelJob,
    EngineFailed,
    JobUpdate,
    MetricUpdate,
    Ready,
    Stop,
    Stopped,
    SubmitJob,
)
from server.metrics import Metrics
from server.model import LoadedModel, infill_folder, load_accompanist, load_infiller, load_instrumentalist
from server.settings import Settings
from server.worker import BatchPolicy, GenerationThread, warm_up

log = logging.getLogger("musicrel.server")

MAX_RESTARTS = 3  # engine deaths in a row (none ready in between) before the service gives up
_JOB_FIELDS = ("started_at", "finished_at", "batch_jobs", "batch_rows", "generation_s", "stop_reason")


@dataclass(eq=False)
class RemoteJob(Job):
    """The server's side of a job the engine runs: cancelling it tells the engine."""

    engine: EngineProcess | None = None

    def cancel(self, reason: str) -> None:
        first = self.stop_reason is None
        super().cancel(reason)
        if first and self.engine is not None:
            self.engine._send(CancelJob(self.id, reason))


class EngineProcess:
    """A GenerationWorker (server/worker.py) whose GenerationThread runs in a child process."""

    def __init__(
        self, settings: Settings, metrics: Metrics, on_dequeue: Callable[[int, int], None] | None = None
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._on_dequeue = on_dequeue
        self.max_queue = settings.max_queue
        self.ready = threading.Event()
        self.failed: str | None = None
        self.cards: Ready | None = None  # the models' descriptions, from the engine once it is ready
        self._jobs: dict[int, RemoteJob] = {}  # submitted and not answered yet
        self._queued = 0  # of those, not started yet
        self._ids = itertools.count()
        self._lock = threading.Lock()  # _jobs, _queued, _stopping, and sends on the pipe
        self._stopping = False
        self._process: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._reader: threading.Thread | None = None
        self._deaths = 0  # engine deaths since one was last ready
        self._resend: list[RemoteJob] = []  # queued in an engine that died: sent to the next once it is ready

    def start(self) -> None:
        with self._lock:
            self._spawn()

    def _spawn(self) -> None:
        """Start an engine and the thread that reads it (called holding _lock: stop() sees the latest)."""
        ours, theirs = socket.socketpair()
        root = str(Path(__file__).resolve().parents[1])  # so `server` imports however we were started
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        with theirs:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "server.engine", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                env=env,
            )
        self._conn = Connection(ours.detach())  # EOF on it now means the engine is gone
        self._conn.send(self.settings)
        self._reader = threading.Thread(
            target=self._read, args=(self._conn, self._process), name="musicrel-engine-reader", daemon=True
        )
        self._reader.start()

    def _alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    # ---- event-loop side -------------------------------------------------------------------------

    def submit(self, request: JobRequest, deadline: float, on_progress: OnProgress = None) -> Job:
        future, report = to_loop(asyncio.get_running_loop(), on_progress)
        stream = on_progress is not None
        return self._queue(
            lambda id: RemoteJob(request, deadline, report, future, id=id, stream=stream, engine=self)
        )

    def _queue(self, make: Callable[[int], RemoteJob]) -> Job:
        with self._lock:
            if self._stopping or self.failed or not self.ready.is_set():
                raise WorkerStoppedError(self.failed or "the generation engine is not running")
            if self._queued >= self.max_queue:
                raise QueueFullError(f"{self._queued} requests are already waiting")
            job = make(next(self._ids))
            self._jobs[job.id] = job
            self._queued += 1
            self.metrics.queue_depth.set(self._queued)
            self._send_locked(SubmitJob.of(job))
        return job

    @property
    def queue_depth(self) -> int:
        return self._queued

    def _send(self, message: SubmitJob | CancelJob | Stop) -> None:
        with self._lock:
            self._send_locked(message)

    def _send_locked(self, message: SubmitJob | CancelJob | Stop) -> None:
        # The engine may be gone: the reader then fails what was in flight.
        with contextlib.suppress(OSError, ValueError):
            self._conn.send(message)

    def stop(self, timeout: float | None = None) -> None:
        """Refuse new jobs; the engine fails its queued jobs, lets the running rows finish (up to timeout)."""
        with self._lock:
            self._stopping = True
            if self._alive():
                self._send_locked(Stop(timeout))
        if self._reader is not None:
            self._reader.join(None if timeout is None else timeout + 10.0)
        if self._process is not None:
            try:
                self._process.wait(5.0)
            except subprocess.TimeoutExpired:
                log.warning("the engine process did not stop in time; killing it")
                self._process.kill()
                self._process.wait(5.0)
        self._fail_all(WorkerStoppedError("the service is shutting down"))
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()

    # ---- reader thread ---------------------------------------------------------------------------

    def _read(self, conn: Connection, process: subprocess.Popen) -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            match message:
                case MetricUpdate(name, labels, method, args):
                    if name != "queue_depth":  # the engine's queue is ours: counted in submit/_read
                        metric = getattr(self.metrics, name)
                        getattr(metric.labels(*labels) if labels else metric, method)(*args)
                case JobUpdate(job_id, Started(at)):
                    with self._lock:
                        job = self._jobs.get(job_id)
                        if job is not None and job.started_at is None:
                            job.started_at = at
                            self._dequeued_locked()
                case JobUpdate(job_id, Progress() as event):
                    job = self._jobs.get(job_id)
                    if job is not None:
                        job.report(job, event)
                case JobUpdate(job_id, Finished() | Failed() as event, fields):
                    with self._lock:
                        job = self._jobs.pop(job_id, None)
                        if job is not None and job.started_at is None:  # dropped while queued
                            self._dequeued_locked()
                    if job is None:
                        continue
                    for name, value in fields.items():
                        if name != "stop_reason" or value is not None:
                            setattr(job, name, value)
                    job.report(job, event)
                case Ready() as ready:
                    self.cards = ready
                    self._deaths = 0
                    with self._lock:  # before ready is set, so they keep their place ahead of new submissions
                        for job in self._resend:
                            self._send_locked(SubmitJob.of(job))
                        self._resend = []
                    self.ready.set()
                case EngineFailed(why):
                    self.failed = why
                case Stopped():
                    break
        if self._stopping:
            return  # stop() fails what is left
        with self._lock:  # from here submit refuses, so no job slips in after the ones failed below
            self.ready.clear()
        code = process.wait()
        if self.failed is None:
            self._deaths += 1
            if self._deaths > MAX_RESTARTS:
                self.failed = f"the generation engine exited {self._deaths} times in a row (last code {code})"
        why = self.failed or f"the generation engine exited (code {code}); it is restarting"
        log.error(why)
        with self._lock:  # a crash (e.g. the OOM killer), not a setup that cannot work: start again
            if self.failed is None and not self._stopping:
                # Only the requests it was decoding are lost with it: the ones queued behind them never
                # started, and go to the next engine (their deadlines still hold).
                running = [job for job in self._jobs.values() if job.started_at is not None]
                for job in running:
                    del self._jobs[job.id]
                self._resend = [job for job in self._jobs.values() if job.stop_reason is None]
                cancelled = [job for job in self._jobs.values() if job.stop_reason is not None]
                for job in cancelled:
                    del self._jobs[job.id]
                    self._queued -= 1
                self.metrics.queue_depth.set(self._queued)
                self._spawn()
            else:
                running, cancelled = [], []
        for job in [*running, *cancelled]:
            job._deliver(error=WorkerStoppedError(why))
        if self.failed is not None or self._stopping:
            self._fail_all(WorkerStoppedError(why))

    def _dequeued_locked(self) -> None:
        self._queued -= 1
        self.metrics.queue_depth.set(self._queued)
        if self._on_dequeue is not None:
            self._on_dequeue(1, self._queued)

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
            self._jobs.clear()
            self._queued = 0
        for job in jobs:
            job._deliver(error=error)


# ---- the engine process ---------------------------------------------------------------------------


class _RemoteMetrics:
    """Stands in for Metrics in the engine: every update becomes a MetricUpdate message."""

    def __init__(self, send: Any, name: str | None = None, labels: tuple = ()) -> None:
        self._send, self._name, self._labels = send, name, labels

    def __getattr__(self, attr: str) -> Any:
        if self._name is None:
            return _RemoteMetrics(self._send, attr)
        if attr == "labels":
            return lambda *labels: _RemoteMetrics(self._send, self._name, labels)
        return lambda *args: self._send(MetricUpdate(self._name, self._labels, attr, args))


def _picklable(error: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


def engine_main(conn: Any, settings: Settings) -> None:
    """Entry point of the engine process: load the model, run a GenerationThread, serve the pipe until told
    to stop."""
    # The server process decides when to stop (SIGTERM drains there first); Ctrl-C reaches the whole process
    # group, and the engine must not die under the requests that are draining.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     [engine] %(message)s")
    send_lock = threading.Lock()

    def send(message: Ready | EngineFailed | JobUpdate | MetricUpdate | Stopped) -> None:
        with send_lock:
            conn.send(message)

    try:
        loaded = LoadedModel.load(settings.checkpoint, device=settings.device, weights=settings.weights)
        # the other two on the CPU, as in one process
        accompanist = load_accompanist(settings.accompany_checkpoint, weights=settings.weights)
        infill = infill_folder(settings.infill_checkpoint, settings.checkpoint)
        infiller = load_infiller(infill, weights=settings.weights)
        instrumentalist = load_instrumentalist(
            settings.instruments_checkpoint, settings.checkpoint, weights=settings.weights
        )
    except Exception as exc:
        log.exception("loading the checkpoint failed")
        send(EngineFailed(f"loading the checkpoint failed: {exc}"))
        return
    jobs: dict[int, Job] = {}  # not answered yet, by id

    def report(job: Job, event: JobEvent) -> None:
        if isinstance(event, Started | Progress):
            send(JobUpdate(job.id, event))
            return
        jobs.pop(job.id, None)
        fields = {name: getattr(job, name) for name in _JOB_FIELDS}
        if isinstance(event, Failed):
            event = Failed(_picklable(event.error))
        send(JobUpdate(job.id, event, fields))

    codec = loaded.codec
    worker = GenerationThread(
        loaded.model,
        codec,
        BatchPolicy.from_settings(settings, max_queue=1 << 30),  # the queue is bounded by the server
        accompanist=accompanist,
        infiller=infiller,
        instrumentalist=instrumentalist,
        metrics=_RemoteMetrics(send),
        warmup=(lambda batch: warm_up(codec, batch)) if settings.warmup else None,
    )
    worker.start()
    while not worker.ready.wait(0.05):
        if worker.failed:
            send(EngineFailed(worker.failed))
            return
    send(
        Ready(
            loaded.card,
            accompanist.card if accompanist is not None else None,
            infiller.card if infiller is not None else None,
            instrumentalist.card if instrumentalist is not None else None,
        )
    )
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the server is gone: nobody waits for answers
            worker.stop(timeout=0)
            return
        match message:
            case SubmitJob(job_id, request, deadline, stream):
                job = Job(request, deadline, report=report, id=job_id, stream=stream)
                jobs[job_id] = job
                try:
                    worker.enqueue(job)
                except Exception as exc:
                    job._deliver(error=exc)
            case CancelJob(job_id, reason):
                job = jobs.get(job_id)
                if job is not None:
                    job.cancel(reason)
            case Stop(timeout):
                worker.stop(timeout=timeout)
                with contextlib.suppress(OSError):
                    send(Stopped())
                return


if __name__ == "__main__":
    connection = Connection(int(sys.argv[1]))
    engine_main(connection, connection.recv())
