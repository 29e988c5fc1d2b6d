"""The generation worker: one thread owns the model and decodes every request in ONE running batch.

The event loop only enqueues a Job and awaits its future. The worker holds a `DecodeBatch` (continuous
batching): before every decoding step it admits waiting jobs while rows are free (up to `max_batch_rows`
samples in all), then decodes one token for every live row. A job leaves as soon as its music is long enough,
so a short request never waits for a long one and a new one never waits for a batch to finish. When the
worker is idle, the first job waits up to `batch_window_s` for companions, so that a burst starts together
(one prefill). Results go back to the loop with `call_soon_threadsafe`. A job whose client left or whose
deadline passed is skipped if still queued, and stopped at its next step if already decoding.

Accompaniments (a Job whose request is an `Accompany`) wait in the same queue but cannot join the batch: the
melody's grammar places its tokens at their steps. The worker runs them beside it, one token at a time, in
turn, and shares its time: after a batch step that took d seconds the accompaniments get ACCOMPANIMENT_SHARE x
d seconds of steps (a credit), taken in turns of at least TURN_S: switching between the two models every
token left each step running on caches the other model had just filled. The batch keeps the larger share,
so that a continuation beside accompaniments takes less than twice its time alone; with no continuation
running the accompaniments run back to back.

Infills (`Infill`: a span of a file regenerated, musicrel.generation.infill) run beside the batch the same
way, in the same turns as the accompaniments: `infill_steps` yields after each token (with each sample's
tokens so far, which a streamed infill reports as Progress). So do the continuations of the instruments model
(a `Continue` whose `model` is "instruments": an upload the piano model would flatten), all in that model's
one running batch (`SharedBatch`), which each job's turn steps once.

A job's events (server/jobs.py: `Started`, `Progress`, `Finished`, `Failed`) leave the worker one way,
through the job's `report`: `to_loop` settles the request's future on its event loop; in the engine process
(server/engine.py, the default) they go down the pipe instead. With MUSICREL_ENGINE=thread the worker runs in
the server process.
"""

from __future__ import annotations

import asyncio
import collections
import io
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from musicrel.runtime.threads import CpuSampler, ThreadChoice, request_reserve, set_torch_threads
from server.jobs import (
    Accompany,
    Continue,
    Infill,
    Job,
    JobRequest,
    OnProgress,
    QueueFullError,
    WorkerStoppedError,
    to_loop,
)
from server.metrics import Metrics

if TYPE_CHECKING:
    from collections.abc import Generator

    from musicrel.midi.codec import EventCodec
    from musicrel.model.transformer import MusicTransformer
    from server.model import LoadedModel
    from server.settings import Settings

log = logging.getLogger("musicrel.server")

THREADS_RECHECK_S = 5.0  # how often "auto" threads look at the machine again while decoding
# The most accompaniment time the batch's steps can bank: a long batch step does not buy a long run of
# accompaniment steps that would hold the next batch step back.
MAX_CREDIT_S = 0.25
ACCOMPANIMENT_SHARE = 0.75  # accompaniment seconds per second of batch steps, while both have work
TURN_S = 0.03  # the accompaniments' shortest turn beside the batch (a streamed note waits at most this)
# Streamed tokens go out after every step while few jobs stream; past that, at most every STREAM_REPORT_S
# (a note then waits at most this, inside the page's 60 ms lead): each report is a message per job through
# the engine's pipe, and a step of a GPU's graph at 1,024 rows is shorter than 1,024 messages (issue 43).
STREAM_EVERY_STEP_JOBS = 16
STREAM_REPORT_S = 0.02


def generation_threads(
    threads: int | str | None, rows: int, sampler: CpuSampler | None = None
) -> ThreadChoice | None:
    """Set the calling thread's torch threads as MUSICREL_TORCH_THREADS says (None: leave torch alone): a
    count, or under "auto" runtime.threads' choice for `rows` rows keeping a CPU for request handling."""
    if threads is None:
        return None
    return set_torch_threads(threads, rows, reserve=request_reserve(), sampler=sampler)


def warmup_midi() -> bytes:
    """Two bars of a C-major arpeggio: enough to run prefill and a few decode steps through every path."""
    import pretty_midi

    pm = pretty_midi.PrettyMIDI(initial_tempo=120)
    piano = pretty_midi.Instrument(program=0)
    for i, pitch in enumerate((60, 64, 67, 72, 67, 64, 60, 64)):
        piano.notes.append(pretty_midi.Note(80, pitch, i * 0.25, i * 0.25 + 0.24))
    pm.instruments.append(piano)
    buffer = io.BytesIO()
    pm.write(buffer)
    return buffer.getvalue()


def warm_up_accompaniment(accompanist: LoadedModel) -> None:
    """A four-note melody accompanied once, so that the first request does not pay for the first run."""
    import pretty_midi

    from musicrel.generation.accompaniment import accompany_midi
    from musicrel.generation.melody import AccompanimentParams

    pm = pretty_midi.PrettyMIDI(initial_tempo=120)
    tune = pretty_midi.Instrument(0)
    tune.notes = [pretty_midi.Note(90, 60 + 2 * i, 0.25 * i, 0.25 * i + 0.2) for i in range(4)]
    pm.instruments.append(tune)
    start = time.perf_counter()
    accompany_midi(accompanist.model, accompanist.codec, pm, params=AccompanimentParams(seed=0))
    log.info("accompaniment warm-up took %.0f ms", 1000 * (time.perf_counter() - start))


def warm_up_infill(infiller: LoadedModel) -> None:
    """A second of a short tune filled once, so that the first request does not pay for the first run."""
    import pretty_midi

    from musicrel.generation.infill import infill
    from musicrel.generation.span import InfillParams

    pm = pretty_midi.PrettyMIDI(initial_tempo=120)
    tune = pretty_midi.Instrument(0)
    tune.notes = [pretty_midi.Note(90, 60 + i % 8, 0.25 * i, 0.25 * i + 0.2) for i in range(12)]
    pm.instruments.append(tune)
    start = time.perf_counter()
    infill(infiller.model, pm, 1.0, 1.5, codec=infiller.codec, params=InfillParams(seed=0))
    log.info("infill warm-up took %.0f ms", 1000 * (time.perf_counter() - start))


class SharedBatch:
    """The instruments model's continuations in one running DecodeBatch (continuous batching, as the piano
    model's): each job's generator (`Continue.steps`) steps it once in its turn beside the piano batch, and
    every row draws a token at each step, so N jobs in turn decode N tokens each a round, not one each as N
    batch-1 decodes would. Each row has its own random stream (its tokens are its own as far as the
    batch's floating point allows: DecodeBatch). Results wait here for their job's next turn."""

    def __init__(self, loaded: LoadedModel, max_rows: int, primer_cache: int = 0) -> None:
        self.loaded, self.max_rows, self.primer_cache = loaded, max_rows, primer_cache
        self._batch: Any = None  # made on the first admission, in the worker thread
        self._epoch = 0  # batches made so far: a job is (epoch, its id in that batch)
        self._done: dict[int, Any] = {}  # finished jobs' results by id, until their generator takes them
        self._stopped: set[int] = set()  # jobs whose generator was closed: their rows leave at the next step

    @property
    def model(self) -> Any:
        return self.loaded.model

    @property
    def codec(self) -> Any:
        return self.loaded.codec

    def admit(self, primer: Any, params: Any) -> tuple[int, int]:
        if self._batch is None:
            from musicrel.generation.decode_batch import DecodeBatch

            self._batch = DecodeBatch(
                self.loaded.model, self.loaded.codec, self.max_rows, primer_cache=self.primer_cache
            )
            self._epoch += 1
        (job,) = self._batch.admit([(primer, params)])
        return self._epoch, job

    def step(self) -> None:
        """One token for every live row; results kept for their jobs, a stopped job's dropped. A step that
        raises (a bug, not a request: admission checked those) takes the batch with it, as the piano batch's
        does (`GenerationThread._step`): its jobs fail at their next turn, the next job starts a new one."""
        if self._batch is None:
            return
        try:
            finished = self._batch.step(should_stop=self._stopped.__contains__)
        except Exception:
            self._batch, self._done, self._stopped = None, {}, set()
            raise
        for job, result in finished:
            if job in self._stopped:
                self._stopped.discard(job)
            else:
                self._done[job] = result

    def _live(self, job: tuple[int, int]) -> bool:
        return self._batch is not None and job[0] == self._epoch

    def result(self, job: tuple[int, int]) -> Any:
        """The job's ContinuationResult once it has finished (taken: asked once), else None."""
        return self._done.pop(job[1], None) if self._live(job) else None

    def generated(self, job: tuple[int, int]) -> Any:
        rows = self._batch.generated(job[1]) if self._live(job) else None
        if rows is None:
            raise RuntimeError("the instruments model's batch failed while this job decoded")
        return rows

    def stop(self, job: tuple[int, int]) -> None:
        """The job's generator was closed (the client left, the deadline passed): its rows leave now, so the
        rows the worker counts free are free here too (the other rows draw their next token meanwhile)."""
        if self._live(job) and self._done.pop(job[1], None) is None:
            self._stopped.add(job[1])
            try:
                self.step()
            except Exception:  # the batch is gone (`step`): its other jobs fail at their turn, not this close
                log.exception("the instruments model's batch failed while a job left it")

    @property
    def rows(self) -> int:
        return 0 if self._batch is None else len(self._batch.rows)


def warm_up_instruments(instrumentalist: LoadedModel) -> None:
    """A motif continued a few tokens on the instruments model, as its jobs run (`Continue.steps`)."""
    from musicrel.generation.primer import prepare_primer
    from musicrel.generation.sampling import SamplingParams

    start = time.perf_counter()
    primer = prepare_primer(instrumentalist.codec, warmup_midi(), primer_seconds=2.0)
    params = SamplingParams(seconds=0.5, seed=0, num_samples=1, max_new_tokens=8)
    for _ in Continue(primer, params, model="instruments").steps(SharedBatch(instrumentalist, 1)):
        pass
    log.info("instruments warm-up took %.0f ms", 1000 * (time.perf_counter() - start))


def warm_up(codec: Any, batch: Any) -> None:
    """A tiny generation through the worker's own batch: every path runs once before /readyz says 200."""
    from musicrel.generation.primer import prepare_primer
    from musicrel.generation.sampling import SamplingParams

    start = time.perf_counter()
    primer = prepare_primer(codec, warmup_midi(), primer_seconds=2.0)
    batch.admit([(primer, SamplingParams(seconds=0.5, seed=0, num_samples=1, max_new_tokens=8))])
    while batch.rows:
        batch.step()
    # On a GPU, the step's CUDA graph for every batch size, before the first requests (decode_graph)
    warmed = getattr(batch, "warm_buckets", lambda *_: [])(primer, SamplingParams(seed=0))
    log.info(
        "warm-up generation took %.0f ms%s",
        1000 * (time.perf_counter() - start),
        f" (the step captured at {len(warmed)} batch sizes)" if warmed else "",
    )


def _pair(job: Job) -> tuple[Any, Any]:
    """A continuation job as the running batch admits it: (primer, params)."""
    request = job.request
    assert isinstance(request, Continue)
    return request.primer, request.params


class GenerationWorker(Protocol):
    """What the service needs of the generation worker: `GenerationThread` runs it on a thread of this
    process, `server.engine.EngineProcess` in a child process. `on_dequeue(jobs, still_waiting)`, given to
    either, hears of every job leaving the queue (the service measures the drain rate from it)."""

    ready: threading.Event  # set once warmed up
    failed: str | None  # why it stopped for good

    def start(self) -> None: ...

    def submit(self, request: JobRequest, deadline: float, on_progress: OnProgress = None) -> Job:
        """Queue a job of any task (from the event loop); QueueFullError or WorkerStoppedError. With
        `on_progress`, it is called on the loop with each sample's new tokens after every step that made
        some."""
        ...

    @property
    def queue_depth(self) -> int:
        """Jobs queued and not started yet."""
        ...

    def stop(self, timeout: float | None = None) -> None: ...


@dataclass(frozen=True)
class BatchPolicy:
    """How the worker queues and batches, from the server's settings."""

    max_queue: int  # jobs waiting at most (QueueFullError past it)
    max_batch_rows: int  # samples decoding at once, accompaniments' rows included
    batch_window_s: float  # how long an idle worker's first job waits for companions
    primer_cache: int = 0  # prefilled primers the running batch keeps
    # set in the worker thread itself: OpenMP's thread count is per calling thread, so setting it elsewhere
    # would not reach the thread that generates. "auto": see `generation_threads`, chosen again every
    # THREADS_RECHECK_S while decoding.
    torch_threads: int | str | None = None

    @classmethod
    def from_settings(cls, settings: Settings, max_queue: int | None = None) -> BatchPolicy:
        """The policy `settings` describe; `max_queue` overrides theirs (the engine process queues without
        a bound: the server bounds its queue)."""
        return cls(
            max_queue=settings.max_queue if max_queue is None else max_queue,
            max_batch_rows=settings.max_batch_rows,
            batch_window_s=settings.batch_window_ms / 1000,
            primer_cache=settings.primer_cache,
            torch_threads=settings.torch_threads,
        )


class GenerationThread:
    def __init__(
        self,
        model: MusicTransformer,
        codec: EventCodec,
        policy: BatchPolicy,
        *,
        metrics: Metrics,
        decoder: Callable[..., Any] | None = None,
        warmup: Callable[[Any], None] | None = None,
        on_dequeue: Callable[[int, int], None] | None = None,
        accompanist: LoadedModel | None = None,
        infiller: LoadedModel | None = None,
        instrumentalist: LoadedModel | None = None,
    ) -> None:
        """`decoder(model, codec, max_rows, primer_cache=...)` makes the running batch (DecodeBatch when
        None; tests pass a subclass that holds the worker). `warmup(batch)` runs once on it before the worker
        is ready. `accompanist`: the accompaniment model, if the server has one (its jobs run beside the
        batch); `infiller` and `instrumentalist` (the instruments model, for the uploads the continuation
        model would flatten) likewise."""
        self.model = model
        self.torch_threads = policy.torch_threads
        self._cpu = CpuSampler()  # the machine's load since the last thread choice
        self._threads_checked = 0.0
        self._threads = 0  # the count last set in the worker thread (0: none yet)
        self.codec = codec
        self.metrics = metrics
        self.max_queue = policy.max_queue
        self.max_batch_rows = policy.max_batch_rows
        self.batch_window_s = policy.batch_window_s
        self.primer_cache = policy.primer_cache
        self._decoder = decoder
        self._warmup = warmup
        self._on_dequeue = on_dequeue
        self._pending: collections.deque[Job] = collections.deque()
        self._running: dict[int, Job] = {}  # by the batch's job id
        self.accompanist = accompanist
        self.infiller = infiller  # the infill model, if the server has one (its jobs run beside the batch)
        self.instrumentalist = instrumentalist
        # The models the jobs beside the batch run on, by their request's `model`: the instruments model's
        # continuations share its one running batch (its infills run on its weights alone, as the infill
        # model's do)
        shared = None
        if instrumentalist is not None:
            shared = SharedBatch(instrumentalist, policy.max_batch_rows, policy.primer_cache)
        self.beside_models = {Accompany.model: accompanist, Infill.model: infiller, "instruments": shared}
        self._side: list[tuple[Job, Generator[None, None, Any]]] = []  # accompaniments running, in turn
        self._turn = 0  # the next of them to step
        self._credit = 0.0  # seconds of accompaniment steps the batch's steps have left them
        self._streamed_at = 0.0  # when streamed tokens last went out (STREAM_REPORT_S)
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="musicrel-generation", daemon=True)
        self.ready = threading.Event()
        self.failed: str | None = None

    # ---- event-loop side -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, request: JobRequest, deadline: float, on_progress: OnProgress = None) -> Job:
        future, report = to_loop(asyncio.get_running_loop(), on_progress)
        job = Job(request, deadline, report=report, future=future, stream=on_progress is not None)
        self.enqueue(job)
        return job

    def enqueue(self, job: Job) -> None:
        with self._cond:
            if self._stopping:
                raise WorkerStoppedError("the generation worker is shutting down")
            if len(self._pending) >= self.max_queue:
                raise QueueFullError(f"{len(self._pending)} requests are already waiting")
            self._pending.append(job)
            self.metrics.queue_depth.set(len(self._pending))
            self._cond.notify()

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    def stop(self, timeout: float | None = None) -> None:
        """Refuse new jobs, fail the queued ones, let the running rows finish (up to timeout)."""
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

    def _new_batch(self) -> Any:
        decoder = self._decoder
        if decoder is None:
            from musicrel.generation.decode_batch import DecodeBatch as decoder
        return decoder(self.model, self.codec, self.max_batch_rows, primer_cache=self.primer_cache)

    def _run(self) -> None:
        self._set_threads(self.max_batch_rows)
        try:
            batch = self._new_batch()
            if self._warmup is not None:
                self._warmup(batch)
                if self.accompanist is not None:
                    warm_up_accompaniment(self.accompanist)
                if self.infiller is not None:
                    warm_up_infill(self.infiller)
                if self.instrumentalist is not None:
                    warm_up_instruments(self.instrumentalist)
        except Exception as exc:  # reported by /readyz; the service never becomes ready
            log.exception("warm-up generation failed")
            self.failed = f"warm-up failed: {exc}"
            return
        self.ready.set()
        while True:
            jobs = self._take(batch)
            if jobs is None:
                return
            if jobs:
                self._admit(batch, [job for job in jobs if not job.beside])
                self._start_beside([job for job in jobs if job.beside])
            if batch.rows:
                started = time.monotonic()
                batch = self._step(batch)
                earned = ACCOMPANIMENT_SHARE * (time.monotonic() - started)
                self._credit = min(self._credit + earned, MAX_CREDIT_S)
            if self._side and (not batch.rows or self._credit >= TURN_S):
                self._accompany(alone=not batch.rows)

    def _take(self, batch: Any) -> list[Job] | None:
        """Waiting jobs that fit in the free rows, in arrival order. Blocks while there is nothing to do;
        None once stopping with nothing in flight."""
        with self._cond:
            if not batch.rows and not self._side:
                while not self._pending and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return None
                # Idle: companions arriving within the window start with the first continuation (one
                # prefill); an accompaniment has no prefill to share and starts at once.
                window_end = time.monotonic() + self.batch_window_s
                while (
                    not self._stopping
                    and not self._pending[0].beside
                    and sum(j.rows for j in self._pending) < batch.free_rows
                ):
                    remaining = window_end - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            if self._stopping:
                return []  # draining: the running rows finish, nothing new starts
            jobs: list[Job] = []
            free = batch.free_rows
            side_free = self.max_batch_rows - sum(job.rows for job, _ in self._side)
            while self._pending:
                head = self._pending[0]
                # A job with more rows than its side holds is taken alone, so it fails instead of blocking.
                if head.beside:
                    if head.rows > side_free and (self._side or any(j.beside for j in jobs)):
                        break
                    side_free -= head.rows
                else:
                    if head.rows > free and (batch.rows or any(not j.beside for j in jobs)):
                        break
                    free -= head.rows
                jobs.append(self._pending.popleft())
            if jobs:
                self.metrics.queue_depth.set(len(self._pending))
                if self._on_dequeue is not None:
                    self._on_dequeue(len(jobs), len(self._pending))
        return jobs

    def _live(self, jobs: list[Job]) -> list[Job]:
        """The jobs still wanted; the others (the client left or timed out while queued) are failed here, so
        no compute is spent on them."""
        live = []
        for job in jobs:
            if job.should_stop():
                self.metrics.stopped.labels(job.stop_reason).inc()
                job._deliver(error=WorkerStoppedError(f"job {job.stop_reason} before it started"))
            else:
                live.append(job)
        return live

    def _admit(self, batch: Any, jobs: list[Job]) -> None:
        live = self._live(jobs)
        if not live:
            return
        start = time.monotonic()
        try:
            admitted = list(zip(batch.admit([_pair(job) for job in live]), live, strict=True))
        except Exception as exc:
            # One bad job must not fail the requests it arrived with: admit each alone (admit changes nothing
            # when it raises).
            if len(live) > 1:
                log.warning("admitting %d jobs failed (%s); admitting them one by one", len(live), exc)
            admitted = []
            for job in live:
                try:
                    admitted += zip(batch.admit([_pair(job)]), [job], strict=True)
                except Exception as single_exc:
                    job._deliver(error=single_exc)
        if not admitted:
            return
        self.metrics.batches.inc()
        self.metrics.batched_jobs.inc(len(admitted))
        for job_id, job in admitted:
            job._started(start)
            self._running[job_id] = job
            self.metrics.queue_seconds.observe(start - job.enqueued_at)

    # ---- accompaniments, beside the batch --------------------------------------------------------

    def _start_beside(self, jobs: list[Job]) -> None:
        """Start accompaniments and infills beside the batch, each on its model (`request.model`)."""
        for job in self._live(jobs):
            loaded = self.beside_models.get(job.request.model)
            if loaded is None:  # the HTTP process refuses them first; a guard, not a path
                job._deliver(error=WorkerStoppedError(f"no {job.request.model} model in the engine"))
                continue
            steps = job.request.steps(loaded)
            job._started(time.monotonic())
            self._side.append((job, steps))

    def _accompany(self, alone: bool) -> None:
        """Steps of the running accompaniments, one token each, in turn: while the credit the batch's steps
        left them lasts, or a single step when no continuation is decoding (the loop then looks at the queue
        again before the next)."""
        if alone:
            self._credit = 0.0
        while self._side and (alone or self._credit > 0):
            self._turn %= len(self._side)
            job, steps = self._side[self._turn]
            started = time.monotonic()
            if self._advance(job, steps):
                del self._side[self._turn]
            else:
                self._turn += 1
            self._credit -= time.monotonic() - started
            if alone:
                return

    def _advance(self, job: Job, steps: Generator[None, None, Any]) -> bool:
        """One token of an accompaniment; True once it is over (delivered, failed or stopped)."""
        if job.should_stop():
            steps.close()
            self.metrics.stopped.labels(job.stop_reason).inc()
            job._deliver(error=WorkerStoppedError(f"job {job.stop_reason}"))
            return True
        try:
            rows = next(steps)
            if job.stream and rows is not None:  # a streamed infill: each sample's tokens so far
                job._report_new_rows(rows)
            return False
        except StopIteration as done:
            job.finished_at = time.monotonic()
            job.generation_s = job.finished_at - (job.started_at or job.finished_at)
            if isinstance(job.request, Continue):  # counted as the batch's continuations are (`_step`)
                self.metrics.generation_seconds.observe(job.generation_s)
                self.metrics.tokens_generated.inc(done.value.new_tokens)
            job._deliver(done.value)
        except Exception as exc:  # the library's own refusals (a control the melody cannot take) included
            job._deliver(error=exc)
        return True

    def _set_threads(self, rows: int) -> None:
        before = self._threads
        choice = generation_threads(self.torch_threads, rows, self._cpu)
        self._threads_checked = time.monotonic()
        if choice is not None and choice.threads != before:
            self._threads = choice.threads
            log.info("generation: %s", choice)

    def _step(self, batch: Any) -> Any:
        """One decoding step; delivers the jobs that finished. Returns the batch to go on with."""
        if self.torch_threads == "auto" and time.monotonic() - self._threads_checked > THREADS_RECHECK_S:
            self._set_threads(len(batch.rows) + sum(job.rows for job, _ in self._side))
        live, rows = batch.live_jobs, len(batch.rows)
        for job_id in live:
            job = self._running[job_id]
            job.batch_jobs, job.batch_rows = max(job.batch_jobs, len(live)), max(job.batch_rows, rows)
        self.metrics.batch_rows.observe(rows)
        try:
            finished = batch.step(should_stop=lambda job_id: self._running[job_id].should_stop())
        except Exception as exc:  # a bug, not a bad request (admission checked those): start afresh
            log.exception("decoding step failed; failing its %d request(s)", len(self._running))
            for job in self._running.values():
                job._deliver(error=exc)
            self._running.clear()
            return self._new_batch()
        now = time.monotonic()
        for job_id, result in finished:
            job = self._running.pop(job_id)
            job.finished_at, job.generation_s = now, now - (job.started_at or now)
            self.metrics.generation_seconds.observe(job.generation_s)
            self.metrics.tokens_generated.inc(result.new_tokens)
            if job.stop_reason is not None:
                self.metrics.stopped.labels(job.stop_reason).inc()
            job._deliver(result)
        if len(self._running) > STREAM_EVERY_STEP_JOBS and now - self._streamed_at < STREAM_REPORT_S:
            return batch
        self._streamed_at = now
        for job_id, job in self._running.items():
            if job.stream and job.stop_reason is None:
                job._report_new_tokens(batch.generated(job_id))
        return batch
