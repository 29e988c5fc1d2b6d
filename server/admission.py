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
    """Seconds per request leaving the queue bound (its job starts decoding, or it ends before that: a 422, a
    client gone), an exponentially weighted average of the gaps between departures. Only busy time counts: a
    gap runs from the last departure that left requests waiting, or from the arrival that ended an idle
    spell, so the first request of a burst is measured from its arrival, and idle time (how little work there
    was, not how fast the queue drains) never is."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.seconds_per_job: float | None = None
        self._since: float | None = None  # start of the current gap; None while nothing waits
        self._lock = threading.Lock()  # departures are reported from the worker or the engine reader thread

    def arrived(self, now: float | None = None) -> None:
        """A request joined; the clock starts if nothing was waiting."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._since is None:
                self._since = now

    def departed(self, jobs: int, waiting: int, now: float | None = None) -> None:
        """`jobs` left at once (one decoding step admits several), `waiting` are still in the bound."""
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
        """Expected seconds for `ahead` requests to leave; None until a drain has been measured."""
        return None if self.seconds_per_job is None else ahead * self.seconds_per_job


class Ticket:
    """One admitted request's place in the queue bound until its job is submitted (or the request ends)."""

    def __init__(self, admission: Admission) -> None:
        self._admission: Admission | None = admission

    def handed_over(self) -> None:
        """The job is queued: the place now counts in the worker's queue, whose departures are reported."""
        if self._admission is not None:
            self._admission.admitted -= 1
            self._admission = None

    def release(self) -> None:
        """The request ended before its job was queued (refused as bad input, client gone): a departure."""
        if self._admission is not None:
            admission = self._admission
            self.handed_over()
            admission.departed(1, queue_depth=None)


class Admission:
    """Used from the event loop only (middleware and handler), so `admitted` needs no lock."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.drain = DrainMeter()
        self.admitted = 0  # admitted, not yet submitted: uploading or parsing
        self.queue_depth = 0  # the worker's queue as last reported (departures come from its thread)

    def departed(self, jobs: int, queue_depth: int | None) -> None:
        """`jobs` left the bound; `queue_depth` is the worker's queue after it (None: unchanged). Given to the
        worker as its on_dequeue, and called for requests that end before they are queued."""
        if queue_depth is not None:
            self.queue_depth = queue_depth
        self.drain.departed(jobs, waiting=self.queue_depth + self.admitted)

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
        self.queue_depth = queue_depth
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
        self.drain.arrived()
        self.admitted += 1
        return Ticket(self)
