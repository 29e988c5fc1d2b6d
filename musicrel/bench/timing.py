"""The one timer of the benchmarks: contenders run side by side, repetitions interleaved, so that a shared
machine's drift (load, clocks, thermal) hits every contender alike instead of whichever ran last."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

K = TypeVar("K")


def side_by_side(
    fns: Mapping[K, Callable[[], Any]], repeats: int, *, warmup: bool = True, alternate: bool = False
) -> dict[K, list[Any]]:
    """Each function's measurement per repetition. A function that returns None is timed (seconds); one that
    returns a value has that recorded instead: its own timing, to leave out its setup, or a richer
    measurement. `warmup` calls each once first (imports, allocator, kernels); `alternate` reverses the order
    every other repetition, so that no contender always runs first."""
    if warmup:
        for fn in fns.values():
            fn()
    results: dict[K, list[Any]] = {name: [] for name in fns}
    order = list(fns)
    for r in range(repeats):
        for name in reversed(order) if alternate and r % 2 else order:
            start = time.perf_counter()
            own = fns[name]()
            results[name].append(time.perf_counter() - start if own is None else own)
    return results


def medians(results: Mapping[K, list[float]]) -> dict[K, float]:
    return {name: statistics.median(values) for name, values in results.items()}


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU a figure was measured on, as a benchmark's header names it: its model name with the family and
    model numbers (a VM often shows a bare "AMD EPYC" for every generation), the widest vector instructions
    torch uses on it, and the CPUs this process may use. `cpuinfo`: /proc/cpuinfo's text (read if None)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:
                break  # the first processor's block is enough
            continue
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']} model {fields['model']})"
    import torch

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name}, {torch.backends.cpu.get_cpu_capability()}, {cpus} CPUs"
