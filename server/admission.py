"""Admission of continuation requests before their upload is read, and the Retry-After that comes with a 429.

A request is admitted (or refused with 429 `queue_full`) as it arrives, before a byte of its body is
read: under a burst, a refusal used to wait for the whole upload to be parsed (up to 5.8 s measured). The
queue bound counts the requests already admitted and still uploading or parsing together with those queued
for the worker, so the admitted ones never find the queue full once parsed.

Retry-After says how long the requests ahead take to leave the queue at the rate it has been draining: a fixed
2 s was 8-16x too short under a 120-request burst (median wait 17 s).
"""

from __future__ import annotations

import math
import threading
import time

from server.errors import ApiError
from server.metrics import Metrics
from server.settings import Settings


class DrainMeter:
    """Seconds per job leaving the queue (to start decoding, or dropped because its client left), an
    exponentially weighted average over the gaps between departures. Only gaps during which jobs were waiting
    count: an idle gap says how little work there was, not how fast the worker drains a queue."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.seconds_per_job: float | None = None
        self._since: float | None = None  # the last departure that left jobs waiting
        self._lock = threading.Lock()  # departures are reported from the worker or the engine reader thread

    def departed(self, jobs: int, waiting: int, now: float | None = None) -> None:
        """`jobs` left the queue at once (one decoding step admits several), `waiting` are still queued."""
        if jobs <= 0:
            return
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._since is not None:
                gap = (now - self._since) / jobs
                if self.seconds_per_job is None:
                    self.seconds_per_job = gap
                else:  # k departures weigh as k single ones would
                    weight = 1 - (1 - self.alpha) ** jobs
                    self.seconds_per_job += weight * (gap - self.seconds_per_job)
            self._since = now if waiting > 0 else None

    def wait_s(self, ahead: int) -> float | None:
        """Expected seconds for `ahead` queued jobs to leave; None until a drain has been measured."""
        return None if self.seconds_per_job is None else ahead * self.seconds_per_job


class Ticket:
    """One admitted request's place in the queue bound until its job is submitted (or the request ends)."""

    def __init__(self, admission: Admission) -> None:
        self._admission: Admission | None = admission

    def release(self) -> None:
        if self._admission is not None:
            self._admission.admitted -= 1
            self._admission = None


class Admission:
    """Used from the event loop only (middleware and handler), so `admitted` needs no lock."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.drain = DrainMeter()
        self.admitted = 0  # admitted, not yet submitted: uploading or parsing

    def retry_after_s(self, ahead: int) -> int:
        """Whole seconds for `ahead` requests to drain at the measured rate; at least 1, and at most the
        request deadline (a request that would wait longer times out anyway). The configured
        MUSICREL_RETRY_AFTER_S until a drain has been measured."""
        wait = self.drain.wait_s(ahead)
        if wait is None:
            return self.settings.retry_after_s
        return max(1, min(math.ceil(wait), math.ceil(self.settings.request_timeout_s)))

    def admit(self, queue_depth: int) -> Ticket:
        """A ticket, or ApiError 429 `queue_full` when the queued and admitted requests fill the queue."""
        ahead = queue_depth + self.admitted
        if ahead >= self.settings.max_queue:
            self.metrics.rejected.labels("queue_full").inc()
            retry = self.retry_after_s(ahead)
            raise ApiError(
                429,
                "queue_full",
                f"server busy: {ahead} requests are already waiting; retry in about {retry} s",
                headers={"Retry-After": str(retry)},
            )
        self.admitted += 1
        return Ticket(self)
