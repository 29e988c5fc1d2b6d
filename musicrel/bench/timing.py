"""The one timer of the benchmarks: contenders run side by side, repetitions interleaved, so that a shared
machine's drift (load, clocks, thermal) hits every contender alike instead of whichever ran last."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
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
