"""`musicrel bench gpu-check OUT`: issue 43's one device check, for the first minutes of a GPU lease.

Run it on the GPU machine through `scripts/gpu-check.sh OUT`, which installs the wheels the bare image lacks
first, then runs `python -m musicrel.bench gpu-check OUT` (docs/BENCHMARKS.md says how). In at most
--budget-s seconds (6 minutes by default), each step a process of its own with a time limit (one that fails
or runs out is logged and the next one runs):

1. device: nvidia-smi, and what torch sees (version, CUDA, the GPU, its memory, bfloat16);
2. batch1: the checkpoint loaded on the device as the service loads it, then bench shapes' measurements
   (`decode`, `first_note`: generate_batch with every control on, after a 256-event primer of real notes),
   in this order: where an eager batch-1 step goes (the model's forward timed inside the steps, the device
   synchronised around it), the GPU's step (DecodeBatch's "graph" mode) at batch 1, the share of tokens it
   draws alike with the uncaptured and the eager step, the real-time factor at batch 1 (median of 3, after
   a warm-up; a fresh batch each job, so its graph's capture counts), the first-note latency, the real-time
   factor at batch 8, the GPU's step at 64, 256 and 1,024 rows (ms a step, each row's real-time factor),
   and torch.cuda.max_memory_allocated;
3. listeners: `bench listeners` with the same checkpoint, one process per N (1, 1,024, 256, 64: the first
   N, then the largest, so that the issue's 1,024 runs before the rest of the budget), each with its own
   limit (a fresh service's start, the phase's own limit, its shutdown): a step that runs out loses its N
   alone.

Everything goes to OUT, and is rewritten after every step (a check cut off by the device tool's limit keeps
what the finished steps measured): gpu-check.log (every step's output), listeners.json (every N's row so
far), gpu-check.json (each step's command, exit status and seconds, the batch-1 figures, the listener rows).
Three files, the log capped at LOG_CAP_BYTES: the device tool brings back at most 8 files of at most 16 MiB
from its $OUT, so the command that runs this check writes nothing else there (the first lease's
listeners.json and log were left out because another step of the same command had filled $OUT with 7 files);
at the end the check counts what $OUT holds and says when something would not come back. Without a GPU it
refuses at once, one line. `--device cpu` runs the same steps on the CPU (the tests do, with a tiny model).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from musicrel.errors import ConfigError, MusicrelError

REPO = Path(__file__).resolve().parents[2]
BUDGET_S = 360.0  # the bound on the whole check
DEVICE_STEP_S = 60.0
BATCH1_STEP_S = 120.0
BATCH1_TOKENS = 512  # per row, per timed job (12.8 s of dense music)
ROW_SWEEP = (64, 256, 1024)  # batch sizes of the batch-1 step's sweep of the GPU's step
CPU_ROW_SWEEP = (4,)  # the dry run's
LISTENER_SECONDS = 5.0  # music per stream: 1,024 streams of it fit the budget (docs/BENCHMARKS.md)
# A listener step's limit beyond its phase's own (bench listeners: 3 x seconds + 60 s): the service's start
# (imports, the CUDA context, the model, its engine process) and its shutdown.
LISTENER_START_S, LISTENER_STOP_S = 60.0, 30.0
LOG = "gpu-check.log"
SUMMARY = "gpu-check.json"
LISTENERS_JSON = "listeners.json"
# What the device tool brings back from $OUT (its docs: /work/.library/device/README.md, Limits)
OUT_MAX_FILES, OUT_MAX_FILE_BYTES, OUT_MAX_DEPTH = 8, 16 * 2**20, 2
LOG_CAP_BYTES = 15 * 2**20  # under the 16 MiB a file may have: a longer log keeps its head and tail


class NoGpuError(MusicrelError):
    code = "no_gpu"


def register(bench_sub) -> None:
    p = bench_sub.add_parser(
        "gpu-check",
        help="issue 43's device check: the GPU, batch-1 real-time factor on it, the listener benchmark",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=run)
    step = bench_sub.add_parser("gpu-check-step", help="one step of gpu-check, in a process of its own")
    step.add_argument("step", choices=("device", "batch1"))
    step.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    step.add_argument("--checkpoint", type=Path, default=Path("checkpoints/default"))
    step.add_argument("--tokens", type=int, default=BATCH1_TOKENS)
    step.add_argument("--json", type=Path, default=None, help="write the batch-1 figures here")
    step.set_defaults(func=run_one_step)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", type=Path, help="folder for the log and the JSON (the device tool's $OUT)")
    p.add_argument("--checkpoint", type=Path, default=Path("checkpoints/default"))
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a dry run of the steps")
    p.add_argument("--listeners", default="1,64,256,1024", help="N of the listener benchmark")
    p.add_argument(
        "--seconds", type=float, default=LISTENER_SECONDS, help="music per stream of the listener benchmark"
    )
    p.add_argument("--tokens", type=int, default=BATCH1_TOKENS, help="tokens per row of each batch-1 job")
    p.add_argument("--client-processes", type=int, default=1, help="the listener clients' processes")
    p.add_argument("--budget-s", type=float, default=BUDGET_S, help="the whole check's time limit")


def check_gpu(device: str) -> str:
    """A line saying what torch sees; NoGpuError (one line) when `device` is cuda and it sees no GPU."""
    import torch

    if device != "cuda":
        return f"torch {torch.__version__}, device cpu (a dry run: no GPU asked for)"
    if not torch.cuda.is_available():
        raise NoGpuError(
            f"no GPU: torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}) sees no CUDA device; "
            "run this on a GPU machine (docs/BENCHMARKS.md), or --device cpu for a dry run"
        )
    return f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)"


def step_env() -> dict[str, str]:
    """A step's environment: this checkout first on PYTHONPATH (the GPU machine has no musicrel installed),
    output unbuffered (a step cut off at its limit still leaves what it printed)."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def run_step(name: str, command: list[str], timeout_s: float, log) -> dict:
    """Run `command` (from the repository root) with its output appended to `log`; its record: exit status
    (None when it ran out of time and was killed), seconds, whether it timed out."""
    log.write(f"\n===== {name}: {' '.join(command)} (limit {timeout_s:.0f} s)\n")
    log.flush()
    start = time.monotonic()
    proc = subprocess.Popen(
        command, cwd=REPO, env=step_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        rc: int | None = proc.wait(timeout=max(1.0, timeout_s))
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the step and what it started (a service, its engine)
        proc.wait()
        rc, timed_out = None, True
    took = time.monotonic() - start
    log.write(f"===== {name}: {'timed out' if timed_out else f'exit {rc}'} after {took:.1f} s\n")
    log.flush()
    return {"step": name, "command": command, "rc": rc, "timed_out": timed_out, "seconds": round(took, 1)}


def _bench(*args: str) -> list[str]:
    return [sys.executable, "-m", "musicrel.bench", *args]


def listener_order(text: str) -> list[int]:
    """The N of the listener steps in the order they run: the first given, then the rest largest first."""
    from musicrel.bench.listeners import listener_counts

    counts = listener_counts(text, "cuda")
    return counts[:1] + sorted(counts[1:], reverse=True)


def listener_step_s(seconds: float) -> float:
    """A listener step's own limit: its service's start and stop around the phase's limit."""
    from musicrel.bench.listeners import phase_timeout_s

    return LISTENER_START_S + phase_timeout_s(seconds) + LISTENER_STOP_S


def _part(out: Path, n: int) -> Path:
    return out / f"listeners-{n}.part"


def steps(args: argparse.Namespace) -> list[tuple[str, list[str], float]]:
    """(name, command, own time limit) of each step, in order; each runs at most what the budget leaves."""
    out = args.out.resolve()
    on = ["--device", args.device, "--checkpoint", str(args.checkpoint)]
    batch1 = ["--tokens", str(args.tokens), "--json", str(out / "batch1.part")]
    listeners = ["--seconds", f"{args.seconds:g}", "--client-processes", str(args.client_processes)]
    return [
        ("device", _bench("gpu-check-step", "device", "--device", args.device), DEVICE_STEP_S),
        ("batch1", _bench("gpu-check-step", "batch1", *on, *batch1), BATCH1_STEP_S),
        *(
            (
                f"listeners-{n}",
                _bench("listeners", *on, "--listeners", str(n), *listeners, "--out", str(_part(out, n))),
                listener_step_s(args.seconds),
            )
            for n in listener_order(args.listeners)
        ),
    ]


def run(args: argparse.Namespace) -> int:
    if args.budget_s <= 0 or args.seconds <= 0 or args.tokens < 1:
        raise ConfigError("--budget-s and --seconds must be > 0, --tokens >= 1")
    if not (args.checkpoint / "config.json").is_file():
        raise ConfigError(f"{args.checkpoint} holds no checkpoint (config.json)", code="no_checkpoint")
    listener_order(args.listeners)  # a bad list fails here, not in every step
    seen = check_gpu(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    summary = {"commit": _git_commit(), "seen": seen, "budget_s": args.budget_s, "steps": []}
    records = summary["steps"]
    with open(args.out / LOG, "a") as log:
        log.write(f"musicrel bench gpu-check {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}: {seen}\n")
        for name, command, limit in steps(args):
            left = args.budget_s - (time.monotonic() - started)
            if left < 5:
                records.append({"step": name, "command": command, "rc": None, "skipped": "budget spent"})
            else:
                records.append(run_step(name, command, min(limit, left), log))
                print(f"gpu-check: {name}: {_verdict(records[-1])}", flush=True)
            _write_summary(args.out, summary, started)
    _read_json(args.out / "batch1.part", remove=True)  # its figures are in the summary
    cap_log(args.out / LOG)
    for line in out_warnings(Path(os.environ.get("OUT") or args.out)):
        print(f"gpu-check: warning: {line}", flush=True)
    print(f"gpu-check: {summary['seconds']:.0f} s; wrote {args.out / LOG}, {args.out / SUMMARY}")
    return 0 if all(r.get("rc") == 0 for r in records) else 1


def _write_summary(out: Path, summary: dict, started: float) -> None:
    """gpu-check.json and listeners.json as they stand: the finished steps' figures, every listener row so
    far (each N's part merged in, then removed)."""
    from musicrel.bench.listeners import holds

    listeners = _read_json(out / LISTENERS_JSON)
    for part in sorted(out.glob("listeners-*.part")):
        report = _read_json(part, remove=True)
        if report is None:
            continue
        rows = ([] if listeners is None else listeners["rows"]) + report["rows"]
        listeners = {**report, "rows": sorted(rows, key=lambda r: r["listeners"])}
        listeners["holds"] = holds([r for r in rows if "failed" not in r], report["hold_share"])
    if listeners is not None:
        (out / LISTENERS_JSON).write_text(json.dumps(listeners, indent=1) + "\n")
    summary.update(
        seconds=round(time.monotonic() - started, 1),
        batch1=_read_json(out / "batch1.part"),
        listeners=listeners,
    )
    (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")


def cap_log(path: Path, cap: int = LOG_CAP_BYTES) -> None:
    """A log over `cap` bytes keeps its first and last cap/2 (a file over 16 MiB would not come back)."""
    size = path.stat().st_size
    if size <= cap:
        return
    with open(path, "rb") as f:
        head = f.read(cap // 2)
        f.seek(size - cap // 2)
        tail = f.read()
    cut = f"\n[... {size - len(head) - len(tail)} bytes of the log cut: it would not come back ...]\n"
    path.write_bytes(head + cut.encode() + tail)


def out_warnings(root: Path) -> list[str]:
    """What under `root` (the device tool's $OUT) would not come back: more than OUT_MAX_FILES files, a file
    over OUT_MAX_FILE_BYTES, one deeper than OUT_MAX_DEPTH folders, a name of other characters."""
    if not root.is_dir():
        return []
    files = sorted(p for p in root.rglob("*") if p.is_file())
    found = []
    if len(files) > OUT_MAX_FILES:
        found.append(f"{root} holds {len(files)} files; {OUT_MAX_FILES} come back: write nothing else there")
    for p in files:
        rel = p.relative_to(root)
        if p.stat().st_size > OUT_MAX_FILE_BYTES:
            found.append(f"{rel} is over {OUT_MAX_FILE_BYTES // 2**20} MiB: it will not come back")
        if len(rel.parts) - 1 > OUT_MAX_DEPTH:
            found.append(f"{rel} is more than {OUT_MAX_DEPTH} folders down: it will not come back")
        if any(not all(c.isascii() and (c.isalnum() or c in "._-") for c in part) for part in rel.parts):
            found.append(f"{rel} has characters other than letters, digits, '.', '_', '-'")
    return found


def _verdict(record: dict) -> str:
    if record.get("timed_out"):
        return f"timed out after {record['seconds']} s"
    return f"exit {record['rc']} after {record['seconds']} s"


def _read_json(path: Path, remove: bool = False):
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if remove:
        path.unlink()
    return value


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None  # the device tool's copy may have no .git
    return out.stdout.strip() or None


# ---------------------------------------------------------------- the steps, each in a process of its own


def run_one_step(args: argparse.Namespace) -> int:
    if args.step == "device":
        device_step(args.device)
    else:
        batch1_step(args.checkpoint, args.device, args.tokens, args.json)
    return 0


def device_step(device: str) -> None:
    import torch

    if device == "cuda":
        subprocess.run(["nvidia-smi"], check=False)
    print(check_gpu(device))
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        print(
            f"GPU 0: {props.name}, {props.total_memory / 2**30:.1f} GiB, {props.multi_processor_count} SMs, "
            f"capability {props.major}.{props.minor}, bfloat16 {torch.cuda.is_bf16_supported()}"
        )


def agreement(model, codec, primer, mode: str, other: str, steps: int = 96) -> float:
    """The share of tokens two step modes draw alike for the same jobs, seeds and schedule: three jobs (1, 2
    and 1 rows, every control on one), the last joining after 8 steps, rows leaving at 24 and 48 tokens (the
    buckets change as they go). Per sample, tokens up to the first difference count as alike."""
    from dataclasses import replace

    from musicrel.bench.generate import every_control
    from musicrel.generation.decode_batch import DecodeBatch
    from musicrel.generation.sampling import SamplingParams

    base = SamplingParams(seconds=10_000.0, max_new_tokens=steps, seed=5)
    jobs = [
        (primer, replace(base, max_new_tokens=24, controls=every_control())),
        (primer, replace(base, max_new_tokens=48, num_samples=2, seed=6, top_p=0.9)),
        (primer, replace(base, seed=7)),
    ]
    drawn = []
    for m in (mode, other):
        batch = DecodeBatch(model, codec, max_rows=4, step_mode=m)
        results, ids = {}, batch.admit(jobs[:2])
        for _ in range(8):
            results.update(batch.step())
        ids += batch.admit(jobs[2:])
        while batch.rows:
            results.update(batch.step())
        drawn.append([t for job_id in ids for t in results[job_id].tokens])
    alike = total = 0
    for a, b in zip(*drawn, strict=True):
        n = min(len(a), len(b))
        differ = [i for i in range(n) if a[i] != b[i]]
        alike += differ[0] if differ else n
        total += max(len(a), len(b))
    return alike / total


class _SyncTimedModel:
    """`model` as the decode loop sees it, adding up the seconds of its decoding steps (`decoder`) with the
    device synchronised before and after each (on a GPU a call returns before its kernels end)."""

    def __init__(self, model, sync):
        self.__dict__.update(model=model, sync=sync, seconds=0.0)

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def decoder(self):
        decode = self.model.decoder()

        def timed(tokens, cache):
            self.sync()
            start = time.perf_counter()
            out = decode(tokens, cache)
            self.sync()
            self.__dict__["seconds"] += time.perf_counter() - start
            return out

        return timed


def batch1_step(checkpoint: Path, device: str, tokens: int, out: Path | None) -> dict:
    """The checkpoint on `device` as served, then bench shapes' batch-1 decoding, the step's split, the first
    note and batch-8 decoding, in that order of importance: each figure printed, and written to `out`, as it
    is measured (a step cut off at its limit keeps what it has). Returns the figures."""
    import torch

    from musicrel.bench.generate import EVENTS_PER_SECOND_OF_MUSIC, every_control, set_threads
    from musicrel.bench.shapes import PRIMER_EVENTS, decode, first_note, motif_primer
    from musicrel.generation.decode_batch import DecodeBatch
    from musicrel.generation.primer import default_max_primer_tokens
    from musicrel.generation.sampling import SamplingParams
    from musicrel.model.checkpoint import load_codec, load_model
    from musicrel.model.quantize import held_weights
    from musicrel.model.weights import DEFAULT_DECODE_WEIGHTS

    cuda = device == "cuda"
    result: dict = {"checkpoint": str(checkpoint), "device": device, "tokens_per_row": tokens}

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def got(line: str, **figures) -> None:
        result.update(figures)
        if cuda:
            result["max_memory_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
        print(f"batch1: {line}", flush=True)
        if out is not None:
            out.write_text(json.dumps(result) + "\n")

    def rtf(rows: int) -> float:
        """Median of 3 jobs: events decoded per second / 40."""
        rates = []
        for _ in range(3):
            events, seconds = decode(model, codec, primer, tokens, rows)
            rates.append(events / seconds / EVENTS_PER_SECOND_OF_MUSIC)
        return statistics.median(rates)

    threads = set_threads(None)  # as bench shapes: what `musicrel generate` chooses on this machine's CPUs
    start = time.perf_counter()
    model = load_model(checkpoint, device=device, weights=DEFAULT_DECODE_WEIGHTS)
    codec = load_codec(checkpoint)
    sync()
    load_s = time.perf_counter() - start
    primer = motif_primer(codec, min(PRIMER_EVENTS, default_max_primer_tokens(model)))
    warm = DecodeBatch(model, codec, max_rows=1, step_mode="eager")  # kernels, allocator, lazy initialisation
    warm.admit([(primer, SamplingParams(seconds=10_000.0, max_new_tokens=16, seed=0))])
    while warm.rows:
        warm.step()
    got(
        f"{checkpoint} on {device}: {held_weights(model)} weights, loaded in {load_s:.1f} s; torch threads "
        f"{torch.get_num_threads()} ({threads})",
        weights=held_weights(model), parameters=model.num_parameters(), load_s=round(load_s, 2),
        primer_events=len(primer.tokens), torch_threads=torch.get_num_threads(),
    )  # fmt: skip

    def steps_ms(batch, n: int) -> float:
        """ms per step of `batch` over n steps, after two (a graph's warm-up and capture)."""
        for _ in range(2):
            batch.step()
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            batch.step()
        sync()
        return 1000 * (time.perf_counter() - t0) / n

    def rows_of(rows: int, mode: str, wrapped=None) -> DecodeBatch:
        """A batch of `rows` rows of one job (one prefill), every control on, the music far away (every row
        decodes every token asked for, none leaves)."""
        batch = DecodeBatch(wrapped or model, codec, max_rows=rows, step_mode=mode)
        params = SamplingParams(
            seconds=10_000.0, max_new_tokens=tokens + 8, seed=0, num_samples=rows, controls=every_control()
        )
        batch.admit([(primer, params)])
        return batch

    n = min(tokens, 256)
    # The eager step (the CPU's) split: the model's forward timed inside it, the device synchronised around.
    timed = _SyncTimedModel(model, sync)
    batch = rows_of(1, "eager", timed)
    for _ in range(2):
        batch.step()
    timed.seconds = 0.0
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        batch.step()
    sync()
    step_ms, model_ms = 1000 * (time.perf_counter() - t0) / n, 1000 * timed.seconds / n
    got(
        f"batch-1 eager step {step_ms:.2f} ms: model {model_ms:.2f} ms, rest {step_ms - model_ms:.2f} ms",
        step_ms=step_ms, model_ms=model_ms, rest_ms=step_ms - model_ms,
    )  # fmt: skip
    del batch
    # The GPU's step: captured per bucket ("graph"; on a CPU the same step uncaptured, "static").
    graph = rows_of(1, "graph")
    graph_ms = steps_ms(graph, n)
    graph_rtf = 1000 / graph_ms / EVENTS_PER_SECOND_OF_MUSIC
    got(
        f"batch-1 {graph.step_mode} step {graph_ms:.3f} ms: {graph_rtf:.1f}x real time (a dense performance)",
        step_mode=graph.step_mode, graph_step_ms=graph_ms, graph_rtf_b1=graph_rtf,
    )  # fmt: skip
    del graph
    # The graph replays what the uncaptured step computes (the same kernels: the same tokens), and the eager
    # step's tokens as far as bfloat16's rounding lets two attention lengths agree.
    same = {mode: agreement(model, codec, primer, "graph", mode) for mode in ("static", "eager")}
    got(
        f"tokens of graph steps equal to static: {same['static']:.1%}, to eager: {same['eager']:.1%}",
        graph_same_as_static=same["static"], graph_same_as_eager=same["eager"],
    )  # fmt: skip
    # Through generate_batch, as `musicrel generate` decodes: a fresh batch each job (its capture counted).
    # After the eager figures above: a GPU step that failed past recovery would take the process down.
    b1 = rtf(1)
    got(f"real-time factor b1 {b1:.1f}x ({tokens} tokens, median of 3)", rtf_b1=b1)
    firsts = [first_note(model, codec, primer, tokens) for _ in range(3)]
    shown = ", ".join("n/a" if s is None else f"{1000 * s:.0f}" for s, _ in firsts)
    got(
        f"first note {shown} ms ({firsts[-1][1]} tokens to it)",
        first_note_ms=[None if s is None else 1000 * s for s, _ in firsts], first_note_tokens=firsts[-1][1],
    )  # fmt: skip
    b8 = rtf(8)
    got(f"real-time factor b8 {b8:.1f}x (all 8 rows together)", rtf_b8=b8)
    # How many rows one step holds at real time: ms per step of the GPU's step at a few batch sizes (the
    # listener benchmark's N), each row's real-time factor = 1 / (step seconds x 40 events a second).
    sweep = result.setdefault("rows", {})
    for rows in ROW_SWEEP if cuda else CPU_ROW_SWEEP:
        batch = rows_of(rows, "graph")
        ms = steps_ms(batch, min(n, 64))
        del batch
        sweep[str(rows)] = {"step_ms": ms, "rtf_per_row": 1000 / ms / EVENTS_PER_SECOND_OF_MUSIC}
        got(f"{rows} rows: a step {ms:.2f} ms, each row {sweep[str(rows)]['rtf_per_row']:.1f}x real time")
    return result
