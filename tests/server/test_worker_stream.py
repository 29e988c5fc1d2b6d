"""How often the generation worker sends streamed tokens (server/worker.py STREAM_*): after every step while
few jobs stream; past STREAM_EVERY_STEP_JOBS, at most every STREAM_REPORT_S (a message per job per step
through the engine's pipe outran a GPU's step at 1,024 rows)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from server import worker
from server.metrics import Metrics
from server.worker import BatchPolicy, GenerationThread


class _Batch:
    """A batch of `jobs` one-row jobs that never finish: every step adds a token to each."""

    def __init__(self, jobs: int):
        self.live_jobs = list(range(jobs))
        self.rows = [None] * jobs
        self.tokens = 0

    def step(self, should_stop=None):
        self.tokens += 1
        return []

    def generated(self, job_id):
        return [np.arange(self.tokens)]


class _Job:
    stream, stop_reason, batch_jobs, batch_rows = True, None, 0, 0

    def __init__(self):
        self.reports = 0

    def should_stop(self):
        return False

    def _report_new_tokens(self, generated):
        self.reports += 1


def _worker(jobs: int) -> tuple[GenerationThread, _Batch, dict]:
    policy = BatchPolicy(max_queue=8, max_batch_rows=jobs, batch_window_s=0.0)
    thread = GenerationThread(SimpleNamespace(), SimpleNamespace(), policy, metrics=Metrics())
    running = {i: _Job() for i in range(jobs)}
    thread._running = running
    return thread, _Batch(jobs), running


def test_few_streams_hear_every_step_many_at_most_every_report_period(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(worker.time, "monotonic", lambda: clock[0])
    few, batch, running = _worker(worker.STREAM_EVERY_STEP_JOBS)
    for _ in range(5):
        few._step(batch)
        clock[0] += 0.001
    assert {job.reports for job in running.values()} == {5}

    many, batch, running = _worker(worker.STREAM_EVERY_STEP_JOBS + 1)
    for _ in range(50):  # 50 steps of 1 ms: a report every STREAM_REPORT_S (20 ms), the first at once
        many._step(batch)
        clock[0] += 0.001
    assert {job.reports for job in running.values()} == {3}
