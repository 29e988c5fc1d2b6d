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


def test_each_listener_count_is_a_step_of_its_own_the_largest_after_the_first():
    import argparse

    p = argparse.ArgumentParser()
    gpucheck.add_arguments(p)
    args = p.parse_args(["/tmp/x"])
    assert (args.device, args.listeners, args.budget_s, args.seconds) == ("cuda", "1,64,256,1024", 360.0, 5.0)
    listener_s = 60.0 + (3 * 5.0 + 60) + 30.0  # start, the phase's own limit, stop
    names = [(name, limit) for name, _, limit in gpucheck.steps(args)]
    assert names == [("device", 60.0), ("batch1", 120.0)] + [
        (f"listeners-{n}", listener_s) for n in (1, 1024, 256, 64)
    ]
    for n, (_, command, _) in zip((1, 1024, 256, 64), gpucheck.steps(args)[2:], strict=True):
        assert command[command.index("--listeners") + 1] == str(n)
        assert command[command.index("--seconds") + 1] == "5"
    # every step fits the budget alone; the budget is what bounds them together
    assert max(limit for _, _, limit in gpucheck.steps(args)) < args.budget_s


def test_the_listener_parts_merge_into_one_file_as_they_come(tmp_path):
    def part(n: int, share: float) -> dict:
        row = {"listeners": n, "on_time_share": share}
        return {"device": "cpu", "hold_share": 0.99, "rows": [row], "holds": None}

    summary = {"steps": []}
    (tmp_path / "listeners-1.part").write_text(json.dumps(part(1, 1.0)))
    gpucheck._write_summary(tmp_path, summary, 0.0)
    first = json.loads((tmp_path / gpucheck.LISTENERS_JSON).read_text())
    assert [r["listeners"] for r in first["rows"]] == [1] and first["holds"] == 1
    (tmp_path / "listeners-1024.part").write_text(json.dumps(part(1024, 0.995)))
    (tmp_path / "listeners-256.part").write_text(json.dumps(part(256, 0.5)))
    gpucheck._write_summary(tmp_path, summary, 0.0)
    merged = json.loads((tmp_path / gpucheck.LISTENERS_JSON).read_text())
    assert [r["listeners"] for r in merged["rows"]] == [1, 256, 1024] and merged["holds"] == 1024
    assert json.loads((tmp_path / gpucheck.SUMMARY).read_text())["listeners"] == merged
    assert sorted(p.name for p in tmp_path.iterdir()) == [gpucheck.SUMMARY, gpucheck.LISTENERS_JSON]


def test_what_would_not_come_back_from_out_is_named(tmp_path):
    assert gpucheck.out_warnings(tmp_path / "none") == []
    (tmp_path / "check").mkdir()
    for i in range(8):
        (tmp_path / "check" / f"f{i}").write_text("x")
    assert gpucheck.out_warnings(tmp_path) == []
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "model.bin").write_bytes(b"\0" * (gpucheck.OUT_MAX_FILE_BYTES + 1))
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "x y").write_text("x")
    found = gpucheck.out_warnings(tmp_path)
    assert len(found) == 4, found
    assert "holds 10 files; 8 come back" in found[0]
    assert any("model.bin is over 16 MiB" in line for line in found)
    assert any("more than 2 folders down" in line for line in found)
    assert any("x y has characters" in line for line in found)


def test_a_long_log_keeps_its_head_and_tail_under_the_cap(tmp_path):
    log = tmp_path / "log"
    log.write_bytes(b"head" + b"." * 5000 + b"tail")
    gpucheck.cap_log(log, cap=1000)
    text = log.read_bytes()
    assert text.startswith(b"head") and text.endswith(b"tail") and len(text) < 1100
    assert b"bytes of the log cut" in text
    short = tmp_path / "short"
    short.write_text("all of it")
    gpucheck.cap_log(short, cap=1000)
    assert short.read_text() == "all of it"


@pytest.mark.long(25)
def test_a_dry_run_on_the_cpu_writes_every_file(tiny_checkpoint, tmp_path):
    out = tmp_path / "out"
    command = ["bash", str(SCRIPT), str(out), "--device", "cpu", "--checkpoint", str(tiny_checkpoint),
               "--listeners", "1", "--seconds", "1", "--tokens", "16", "--budget-s", "150"]  # fmt: skip
    env = {**_no_gpu_env(), "OUT": str(tmp_path)}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning" not in proc.stdout  # the 3 files all come back
    summary = json.loads((out / gpucheck.SUMMARY).read_text())
    assert [s["step"] for s in summary["steps"]] == ["device", "batch1", "listeners-1"]
    assert all(s["rc"] == 0 for s in summary["steps"])
    batch1 = summary["batch1"]
    assert batch1["device"] == "cpu" and batch1["rtf_b1"] > 0 and batch1["rtf_b8"] > 0
    assert 0 < batch1["model_ms"] < batch1["step_ms"]
    # the GPU's step, uncaptured on a CPU, and the sweep of batch sizes (the dry run's one)
    assert batch1["step_mode"] == "static" and batch1["graph_step_ms"] > 0 and batch1["graph_rtf_b1"] > 0
    assert list(batch1["rows"]) == ["4"] and batch1["rows"]["4"]["step_ms"] > 0
    assert batch1["graph_same_as_static"] == 1.0  # on a CPU "graph" is "static": the same step
    assert batch1["graph_same_as_eager"] == 1.0  # float32 on a CPU: the tokens of the CPU's step
    assert [r["listeners"] for r in summary["listeners"]["rows"]] == [1]
    assert summary["listeners"] == json.loads((out / gpucheck.LISTENERS_JSON).read_text())
    log = (out / gpucheck.LOG).read_text()
    assert "===== device" in log and "real-time factor b1" in log and "holds:" in log
    assert "service ready in" in log
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [gpucheck.LOG, gpucheck.SUMMARY, gpucheck.LISTENERS_JSON]
    )


def test_device_tree_leaves_checkpoints_behind_and_puts_them_back_as_they_were(tmp_path):
    """scripts/device-tree.sh, in a throwaway repository: `away` takes a folder out of the index and the tree
    (what a device call would send shrinks), `back` restores both (git sees no change)."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    script = gpucheck.REPO / "scripts" / "device-tree.sh"
    (repo / "scripts" / "device-tree.sh").write_bytes(script.read_bytes())
    (repo / ".gitignore").write_text(".device-away/\n")
    for name, size in (("default", 1000), ("infill", 300_000), ("multi", 200_000)):
        folder = repo / "checkpoints" / name
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(os.urandom(size))

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout

    def tree(*args: str) -> subprocess.CompletedProcess:
        command = ["bash", "scripts/device-tree.sh", *args]
        return subprocess.run(command, cwd=repo, capture_output=True, text=True)

    git("init", "-q")
    git("add", ".")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "init")
    before = float(tree("size").stdout.split()[0])
    away = tree("away", "checkpoints/infill", "checkpoints/multi/")
    assert away.returncode == 0, away.stderr
    assert not (repo / "checkpoints" / "infill").exists() and (repo / "checkpoints" / "default").exists()
    assert "checkpoints/infill/model.safetensors" not in git("ls-files")
    assert float(tree("size").stdout.split()[0]) < before - 0.4  # half a MiB left behind
    again = tree("away", "checkpoints/default", "checkpoints/nothing")
    assert again.returncode == 1 and "does not exist" in again.stderr
    assert (repo / "checkpoints" / "default").exists()  # a bad path moves nothing
    back = tree("back")
    assert back.returncode == 0, back.stderr
    assert git("status", "--porcelain") == ""
    assert float(tree("size").stdout.split()[0]) == before
    assert not (repo / ".device-away").exists()
