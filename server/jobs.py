"""A generation job as the worker sees it (`Job`, whatever its task: its `request` says what to run, a
continuation of a primer, `Continue`, an accompaniment of a melody, `Accompany`, or a span of a file filled
in, `Infill`), the events it reports (`Started`, `Progress`, `Finished`, `Failed`) and `to_loop`, which turns
them into a request's future on its event loop. The worker (server/worker.py), the engine process
(server/engine.py) and the request's path (server/tasks/) all speak these."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Generator

    from musicrel.generation.melody import AccompanimentParams, AccompanimentResult
    from musicrel.generation.primer import Primer
    from musicrel.generation.sampling import ContinuationResult, SamplingParams
    from musicrel.generation.span import InfillParams, InfillResult


class QueueFullError(Exception):
    """More requests are waiting than the queue holds."""


class WorkerStoppedError(Exception):
    """The worker shut down before it could run the job."""


@dataclass(frozen=True)
class Started:
    at: float  # time.monotonic() when the job was admitted into the running batch


@dataclass(frozen=True)
class Progress:
    tokens: list[list[int]]  # each sample's tokens generated since the last Progress (streamed jobs)


@dataclass(frozen=True)
class Finished:
    result: ContinuationResult | AccompanimentResult | InfillResult


@dataclass(frozen=True)
class Failed:
    error: BaseException


JobEvent = Started | Progress | Finished | Failed
# Called on the request's loop with each sample's new tokens (a streamed job); None: not streamed.
OnProgress = Callable[[list[list[int]]], None] | None


@dataclass(frozen=True)
class Continue:
    """What a continuation job is: the parsed primer, the library's parameters and the engine's model it runs
    on. On the continuation model it joins the running batch (DecodeBatch) with the other continuations; on
    the instruments model (an upload the piano model would flatten: midi.instruments.wants_instruments) it
    runs beside that batch, in turns, as an infill does, in that model's own running batch (`steps`)."""

    primer: Primer
    params: SamplingParams
    model: str = "continuation"

    def steps(self, shared: Any) -> Generator[Any, None, Any]:
        """The job as a generator on `shared` (server.worker.SharedBatch: the instruments model's one running
        batch), stepping it once a turn and yielding each sample's tokens so far; closed early, its rows
        leave the batch."""
        job = shared.admit(self.primer, self.params)
        done = False
        try:
            while True:
                shared.step()
                result = shared.result(job)
                if result is not None:
                    done = True
                    return result
                yield shared.generated(job)
        finally:
            if not done:
                shared.stop(job)


@dataclass(frozen=True)
class Accompany:
    """What an accompaniment job is: the parsed file, its melody track (both checked by the HTTP process)
    and the library's parameters. It cannot join the continuation batch (the melody's grammar places tokens
    at their steps); the worker runs it beside the batch, one token at a time (`steps`)."""

    midi: Any  # pretty_midi.PrettyMIDI
    track: int
    params: AccompanimentParams
    model: str = "accompaniment"  # the engine's model it runs on; "instruments" when the controls ask others

    def steps(self, loaded: Any) -> Generator[Any, None, Any]:
        """The job as a generator of one token a step, on `loaded` (server.model.LoadedModel)."""
        from musicrel.generation.accompaniment import accompany_steps

        return accompany_steps(loaded.model, loaded.codec, self.midi, self.track, self.params)


@dataclass(frozen=True)
class Infill:
    """What an infill job is: the parsed file, the span to regenerate (both checked by the HTTP process) and
    the library's parameters. Like an accompaniment it runs beside the continuation batch, a token at a time
    (`musicrel.generation.infill.infill_steps`, which yields each sample's tokens so far)."""

    midi: Any  # pretty_midi.PrettyMIDI
    start: float
    end: float
    params: InfillParams
    model: str = "infill"  # or "instruments": an upload the piano infill model would flatten

    def steps(self, loaded: Any) -> Generator[Any, None, Any]:
        from musicrel.generation.infill import infill_steps

        return infill_steps(
            loaded.model, self.midi, self.start, self.end, codec=loaded.codec, params=self.params
        )


JobRequest = Continue | Accompany | Infill


@dataclass(eq=False)
class Job:
    request: JobRequest  # what to run (its params say how many rows)
    deadline: float  # time.monotonic() after which the job is abandoned
    report: Callable[[Job, JobEvent], None]  # where its events go: `to_loop`, or the engine's pipe
    future: asyncio.Future | None = None  # what the request awaits (server side; `to_loop` settles it)
    id: int = 0  # the engine's name for the job on both sides of its pipe (unused in one process)
    stream: bool = False  # report each sample's new tokens after every step (Progress)
    reported: list[int] = field(default_factory=list)  # tokens reported so far, per sample (worker side)
    enqueued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None  # admitted into the running batch
    finished_at: float | None = None
    batch_jobs: int = 0  # the most requests decoded together while this one ran (itself included)
    batch_rows: int = 0  # the most rows (samples) decoded together while this one ran
    generation_s: float = 0.0
    stop_reason: str | None = None

    @property
    def rows(self) -> int:
        return self.request.params.num_samples

    @property
    def beside(self) -> bool:
        """Run beside the continuation batch, a token at a time (an accompaniment, an infill, a continuation
        on the instruments model)."""
        return self.request.model != Continue.model

    def cancel(self, reason: str) -> None:
        """Called from the event loop (client gone, deadline): the worker stops the job at its next step."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def should_stop(self) -> bool:
        if self.stop_reason is None and time.monotonic() > self.deadline:
            self.stop_reason = "deadline"
        return self.stop_reason is not None

    def _started(self, at: float) -> None:
        self.started_at = at
        self.report(self, Started(at))

    def _report_new_tokens(self, generated: list[Any] | None) -> None:
        """Report the tokens generated since the last report (`generated`: DecodeBatch.generated)."""
        if generated is None:
            return
        if not self.reported:
            self.reported = [0] * len(generated)
        new = [tokens[done:].tolist() for tokens, done in zip(generated, self.reported, strict=True)]
        if any(new):
            self.reported = [len(tokens) for tokens in generated]
            self.report(self, Progress(new))

    def _report_new_rows(self, rows: list[Any]) -> None:
        """Report the tokens of `rows` (each sample's tokens so far: lists or arrays) added since the last
        report."""
        if not self.reported:
            self.reported = [0] * len(rows)
        new = [[int(t) for t in row[done:]] for row, done in zip(rows, self.reported, strict=True)]
        if any(new):
            self.reported = [len(row) for row in rows]
            self.report(self, Progress(new))

    def _deliver(
        self,
        result: ContinuationResult | AccompanimentResult | InfillResult | None = None,
        error: BaseException | None = None,
    ) -> None:
        self.report(self, Finished(result) if error is None else Failed(error))


def to_loop(
    loop: asyncio.AbstractEventLoop, on_progress: OnProgress = None
) -> tuple[asyncio.Future, Callable[[Job, JobEvent], None]]:
    """A future on `loop` for a request to await, and the `report` that settles it from any thread (Finished
    or Failed) and calls on_progress(tokens per sample) on the loop for each Progress."""
    future = loop.create_future()

    def report(job: Job, event: JobEvent) -> None:
        if isinstance(event, Started) or (isinstance(event, Progress) and on_progress is None):
            return
        if isinstance(event, Progress):
            call, args = on_progress, (event.tokens,)
        else:
            call, args = settle, (job, event)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening any more
            loop.call_soon_threadsafe(call, *args)

    def settle(job: Job, event: Finished | Failed) -> None:
        if future.done():
            return
        if isinstance(event, Failed) and job.stop_reason is not None:
            future.cancel()  # nobody awaits it any more: no "exception never retrieved" warning
        elif isinstance(event, Failed):
            future.set_exception(event.error)
        else:
            future.set_result(event.result)

    return future, report
