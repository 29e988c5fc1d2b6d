"""The messages between the server and its engine process (server/engine.py), one pipe, both ways.

Server -> engine: `SubmitJob`, `CancelJob`, `Stop`. Engine -> server: `Ready` or `EngineFailed`, a `JobUpdate`
for each event of a job (server/jobs.py: a job reports the same events in both processes), `MetricUpdate`
for the worker's Prometheus updates, and `Stopped`. They live here, not in engine.py, which runs as
`__main__` in the engine process: pickled from there they would name a module the server cannot import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from server.jobs import Job, JobEvent, JobRequest

if TYPE_CHECKING:
    from server.model import ModelCard


@dataclass(frozen=True)
class SubmitJob:
    id: int
    request: JobRequest  # what to run, whatever the task (server/jobs.py)
    deadline: float
    stream: bool

    @classmethod
    def of(cls, job: Job) -> SubmitJob:
        return cls(job.id, job.request, job.deadline, job.stream)


@dataclass(frozen=True)
class CancelJob:
    id: int
    reason: str


@dataclass(frozen=True)
class Stop:
    timeout: float | None  # how long the running rows may take to finish


@dataclass(frozen=True)
class Ready:
    card: ModelCard  # the continuation model's, as loaded by the engine (server/model.py)
    accompaniment: ModelCard | None = None  # the accompaniment model's; None when the server has none
    infill: ModelCard | None = None  # the infill model's; None when the server has none
    instruments: ModelCard | None = None  # the instruments model's; None when the server has none


@dataclass(frozen=True)
class EngineFailed:
    why: str  # it cannot run (the checkpoint did not load, the warm-up failed): no restart


@dataclass(frozen=True)
class JobUpdate:
    id: int
    event: JobEvent
    fields: dict | None = None  # with Finished and Failed: the worker's measurements (_JOB_FIELDS)


@dataclass(frozen=True)
class MetricUpdate:
    name: str  # a Metrics attribute
    labels: tuple
    method: str  # inc, observe, set
    args: tuple


@dataclass(frozen=True)
class Stopped:
    pass
