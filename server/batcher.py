"""The generation worker: one thread owns the model; requests queue up and are generated in micro-batches.

The event loop only enqueues a Job and awaits its future. The worker takes the first waiting job, waits up to
`batch_window_s` for others to join (up to `max_batch_rows` samples in all), and runs them as ONE
`generate_batch` call: on a CPU or GPU, eight rows cost far less than eight single-row runs. Results go back
to the loop with `call_soon_threadsafe`. A job whose client left or whose deadline passed is skipped if still
queued, and stopped within a decoding step (via `should_stop`) if already running.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from server.metrics import Metrics

log = logging.getLogger("musicrel.server")


class QueueFullError(Exception):
    """More requests are waiting than the queue holds."""


class WorkerStoppedError(Exception):
    """The worker shut down before it could run the job."""


@dataclass(eq=False)
class Job:
    primer: Any  # musicrel.generate.Primer
    params: Any  # musicrel.generate.SamplingParams
    rows: int
    deadline: float  # time.monotonic() after which the job is abandoned
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    finished_at: float | None = None
    batch_jobs: int = 0  # how many requests shared this job's generate_batch call
    batch_rows: int = 0
    generation_s: float = 0.0
    stop_reason: str | None = None

    def cancel(self, reason: str) -> None:
        """Called from the event loop (client gone, deadline): the worker stops the job at its next step."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def should_stop(self) -> bool:
        if self.stop_reason is None and time.monotonic() > self.deadline:
            self.stop_reason = "deadline"
        return self.stop_reason is not None

    def _deliver(self, result: Any = None, error: BaseException | None = None) -> None:
        def settle() -> None:
            if self.future.done():
                return
            if error is not None and self.stop_reason is not None:
                self.future.cancel()  # nobody awaits it any more: no "exception never retrieved" warning
            elif error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
            self.loop.call_soon_threadsafe(settle)


class Batcher:
    def __init__(
        self,
        model: Any,
        codec: Any,
        *,
        metrics: Metrics,
        max_queue: int,
        max_batch_rows: int,
        batch_window_s: float,
        generate: Callable[..., list] | None = None,
        warmup: Callable[[], None] | None = None,
    ) -> None:
        self.model = model
        self.codec = codec
        self.metrics = metrics
        self.max_queue = max_queue
        self.max_batch_rows = max_batch_rows
        self.batch_window_s = batch_window_s
        self._generate = generate
        self._warmup = warmup
        self._pending: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="musicrel-generation", daemon=True)
        self.ready = threading.Event()
        self.failed: str | None = None

    # ---- event-loop side -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, primer: Any, params: Any, deadline: float) -> Job:
        loop = asyncio.get_running_loop()
        job = Job(
            primer, params, rows=params.num_samples, deadline=deadline, future=loop.create_future(), loop=loop
        )
        with self._cond:
            if self._stopping:
                raise WorkerStoppedError("the generation worker is shutting down")
            if len(self._pending) >= self.max_queue:
                raise QueueFullError(f"{len(self._pending)} requests are already waiting")
            self._pending.append(job)
            self.metrics.queue_depth.set(len(self._pending))
            self._cond.notify()
        return job

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    def stop(self, timeout: float | None = None) -> None:
        """Refuse new jobs, fail the queued ones, let the running batch finish (up to timeout)."""
        with self._cond:
            self._stopping = True
            dropped = list(self._pending)
            self._pending.clear()
            self.metrics.queue_depth.set(0)
            self._cond.notify_all()
        for job in dropped:
            job._deliver(error=WorkerStoppedError("the service is shutting down"))
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ---- worker thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        if self._warmup is not None:
            try:
                self._warmup()
            except Exception as exc:  # reported by /readyz; the service never becomes ready
                log.exception("warm-up generation failed")
                self.failed = f"warm-up failed: {exc}"
                return
        self.ready.set()
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._run_batch(batch)

    def _next_batch(self) -> list[Job] | None:
        with self._cond:
            while not self._pending and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return None
            batch = [self._pending.popleft()]
            rows = batch[0].rows
            window_end = time.monotonic() + self.batch_window_s
            while rows < self.max_batch_rows:
                remaining = window_end - time.monotonic()
                if not self._pending:
                    if remaining <= 0 or self._stopping:
                        break
                    self._cond.wait(remaining)
                    continue
                if rows + self._pending[0].rows > self.max_batch_rows:
                    break  # it leads the next batch
                job = self._pending.popleft()
                batch.append(job)
                rows += job.rows
            self.metrics.queue_depth.set(len(self._pending))
        return batch

    def _run_batch(self, batch: list[Job]) -> None:
        live = []
        for job in batch:
            if job.should_stop():  # the client left or timed out while queued: don't spend compute on it
                self.metrics.stopped.labels(job.stop_reason).inc()
                job._deliver(error=WorkerStoppedError(f"job {job.stop_reason} before it started"))
            else:
                live.append(job)
        if not live:
            return
        try:
            results = self._generate_many(live)
        except Exception as exc:
            if len(live) == 1:
                live[0]._deliver(error=exc)
                return
            # One bad job must not fail the requests it happened to share a batch with: run each alone.
            log.warning("batch of %d failed (%s); retrying its jobs one by one", len(live), exc)
            for job in live:
                try:
                    job._deliver(self._generate_many([job])[0])
                except Exception as single_exc:
                    job._deliver(error=single_exc)
            return
        for job, result in zip(live, results, strict=True):
            job._deliver(result)

    def _generate_many(self, jobs: list[Job]) -> list:
        generate = self._generate
        if generate is None:
            from musicrel.generate import generate_batch as generate

        start = time.monotonic()
        rows = sum(job.rows for job in jobs)
        for job in jobs:
            job.started_at = start
            job.batch_jobs, job.batch_rows = len(jobs), rows
            self.metrics.queue_seconds.observe(start - job.enqueued_at)
        results = generate(
            self.model,
            self.codec,
            [(job.primer, job.params) for job in jobs],
            should_stop=lambda i: jobs[i].should_stop(),
        )
        end = time.monotonic()
        self.metrics.batches.inc()
        self.metrics.batched_jobs.inc(len(jobs))
        self.metrics.batch_rows.observe(rows)
        self.metrics.generation_seconds.observe(end - start)
        for job, result in zip(jobs, results, strict=True):
            job.finished_at, job.generation_s = end, end - start
            self.metrics.tokens_generated.inc(result.new_tokens)
            if job.stop_reason is not None:
                self.metrics.stopped.labels(job.stop_reason).inc()
        return results
