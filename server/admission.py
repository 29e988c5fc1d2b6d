"""Admission of continuation requests before their upload is read, and the Retry-After that comes with a 429.

A request is admitted (or refused with 429 `queue_full`) as it arrives, before a byte of its body is
read: under a burst, a refusal used to wait for the whole upload to be parsed (up to 5.8 s measured). The
queue bound counts the requests already admitted and still uploading or parsing together with those queued
for the worker, so the admitted ones never find the queue full once parsed.

Retry-After says how long the requests ahead take to leave the queue at the rate it has been draining: a fixed
2 s was 8-16x too short under a 120-request burst (median wait 17 s). Before anything has left (the first
429s of a burst from idle) there is no rate yet, so it is estimated from what is known: the bytes still to be
parsed (Content-Length of the admitted uploads) at the parse speed measured at start-up, and the jobs queued
for generation at the generation time measured so far. The configured 2 s, the only answer before, left all
56 refused clients of a measured cold burst refused again on retry.
"""

from __future__ import annotations

import io
import math
import threading
import time
from typing import Any

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

    def departed(self, jobs: int, waiting: int, now: float | None = None, served: bool = True) -> None:
        """`jobs` left at once (one decoding step admits several), `waiting` are still in the bound.
        `served=False`: refused before any work (an upload bound: 429, 408, 413, 400); its place is free but
        its gap says nothing of the drain rate, and the gap running for the others goes on."""
        if jobs <= 0:
            return
        now = time.monotonic() if now is None else now
        with self._lock:
            if not served:
                if waiting == 0:
                    self._since = None
                return
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

    def __init__(self, admission: Admission, size: int | None = None) -> None:
        self._admission: Admission | None = admission
        self.size = size  # Content-Length of the upload; None when chunked

    def handed_over(self) -> None:
        """The job is queued: the place now counts in the worker's queue, whose departures are reported."""
        if self._admission is not None:
            self._admission.admitted -= 1
            if self.size is not None:
                self._admission.sized -= 1
                self._admission.bytes_admitted -= self.size
            self._admission = None

    def release(self, served: bool = True) -> None:
        """The request ended before its job was queued (refused as bad input, client gone): a departure.
        `served=False` for one refused by an upload bound before it was parsed: in a 120-request burst those
        429s (too many uploads at once) left within milliseconds, and the drain they measured told the
        queue's refused clients to come back in 1 s while the queue took 50 s to drain."""
        if self._admission is not None:
            admission = self._admission
            self.handed_over()
            admission.departed(1, queue_depth=None, served=served)


class Admission:
    """Used from the event loop only (middleware and handler), so `admitted` needs no lock."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.drain = DrainMeter()
        self.admitted = 0  # admitted, not yet submitted: uploading or parsing
        self.sized = 0  # of those, the ones whose Content-Length is known
        self.bytes_admitted = 0  # their Content-Lengths together
        self.queue_depth = 0  # the worker's queue as last reported (departures come from its thread)
        self.parse_s_per_byte: float | None = None  # from calibrate(), at start-up

    def calibrate(self, codec: Any) -> None:
        """Time the parse of a synthetic 24 KB motif: parse time is about linear in the bytes (3.1-3.4 us/B
        measured here for real files of 40-170 KB and this one alike), so it prices the uploads admitted."""
        from musicrel.generation.primer import prepare_primer

        data = calibration_midi()
        took = math.inf
        for _ in range(2):  # the first run pays for imports and caches
            start = time.perf_counter()
            prepare_primer(codec, data)
            took = min(took, time.perf_counter() - start)
        self.parse_s_per_byte = took / len(data)

    def estimate_wait_s(self) -> float | None:
        """Seconds for the admitted and queued requests to start generating, before any drain is measured;
        None when nothing is known. The parse is pure Python: its threads share one GIL, so the bytes ahead
        are priced as parsed one after another (64 uploads of 172 KB took 91 s on two parse threads, more
        than the 35 s of one thread's 0.54 s each). Queued jobs share the batch's rows, each row busy for the
        mean generation time seen so far."""
        parse_s = gen_s = None
        if self.parse_s_per_byte is not None and self.admitted:
            # An upload of unknown size (chunked) is priced at the mean of the known ones.
            mean = self.bytes_admitted / self.sized if self.sized else 0.0
            parse_s = (self.bytes_admitted + (self.admitted - self.sized) * mean) * self.parse_s_per_byte
        generation = self.metrics.generation_seconds
        count = _sample(generation, "_count")
        if count:
            rows = max(1, self.settings.max_batch_rows)
            gen_s = (self.queue_depth + self.admitted) * _sample(generation, "_sum") / count / rows
        known = [s for s in (parse_s, gen_s) if s is not None]
        return max(known) if known else None

    def departed(self, jobs: int, queue_depth: int | None, served: bool = True) -> None:
        """`jobs` left the bound; `queue_depth` is the worker's queue after it (None: unchanged). Given to the
        worker as its on_dequeue, and called for requests that end before they are queued."""
        if queue_depth is not None:
            self.queue_depth = queue_depth
        self.drain.departed(jobs, waiting=self.queue_depth + self.admitted, served=served)

    def retry_after_s(self, ahead: int) -> int:
        """Whole seconds for `ahead` requests to drain at the measured rate; at least 1, and at most the
        request deadline (a request that would wait longer times out anyway). Until a drain has been
        measured, the estimate from the bytes and jobs ahead; the configured MUSICREL_RETRY_AFTER_S when
        there is none either."""
        wait = self.drain.wait_s(ahead)
        if wait is None:
            wait = self.estimate_wait_s()
        if wait is None:
            return self.settings.retry_after_s
        return max(1, min(math.ceil(wait), math.ceil(self.settings.request_timeout_s)))

    def admit(self, queue_depth: int, size: int | None = None) -> Ticket:
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
        if size is not None:
            self.sized += 1
            self.bytes_admitted += size
        return Ticket(self, size)


def _sample(histogram: Any, suffix: str) -> float:
    """A histogram's _sum or _count as this process sees it."""
    for metric in histogram.collect():
        for sample in metric.samples:
            if sample.name.endswith(suffix):
                return sample.value
    return 0.0


def calibration_midi(notes: int = 4000) -> bytes:
    """A one-track file of `notes` overlapping notes (about 24 KB): a mid-sized upload's worth of events."""
    import pretty_midi

    pm = pretty_midi.PrettyMIDI(initial_tempo=120)
    piano = pretty_midi.Instrument(program=0)
    for i in range(notes):
        piano.notes.append(pretty_midi.Note(80, 40 + (i * 7) % 40, i * 0.05, i * 0.05 + 0.2))
    pm.instruments.append(piano)
    buffer = io.BytesIO()
    pm.write(buffer)
    return buffer.getvalue()
