"""runtime.threads: the torch thread count from the CPUs this process may use, what other processes keep
busy, and the rows decoded."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import musicrel.runtime.threads as threads
from musicrel.runtime.threads import CpuSampler, choose_threads, cpu_budget


class Busy:
    """A sampler that reports `busy` CPUs of other processes."""

    def __init__(self, busy):
        self.busy = busy

    def age(self) -> float:
        return 1.0

    def busy_others(self):
        return self.busy


@pytest.mark.parametrize(
    ("cpus", "busy", "rows", "reserve", "expected"),
    [
        (16, 0.0, 64, 0.0, 16),  # an idle machine, a large batch: every CPU
        (16, 0.0, 6, 0.0, 3),  # 3 motifs x 2 samples: one thread per two rows
        (16, 0.0, 1, 0.0, 1),  # one row: one thread
        (2, 2.0, 6, 0.0, 1),  # the issue: a neighbour on both cores (torch's default was 2: 75-93 s)
        (2, 0.9, 6, 0.0, 1),  # one core busy
        (16, 5.6, 64, 0.0, 10),  # rounded to the nearest CPU left
        (16, 0.0, 64, 1.0, 15),  # a CPU kept for request handling
        (2, 0.0, 64, 1.0, 1),
        (1, 3.0, 64, 1.0, 1),  # never fewer than one
        (4, None, 64, 0.0, 4),  # load not measurable: the budget alone
    ],
)
def test_choose_threads(monkeypatch, cpus, busy, rows, reserve, expected):
    monkeypatch.setattr(threads, "cpu_budget", lambda: float(cpus))
    choice = choose_threads(rows, reserve=reserve, sampler=Busy(busy))
    assert choice.threads == expected
    assert f"{expected} torch thread" in str(choice) and f"{cpus:g} CPUs available" in str(choice)


def test_the_budget_is_the_affinity_mask_capped_by_the_cgroup_quota(monkeypatch):
    assert 1 <= cpu_budget() <= (os.cpu_count() or 1)
    monkeypatch.setattr(threads, "_cgroup_quota", lambda: 0.5)
    assert cpu_budget() == 0.5


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux's /proc/stat")
def test_the_sampler_counts_other_processes_not_this_one():
    """A CPU-bound child is counted."""
    sampler = CpuSampler()
    time.sleep(0.05)
    sampler.busy_others()  # a fresh interval
    child = subprocess.Popen(
        [sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"]
    )
    try:
        time.sleep(0.2)  # the child is up
        sampler.busy_others()
        time.sleep(1.0)
        with_child = sampler.busy_others()
    finally:
        child.wait()
    assert with_child is not None and with_child >= 0.5  # the child (and whatever else runs: more)


def test_the_sampler_leaves_out_this_processs_own_time(monkeypatch):
    """Over 2 s of wall time the machine was busy 3 CPU-seconds, 1.5 of them ours: others kept 0.75 busy."""
    readings = iter([(10.0, 100.0, 20.0), (12.0, 103.0, 21.5)])  # (monotonic, busy s, own s)
    monkeypatch.setattr(CpuSampler, "_snapshot", staticmethod(lambda: next(readings)))
    sampler = CpuSampler()
    assert sampler.busy_others() == pytest.approx(0.75)


def test_set_torch_threads_sets_an_asked_count_or_the_choice(monkeypatch):
    import torch

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        asked = threads.set_torch_threads(2, rows=8)
        assert asked.asked and asked.threads == torch.get_num_threads() == 2 and "asked" in str(asked)
        monkeypatch.setattr(threads, "cpu_budget", lambda: 4.0)
        chosen = threads.set_torch_threads("auto", rows=1, sampler=Busy(0.0))
        assert not chosen.asked and chosen.threads == torch.get_num_threads() == 1  # one row: one thread
        monkeypatch.setenv("OMP_NUM_THREADS", "3")  # an explicit environment wins over the choice
        assert threads.set_torch_threads(None, rows=64, sampler=Busy(0.0)).threads == 3
        assert torch.get_num_threads() == 3
        threads.loading_threads()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_the_spin_count_is_a_default_an_explicit_one_wins(monkeypatch):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    threads.set_spin_count()
    assert os.environ["GOMP_SPINCOUNT"] == threads.SPIN_COUNT
    monkeypatch.setenv("GOMP_SPINCOUNT", "7")
    threads.set_spin_count()
    assert os.environ["GOMP_SPINCOUNT"] == "7"
