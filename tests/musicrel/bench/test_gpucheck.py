"""The device check (`musicrel bench gpu-check`, scripts/gpu-check.sh) where no GPU is: its refusal in one
line, its arguments, its steps' time limits, and a dry run of every step on the CPU with the tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from musicrel.bench import gpucheck
from musicrel.bench.__main__ import main

SCRIPT = gpucheck.REPO / "scripts" / "gpu-check.sh"


def _no_gpu_env() -> dict[str, str]:
    # torch sees no GPU whatever the machine has: the refusal is what is tested
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}


def test_refuses_in_one_line_without_a_gpu(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    assert main(["gpu-check", str(out), "--checkpoint", str(tiny_checkpoint)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("musicrel bench gpu-check: error [no_gpu]: no GPU:") and "--device cpu" in err
    assert not out.exists()  # refused before anything was written


def test_the_script_refuses_and_checks_its_arguments(tmp_path):
    run = lambda *a: subprocess.run(  # noqa: E731
        ["bash", str(SCRIPT), *a], capture_output=True, text=True, env=_no_gpu_env(), timeout=120
    )
    refused = run(str(tmp_path / "out"))
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "error [no_gpu]" in lines[0], refused.stderr
    for args in ((), ("--device", "cpu")):  # no OUT: the usage line, nothing run
        usage = run(*args)
        assert usage.returncode == 2 and usage.stderr.startswith("usage: bash scripts/gpu-check.sh")
    missing = run(str(tmp_path / "out"), "--checkpoint", str(tmp_path / "none"))
    assert missing.returncode == 2 and "error [no_checkpoint]" in missing.stderr


def test_a_step_that_fails_or_runs_out_of_time_is_recorded_and_killed(tmp_path):
    with open(tmp_path / "log", "w") as log:
        ok = gpucheck.run_step("ok", [sys.executable, "-c", "print('hello')"], 30, log)
        failed = gpucheck.run_step("failed", [sys.executable, "-c", "raise SystemExit(3)"], 30, log)
        slow = gpucheck.run_step("slow", [sys.executable, "-c", "import time; time.sleep(60)"], 1, log)
    assert (ok["rc"], ok["timed_out"]) == (0, False)
    assert (failed["rc"], failed["timed_out"]) == (3, False)
    assert (slow["rc"], slow["timed_out"]) == (None, True) and slow["seconds"] < 30
    text = (tmp_path / "log").read_text()
    assert "hello" in text and "===== failed: exit 3" in text and "===== slow: timed out" in text


def test_the_listeners_get_what_the_budget_leaves():
    import argparse

    p = argparse.ArgumentParser()
    gpucheck.add_arguments(p)
    args = p.parse_args(["/tmp/x"])
    assert (args.device, args.listeners, args.budget_s) == ("cuda", "1,64,256,1024", 360.0)
    names = [(name, limit) for name, _, limit in gpucheck.steps(args)]
    assert names == [("device", 60.0), ("batch1", 120.0), ("listeners", float("inf"))]
    listeners_command = gpucheck.steps(args)[-1][1]
    assert listeners_command[listeners_command.index("--listeners") + 1] == "1,64,256,1024"


@pytest.mark.long(25)
def test_a_dry_run_on_the_cpu_writes_every_file(tiny_checkpoint, tmp_path):
    out = tmp_path / "out"
    command = ["bash", str(SCRIPT), str(out), "--device", "cpu", "--checkpoint", str(tiny_checkpoint),
               "--listeners", "1", "--seconds", "1", "--tokens", "16", "--budget-s", "120"]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, env=_no_gpu_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / gpucheck.SUMMARY).read_text())
    assert [s["step"] for s in summary["steps"]] == ["device", "batch1", "listeners"]
    assert all(s["rc"] == 0 for s in summary["steps"])
    batch1 = summary["batch1"]
    assert batch1["device"] == "cpu" and batch1["rtf_b1"] > 0 and batch1["rtf_b8"] > 0
    assert 0 < batch1["model_ms"] < batch1["step_ms"]
    assert [r["listeners"] for r in summary["listeners"]["rows"]] == [1]
    assert summary["listeners"] == json.loads((out / gpucheck.LISTENERS_JSON).read_text())
    log = (out / gpucheck.LOG).read_text()
    assert "===== device" in log and "real-time factor b1" in log and "holds:" in log
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [gpucheck.LOG, gpucheck.SUMMARY, gpucheck.LISTENERS_JSON]
    )
