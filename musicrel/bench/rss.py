"""The resident set of this process, read from /proc/self/status: its peak (VmHWM) since a reset, so that a
benchmark measures what one piece of work adds (`reset_peak` before it, `status_kb("VmHWM")` after). Run
that work in a fresh process whose environment holds FREED_MEMORY_LEAVES: glibc then returns freed tensors
to the system, so earlier work neither hides the new allocations (reused heap) nor counts in the peak."""

from __future__ import annotations

import os
from pathlib import Path

# glibc serves allocations above this many bytes with their own mappings, unmapped when freed (by default
# the threshold rises to 32 MiB as tensors are freed, and freed memory stays in the heap).
FREED_MEMORY_LEAVES = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def fresh_process_env(**extra: str) -> dict[str, str]:
    """The environment of a measuring child process: FREED_MEMORY_LEAVES, `extra`, and this checkout first
    on PYTHONPATH, so that `python -m musicrel.bench...` runs this code wherever the package was installed
    from."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, **FREED_MEMORY_LEAVES, **extra, PYTHONPATH=path)


def status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> int:
    """Reset the peak resident set to the current one and return it (KiB)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_kb("VmRSS")
