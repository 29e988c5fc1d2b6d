"""`musicrel bench neighbour`: `musicrel generate` alone and beside a busy neighbour, side by side in one run.

Issue 23: 3 motifs x 2 samples took 75-93 s while another process kept the CPUs busy, 3.6 s with --threads 1
(the same bytes): torch's one OpenMP thread per core waits at every barrier for threads the scheduler has
parked. The goal: beside a neighbour (one CPU-bound process per CPU of this process's budget), the command
takes at most 2x its time alone. Each round runs every mode as a fresh `musicrel generate` process (start-up,
model load and writing included: what a user waits for), the order alternating per round; the table gives
the medians, the threads each run chose (from its summary.json) and the ratio. `--compare-threads N` adds the
same run beside the neighbour with N threads forced (torch's default is one per core) to show what the
choice avoids.

A machine that is already busy (a training run) makes "alone" a busy machine too: the ratio is then the cost
of one more neighbour, and the table prints the load average so that the reader can tell.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from musicrel.bench.timing import cpu_name, medians, side_by_side

DEFAULT_CHECKPOINT = Path("checkpoints/default")
GOAL = 2.0


def register(bench_sub) -> None:
    p = bench_sub.add_parser(
        "neighbour",
        help="musicrel generate alone vs beside CPU-bound processes (thread choice under load)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--checkpoint", type=Path, default=None, help="default: checkpoints/default, else a random one"
    )
    p.add_argument("--motifs", type=int, default=3)
    p.add_argument("--num-samples", type=int, default=2)
    p.add_argument("--seconds", type=float, default=20.0, help="music per sample")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every mode, order alternating")
    p.add_argument("--neighbours", type=int, default=None, help="CPU-bound processes (default: one per CPU)")
    p.add_argument(
        "--compare-threads",
        type=int,
        default=None,
        help="also run beside the neighbour with N threads forced",
    )
    p.set_defaults(func=run)


def _motifs(folder: Path, n: int) -> None:
    import pretty_midi

    folder.mkdir(parents=True, exist_ok=True)
    for k in range(n):
        pm = pretty_midi.PrettyMIDI(initial_tempo=100 + 10 * k)
        inst = pretty_midi.Instrument(program=0)
        inst.notes = [
            pretty_midi.Note(80, 48 + (i * (5 + k)) % 24, 0.25 * i, 0.25 * i + 0.3) for i in range(32)
        ]
        pm.instruments.append(inst)
        pm.write(str(folder / f"motif{k}.mid"))


@contextlib.contextmanager
def _neighbours(n: int):
    """`n` CPU-bound processes (each a bare busy loop) for the duration of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.5)  # running, and seen by the load a chooser measures
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def run(args: argparse.Namespace) -> int:
    from musicrel.runtime.threads import cpu_budget

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        checkpoint = args.checkpoint or (
            DEFAULT_CHECKPOINT if (DEFAULT_CHECKPOINT / "config.json").is_file() else None
        )
        if checkpoint is None:
            from musicrel.bench.models import random_checkpoint

            checkpoint = random_checkpoint(root / "ckpt")
        _motifs(root / "motifs", args.motifs)
        neighbours = args.neighbours or max(1, round(cpu_budget()))
        chose: dict[str, list[str]] = {}

        def generate(mode: str, extra: list[str]) -> float:
            out = root / f"out-{mode}-{len(chose.get(mode, []))}"
            command = [sys.executable, "-m", "musicrel.cli", "generate", "--checkpoint", str(checkpoint),
                       "--input", str(root / "motifs"), "--out", str(out), "--seed", "0", "--quiet",
                       "--num-samples", str(args.num_samples), "--seconds", str(args.seconds)]  # fmt: skip
            command += extra
            start = time.perf_counter()
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            took = time.perf_counter() - start
            chose.setdefault(mode, []).append(
                json.loads((out / "summary.json").read_text())["settings"]["threads"]
            )
            return took

        def beside(extra: list[str], mode: str):
            def measure() -> float:
                with _neighbours(neighbours):
                    return generate(mode, extra)

            return measure

        modes = {
            "alone": lambda: generate("alone", []),
            "beside a neighbour": beside([], "beside a neighbour"),
        }
        if args.compare_threads:
            forced = f"beside, --threads {args.compare_threads}"
            modes[forced] = beside(["--threads", str(args.compare_threads)], forced)
        load = os.getloadavg()[0]
        times = side_by_side(modes, args.rounds, warmup=False, alternate=True)
    t = medians(times)
    print(
        f"musicrel bench neighbour: musicrel generate, {args.motifs} motifs x {args.num_samples} samples of "
        f"{args.seconds:g} s, {checkpoint}; {args.rounds} rounds, order alternating; neighbour: {neighbours} "
        f"CPU-bound process(es); {cpu_name()}, {cpu_budget():g} available; load average {load:.1f} "
        "before the run"
    )
    width = max(len(m) for m in modes)
    for mode in modes:
        runs = " ".join(f"{x:.1f}" for x in times[mode])
        print(f"  {mode:<{width}}  median {t[mode]:7.2f} s  (runs: {runs})  {chose[mode][-1]}")
    ratio = t["beside a neighbour"] / t["alone"]
    print(f"beside a neighbour / alone: {ratio:.2f}x (goal <= {GOAL:g}x)")
    return 0
