"""Prometheus metrics. Each app gets its own registry, so several apps (tests) never share the global one.

With `musicrel serve --workers N` (N > 1) every worker writes its values to PROMETHEUS_MULTIPROC_DIR
(prometheus_client's multiprocess mode, set up by `serve`) and /metrics reports the sum over the workers,
whichever one answers the scrape. The engine process sends its updates to its worker, so they count there.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess

# Seconds: from a few ms (parse, queue) to minutes (long generations on CPU).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "musicrel_http_requests",
            "HTTP requests by route, method and status",
            ["route", "method", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "musicrel_http_request_seconds",
            "HTTP request latency by route",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # Summed over the live workers in multiprocess mode (each has its own requests and queue).
        self.in_flight = Gauge(
            "musicrel_in_flight",
            "continuation requests being handled",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.queue_depth = Gauge(
            "musicrel_queue_depth",
            "requests waiting for the generation worker",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.parse_seconds = Histogram(
            "musicrel_parse_seconds",
            "MIDI upload parse + primer preparation",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_seconds = Histogram(
            "musicrel_queue_seconds",
            "time a request waited before joining the running batch",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.generation_seconds = Histogram(
            "musicrel_generation_seconds",
            "per request: from joining the running batch to its result",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens_generated = Counter("musicrel_tokens_generated", "new tokens generated", registry=r)
        self.batches = Counter(
            "musicrel_batches",
            "admissions into the running batch (one prefill each; requests arriving together share one)",
            registry=r,
        )
        self.batched_jobs = Counter(
            "musicrel_batched_jobs", "requests admitted into the running batch", registry=r
        )
        self.batch_rows = Histogram(
            "musicrel_batch_rows",
            "live rows (samples of every running request) per decoding step; _count is the steps",
            buckets=ROW_BUCKETS,
            registry=r,
        )
        self.rejected = Counter(
            "musicrel_rejected", "requests refused before generation", ["reason"], registry=r
        )
        self.stopped = Counter("musicrel_stopped_jobs", "generations stopped early", ["reason"], registry=r)


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def exposition_registry(metrics: Metrics) -> CollectorRegistry:
    """What /metrics reports: this process's registry, or every worker's values in multiprocess mode."""
    if multiprocess_dir() is None:
        return metrics.registry
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


def worker_exited() -> None:
    """Drop this worker's live gauges from the sums (multiprocess mode)."""
    if multiprocess_dir() is not None:
        multiprocess.mark_process_dead(os.getpid())
