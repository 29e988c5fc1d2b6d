"""The torch thread policy, in one place for the commands, the server's engine, training and the benches:
`set_torch_threads` (a count asked for, else `choose_threads`: how many threads torch should use here and
now), `loading_threads` (one while a checkpoint loads), `request_reserve` (the CPU a server keeps for its
requests) and `set_spin_count` (how long idle OpenMP workers spin, before torch loads).

torch starts one OpenMP thread per core whatever else runs. A decode step is dozens of small parallel ops
with a barrier after each, so a team larger than the cores it can really get waits at every barrier for a
thread the scheduler has parked: `musicrel generate` took 75-93 s for 3 motifs x 2 samples beside a
CPU-bound process and 3.6 s with one thread, the same bytes. So the count is measured, not assumed:

- the CPUs this process may use: its affinity mask, and a cgroup CPU quota (containers) below it;
- minus what other processes keep busy: /proc/stat over a short interval, less this process's own time;
- and no more than the batch can use: a decode step of a row or two is too small to split with profit.

OpenMP's thread count is per calling thread: `set_torch_threads` is called in the thread that decodes or
trains, not elsewhere. torch is imported only inside the functions that set it.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

SAMPLE_S = 0.1  # how long a one-off choice watches the machine
ROWS_PER_THREAD = 2  # a thread per this many decoding rows at most (one row: one thread)
TRAINING_ROWS = 1_000_000  # a training batch splits across any number of threads
# How long idle OpenMP workers spin before they sleep. A decode step is dozens of small parallel ops with
# Python in between; waking sleeping workers for each (OMP_WAIT_POLICY=PASSIVE) made it 2.4x slower on an
# idle 2-core machine, and 10,000 spins still let them fall asleep between ops, while libgomp's default
# 300,000 starves other processes longer on a busy machine. 100,000 measured as fast as the default
# (`musicrel bench generate`).
SPIN_COUNT = "100000"


def cpu_budget() -> float:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2 (or v1) CPU quota."""
    try:
        cpus = float(len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        cpus = float(os.cpu_count() or 1)
    return min(cpus, _cgroup_quota() or cpus)


def _cgroup_quota() -> float | None:
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


class CpuSampler:
    """CPUs kept busy by other processes since the previous `busy_others()` (or construction): the
    machine's busy time from /proc/stat less this process's own, per second of wall time. None where
    /proc/stat cannot be read."""

    def __init__(self) -> None:
        self._last = self._snapshot()

    @staticmethod
    def _snapshot() -> tuple[float, float, float] | None:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None
        tick = os.sysconf("SC_CLK_TCK")
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        # guest time is counted in user already (fields 8, 9 would count it twice)
        busy = (sum(fields[:8]) - idle) / tick
        own = sum(os.times()[:2])  # user + system of every thread of this process
        return time.monotonic(), busy, own

    def age(self) -> float:
        """Seconds since the last reading (a reading over a few ms is all clock-tick noise)."""
        return time.monotonic() - self._last[0] if self._last is not None else math.inf

    def busy_others(self) -> float | None:
        now = self._snapshot()
        last, self._last = self._last, now
        if now is None or last is None or now[0] - last[0] <= 0:
            return None
        wall = now[0] - last[0]
        return max(0.0, ((now[1] - last[1]) - (now[2] - last[2])) / wall)


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    cpus: float  # the CPU budget (affinity, quota)
    busy: float | None  # CPUs busy with other processes; None: not measured
    rows: int
    reserved: float
    asked: bool = False  # the count was given (--threads, MUSICREL_TORCH_THREADS, OMP_NUM_THREADS)

    def __str__(self) -> str:
        if self.asked:
            return f"{self.threads} torch thread{'s' if self.threads != 1 else ''} (asked)"
        busy = "not measured" if self.busy is None else f"{self.busy:.1f} busy with other processes"
        reserve = f", {self.reserved:g} kept for request handling" if self.reserved else ""
        return (
            f"{self.threads} torch thread{'s' if self.threads != 1 else ''} ({self.cpus:g} CPUs available, "
            f"{busy}{reserve}; {self.rows} row{'s' if self.rows != 1 else ''})"
        )


def choose_threads(
    rows: int = 1, reserve: float = 0.0, sampler: CpuSampler | None = None, sample_s: float = SAMPLE_S
) -> ThreadChoice:
    """Threads for decoding `rows` rows: the CPUs free of other processes (rounded to the nearest, at least
    one), less `reserve` (CPUs this process needs for other work, e.g. a server's request handling), at
    most one per ROWS_PER_THREAD rows. With a `sampler`, the load since its last reading is used (a
    long-running worker re-checks without waiting); without one, the machine is watched for `sample_s`."""
    cpus = cpu_budget()
    if sampler is None:
        sampler = CpuSampler()
    time.sleep(max(0.0, min(sample_s, sample_s - sampler.age())))
    busy = sampler.busy_others()
    free = cpus - reserve - (busy or 0.0)
    by_rows = max(1, math.ceil(max(1, rows) / ROWS_PER_THREAD))
    threads = int(max(1, min(math.floor(free + 0.5), by_rows, cpus)))
    return ThreadChoice(threads, cpus, busy, max(1, rows), reserve)


def set_spin_count() -> None:
    """SPIN_COUNT for libgomp, unless the environment says otherwise; only effective before torch loads."""
    os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)


def request_reserve() -> float:
    """CPUs a server keeps for request handling (multipart, MIDI parsing and writing, HTTP) when choosing its
    decoding threads: one when there are two or more. On a 2-core machine that leaves one thread, the count
    measured fastest there."""
    return 1.0 if cpu_budget() >= 2 else 0.0


def set_torch_threads(
    threads: int | str | None = None,
    rows: int = 1,
    reserve: float = 0.0,
    sampler: CpuSampler | None = None,
) -> ThreadChoice:
    """Set torch's threads in the calling thread and say how: `threads` when it is a count; else (None,
    0 or "auto") OMP_NUM_THREADS when the environment sets it (an explicit setting wins), else
    `choose_threads(rows, reserve, sampler)`. torch's default, one per core, took 75-93 s instead of 3.6 s
    beside a busy process. The count is set only when it changes."""
    import torch

    if threads in (None, 0, "auto"):
        env = os.environ.get("OMP_NUM_THREADS", "")
        threads = int(env) if env.isdigit() and int(env) > 0 else None
    if threads is None:
        choice = choose_threads(rows, reserve=reserve, sampler=sampler)
    else:
        choice = ThreadChoice(int(threads), cpu_budget(), None, max(1, rows), reserve, asked=True)
    if choice.threads != torch.get_num_threads():
        torch.set_num_threads(choice.threads)
    return choice


def loading_threads() -> None:
    """One torch thread in the calling thread, for loading a checkpoint: loading needs no parallelism, and an
    OpenMP team in a thread that does not decode counts against the CPUs: with more OpenMP threads than CPUs
    libgomp lets idle workers spin only 100 times before sleeping, which made the decoding thread's steps
    2x slower."""
    import torch

    torch.set_num_threads(1)
