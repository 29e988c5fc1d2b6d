"""`musicrel bench shapes`: which model shape this CPU can serve, the shapes measured side by side in one run.

Per shape (by default the model shapes of configs/gpu-default.yaml, gpu-2m.yaml, gpu-8m.yaml and gpu-20m.yaml
layered over configs/gpu.yaml, with random weights: speed does not depend on what a model learned; plus any
trained model folder given), and per way of holding the weights while decoding (`--weights`: int8 as served,
and float32 as trained, side by side, with the ratio):
- the real-time factor at batch 1 and batch 8: events per second / 40, decoding through the service's path
  (`generate_batch`: a DecodeBatch, the grammar and every control on) after a primer of real notes; the decode
  only (admitted to done), as the prefill is in the first-note latency. At batch 8 all rows together;
- the first-note latency at batch 1: from the call (a fresh DecodeBatch, the primer's prefill included) to
  the first NOTE_ON token sampled (how many tokens come before it is the model's own choice: a trained
  model's says something, random weights' only that the grammar and controls let a note through);
- where a batch-1 step goes: its time in the model's forward and in the rest (the grammar, the controls, the
  sampler, the batch's bookkeeping), timed inside the same steps (`step_split`), with every control on and
  with none (a request that asks for no control, the default), and the real-time factor each step makes;
- memory: the weights (as held while decoding), the KV cache at full context (`new_cache`) for 1 and 8 rows,
  and the peak growth of the resident set (VmHWM) while a job decodes into the full window: a primer as long
  as the service takes (3/4 of the window), then a few tokens, which grow the cache to the whole window. In a
  fresh process per shape, where freed memory leaves the process (bench/rss.py).
The verdict: the largest shape whose batch-1 real-time factor is at least SERVE_RTF.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from musicrel.bench.generate import EVENTS_PER_SECOND_OF_MUSIC, every_control, set_threads
from musicrel.bench.rss import fresh_process_env, reset_peak, status_kb
from musicrel.bench.timing import cpu_name, medians, side_by_side
from musicrel.errors import ConfigError
from musicrel.model.checkpoint import check_decode_weights
from musicrel.model.weights import HELD_WEIGHTS

SHAPES = ("default", "2m", "8m", "20m")  # configs/gpu-<shape>.yaml, each layered over configs/gpu.yaml
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
SERVE_RTF = 4.0  # the goal: batch 1 decodes at least this many times faster than the music plays
ROWS = (1, 8)
PRIMER_EVENTS = 256  # the timed jobs' primer: a real length (the service takes up to 3/4 of the window)
MEMORY_TOKENS = 8  # tokens the memory job decodes after its primer: enough to grow the cache to the window
MIB = 1024 * 1024


def register(bench_sub) -> None:
    parser = bench_sub.add_parser(
        "shapes",
        help="per model shape: real-time factor at batch 1 and 8, first-note latency, memory; which to serve",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--shape",
        action="append",
        choices=SHAPES,
        default=None,
        help="measure this shape of configs/gpu-SHAPE.yaml (repeatable; default: all of them)",
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        action="append",
        default=[],
        help="also measure this trained model folder (repeatable)",
    )
    parser.add_argument(
        "--configs",
        type=Path,
        default=CONFIG_DIR,
        help="folder holding gpu.yaml and gpu-SHAPE.yaml (default: the repository's configs/)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: chosen as musicrel generate does for 8 rows)",
    )
    parser.add_argument(
        "--weights",
        default=",".join(HELD_WEIGHTS),
        help="how the weights are held while decoding, a comma list measured side by side (default: "
        f"{','.join(HELD_WEIGHTS)}; auto: what the service's probe chooses here)",
    )
    parser.add_argument("--tokens", type=int, default=128, help="tokens each row decodes per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions (the median counts)")
    parser.set_defaults(func=run)


# ---------------------------------------------------------------- shapes and their models


@dataclass(frozen=True)
class Shape:
    """A model to measure: ModelConfig fields for random weights (`config`), or a trained model folder; its
    weights held as `weights` while it decodes (DECODE_WEIGHTS)."""

    name: str
    config: dict | None = None
    checkpoint: str | None = None
    weights: str = "float32"

    @property
    def label(self) -> str:
        return f"{self.name} {self.weights}"


def config_shape(name: str, config_dir: Path = CONFIG_DIR) -> Shape:
    """The model of configs/gpu-<name>.yaml layered over configs/gpu.yaml, as `musicrel train --config
    gpu.yaml --config gpu-<name>.yaml` builds it (the later file's model.config keys win)."""
    try:
        import yaml
    except ModuleNotFoundError:
        raise ConfigError(
            "reading configs/*.yaml needs PyYAML: pip install pyyaml (or the bench or train extra)"
        ) from None
    fields: dict = {}
    for path in (config_dir / "gpu.yaml", config_dir / f"gpu-{name}.yaml"):
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config", code="config_missing") from None
        model = (yaml.safe_load(text) or {}).get("model") or {}
        fields.update(model.get("config") or {})
    return Shape(name, config=fields)


def build(shape: Shape):
    """The model (eval mode, CPU, its weights held as `shape.weights`) and its codec."""
    import torch

    from musicrel.midi.codec import EventCodec
    from musicrel.model.checkpoint import load_codec, load_model
    from musicrel.model.config import ModelConfig
    from musicrel.model.quantize import hold_weights
    from musicrel.model.transformer import MusicTransformer

    if shape.checkpoint is not None:
        return load_model(shape.checkpoint, weights=shape.weights), load_codec(shape.checkpoint)
    codec = EventCodec()
    torch.manual_seed(0)
    cfg = ModelConfig.from_dict({**shape.config, "vocab_size": codec.vocab_size})
    return hold_weights(MusicTransformer(cfg).eval(), shape.weights), codec


def motif_primer(codec, events: int):
    """A primer of about `events` events of real notes, made as the service makes one from an upload
    (`primer_at_cut`): a C-major piano texture through C G Am F, a bass note on every beat under an arpeggio
    in sixteenths (120 bpm, ~30 events a second), cut to the last `events` events."""
    import pretty_midi

    from musicrel.generation.primer import primer_at_cut

    chords = ((48, 60, 64, 67), (43, 59, 62, 67), (45, 60, 64, 69), (41, 60, 65, 69))
    seconds = 8.0 + events / 10.0  # comfortably more music than `events` events
    beat, notes = 0.5, []
    for b in range(int(seconds / beat)):
        bass, *triad = chords[(b // 4) % len(chords)]
        t = b * beat
        notes.append(pretty_midi.Note(64, bass, t, t + beat))
        for i in range(4):
            start = t + i * beat / 4
            notes.append(pretty_midi.Note(80, triad[i % 3] + 12, start, start + beat / 4))
    return primer_at_cut(codec, notes, cut=seconds, primer_seconds=seconds, max_tokens=events)


def weights_bytes(model) -> int:
    """Bytes of the parameters and buffers as they decode (int8 or float32; tied weights counted once)."""
    import itertools

    tensors = {t.data_ptr(): t for t in itertools.chain(model.parameters(), model.buffers())}
    return sum(t.nbytes for t in tensors.values())


def kv_bytes(model, rows: int) -> int:
    """Bytes of the KV cache the model allocates for `rows` rows at its whole window."""
    cache = model.new_cache(rows)
    return cache.k.nbytes + cache.v.nbytes


# ---------------------------------------------------------------- measurements


def _params(tokens: int, rows: int, controls: bool = True):
    from musicrel.generation.sampling import SamplingParams

    # seconds far away: every row decodes exactly `tokens` tokens
    return SamplingParams(
        seconds=10_000.0,
        max_new_tokens=tokens,
        seed=0,
        num_samples=rows,
        controls=every_control() if controls else None,
    )


def decode(model, codec, primer, tokens: int, rows: int) -> tuple[int, float]:
    """One job of `rows` samples through generate_batch: (events generated by all rows, decode seconds)."""
    from musicrel.generation.decode_batch import generate_batch

    (result,) = generate_batch(model, codec, [(primer, _params(tokens, rows))])
    return result.new_tokens, result.timings["decode"]


class _TimedModel:
    """`model` as the decode loop sees it, adding up the seconds its decoding steps take (`decoder`; a
    prefill is not a step's). On the CPU, where the bench runs, an operation is done when it returns."""

    def __init__(self, model):
        self.__dict__.update(model=model, seconds=0.0)

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def decoder(self):
        decode = self.model.decoder()

        def timed(tokens, cache):
            start = time.perf_counter()
            out = decode(tokens, cache)
            self.__dict__["seconds"] += time.perf_counter() - start
            return out

        return timed


def step_split(model, codec, primer, tokens: int, controls: bool = True) -> tuple[float, float]:
    """(seconds per batch-1 step, of which in the model's forward): one row decoding `tokens` tokens after
    `primer` through a DecodeBatch, as `decode` does (with every control on, or with none); the steps timed
    whole, the forward inside them."""
    from musicrel.generation.decode_batch import DecodeBatch

    timed = _TimedModel(model)
    batch = DecodeBatch(timed, codec, max_rows=1)
    batch.admit([(primer, _params(tokens + 1, 1, controls))])
    batch.step()  # the first step grows the cache: not a typical step
    timed.seconds = 0.0
    start = time.perf_counter()
    for _ in range(tokens):
        batch.step()
    return (time.perf_counter() - start) / tokens, timed.seconds / tokens


def first_note(model, codec, primer, tokens: int) -> tuple[float | None, int]:
    """(seconds from the call to the first NOTE_ON sampled, tokens up to it) for one row; (None, tokens) when
    none came in `tokens` tokens. A fresh DecodeBatch, as a request whose primer is not cached meets."""
    import numpy as np

    from musicrel.generation.decode_batch import DecodeBatch

    start = time.perf_counter()
    batch = DecodeBatch(model, codec, max_rows=1)
    (job,) = batch.admit([(primer, _params(tokens, 1))])
    while True:
        finished = dict(batch.step())
        new = finished[job].tokens[0] if job in finished else batch.generated(job)[0]
        on = np.flatnonzero(codec.is_note_on(np.asarray(new)))
        if len(on):
            return time.perf_counter() - start, int(on[0]) + 1
        if job in finished:
            return None, len(new)


def _memory_case(spec: dict) -> dict:
    """In a fresh process (see `measure_memory`): per row count, the KV cache's bytes at the whole window and
    the peak growth of the resident set while a job with the longest primer the service takes decodes into
    the whole window (its cache grows from the primer's length to the window at the first token, the old and
    new caches both held during the copy)."""
    import torch

    from musicrel.generation.primer import default_max_primer_tokens

    torch.set_num_threads(spec["threads"])
    model, codec = build(Shape(**spec["shape"]))
    primer = motif_primer(codec, default_max_primer_tokens(model))
    out = {"primer_events": len(primer.tokens), "kv_bytes": {}, "peak_rss_bytes": {}}
    for rows in ROWS:
        out["kv_bytes"][rows] = kv_bytes(model, rows)
        decode(model, codec, motif_primer(codec, 16), 2, rows)  # warm-up: kernels, thread pools, workspaces
        gc.collect()  # nothing of the warm-up is freed during the measured job
        base = reset_peak()
        decode(model, codec, primer, MEMORY_TOKENS, rows)
        out["peak_rss_bytes"][rows] = max(status_kb("VmHWM") - base, 0) * 1024
    return out


def measure_memory(shape: Shape, threads: int) -> dict:
    """`_memory_case` of `shape` in a fresh process (this process's heap already holds freed tensors)."""
    spec = json.dumps({"shape": asdict(shape), "threads": threads})
    proc = subprocess.run(
        [sys.executable, "-m", "musicrel.bench.shapes", spec],
        capture_output=True,
        text=True,
        env=fresh_process_env(),
        timeout=1800,
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"memory of {shape.label} not measured: {tail}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {key: {int(r): v for r, v in value.items()} if isinstance(value, dict) else value
            for key, value in out.items()}  # fmt: skip


@dataclass
class ShapeResult:
    name: str
    weights: str
    layers: int
    d_model: int
    params: int
    context: int
    primer_events: int  # of the timed jobs
    events: dict[int, int]  # rows -> events the last timed job of that many rows generated (all rows)
    rtf: dict[int, float]  # rows -> median events per second of decoding / EVENTS_PER_SECOND_OF_MUSIC
    first_note_s: float | None  # median; None when a repetition saw no note
    first_note_tokens: int  # tokens up to the first NOTE_ON, last repetition
    weights_bytes: int
    kv_bytes: dict[int, int] = field(default_factory=dict)  # rows -> bytes at the whole window
    peak_rss_bytes: dict[int, int] = field(default_factory=dict)  # rows -> VmHWM growth decoding to it
    memory_primer_events: int = 0
    step_s: float = 0.0  # median seconds of a batch-1 step, every control on
    model_s: float = 0.0  # of which in the model's forward (median over the same repetitions)
    plain_step_s: float = 0.0  # the same without a control (a request that asks for none)
    plain_model_s: float = 0.0


def measure(shapes: list[Shape], tokens: int, repeats: int) -> list[ShapeResult]:
    """Every shape's timings side by side (repetitions interleaved across shapes, the order alternating),
    then each shape's memory in a process of its own."""
    import torch

    from musicrel.generation.primer import default_max_primer_tokens
    from musicrel.model.quantize import held_weights

    built = {shape.label: build(shape) for shape in shapes}
    primers = {
        name: motif_primer(codec, min(PRIMER_EVENTS, default_max_primer_tokens(model)))
        for name, (model, codec) in built.items()
    }
    fns = {}
    for name, (model, codec) in built.items():
        for rows in ROWS:
            fns[name, rows] = lambda m=model, c=codec, p=primers[name], r=rows: decode(m, c, p, tokens, r)
        fns[name, "first"] = lambda m=model, c=codec, p=primers[name]: first_note(m, c, p, tokens)
        fns[name, "split"] = lambda m=model, c=codec, p=primers[name]: step_split(m, c, p, tokens)
        fns[name, "plain"] = lambda m=model, c=codec, p=primers[name]: step_split(m, c, p, tokens, False)
    runs = side_by_side(fns, repeats, alternate=True)

    results = []
    threads = torch.get_num_threads()
    for shape in shapes:
        model, codec = built[shape.label]
        rates = medians({rows: [e / s for e, s in runs[shape.label, rows]] for rows in ROWS})
        firsts = runs[shape.label, "first"]
        first_s = [s for s, _ in firsts]
        memory = measure_memory(shape, threads)
        results.append(
            ShapeResult(
                name=shape.name,
                weights=shape.weights if shape.weights != "auto" else f"auto: {held_weights(model)}",
                layers=model.cfg.n_layers,
                d_model=model.cfg.d_model,
                params=model.num_parameters(),
                context=model.cfg.max_seq_len,
                primer_events=len(primers[shape.label].tokens),
                events={rows: runs[shape.label, rows][-1][0] for rows in ROWS},
                rtf={rows: rate / EVENTS_PER_SECOND_OF_MUSIC for rows, rate in rates.items()},
                first_note_s=None if None in first_s else statistics.median(first_s),
                first_note_tokens=firsts[-1][1],
                weights_bytes=weights_bytes(model),
                kv_bytes=memory["kv_bytes"],
                peak_rss_bytes=memory["peak_rss_bytes"],
                memory_primer_events=memory["primer_events"],
                step_s=statistics.median(s for s, _ in runs[shape.label, "split"]),
                model_s=statistics.median(m for _, m in runs[shape.label, "split"]),
                plain_step_s=statistics.median(s for s, _ in runs[shape.label, "plain"]),
                plain_model_s=statistics.median(m for _, m in runs[shape.label, "plain"]),
            )
        )
    return results


def verdict(results: list[ShapeResult]) -> ShapeResult | None:
    """The largest shape (parameters) whose batch-1 real-time factor reaches SERVE_RTF; None if none does."""
    fast = [r for r in results if r.rtf[1] >= SERVE_RTF]
    return max(fast, key=lambda r: r.params) if fast else None


def table(results: list[ShapeResult]) -> list[str]:
    header = ("shape", "weights", "params", "context", "RTF b1", "RTF b8", "first note ms", "weights MiB",
              "KV MiB b1/b8", "peak RSS MiB b1/b8")  # fmt: skip
    rows = []
    for r in results:
        first = "n/a" if r.first_note_s is None else f"{1e3 * r.first_note_s:.0f} ({r.first_note_tokens} tok)"
        rows.append(
            (
                f"{r.name} ({r.layers}x{r.d_model})",
                r.weights,
                f"{r.params / 1e6:.2f} M",
                str(r.context),
                f"{r.rtf[1]:.1f}x",
                f"{r.rtf[8]:.1f}x",
                first,
                f"{r.weights_bytes / MIB:.1f}",
                f"{r.kv_bytes[1] / MIB:.1f} / {r.kv_bytes[8] / MIB:.1f}",
                f"{r.peak_rss_bytes[1] / MIB:.1f} / {r.peak_rss_bytes[8] / MIB:.1f}",
            )
        )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    line = " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    return [line, "-" * len(line)] + [
        " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    ]


def split_table(results: list[ShapeResult]) -> list[str]:
    """Where a batch-1 step goes, per shape and weights, with every control on and with none: the model's
    forward, the rest, and the real-time factor of that step (one event a step)."""
    header = ("batch-1 step", "weights", "controls", "step ms", "model ms", "rest ms", "rest share", "RTF")
    rows = []
    for r in results:
        for controls, step_s, model_s in (
            ("every", r.step_s, r.model_s),
            ("none", r.plain_step_s, r.plain_model_s),
        ):
            rest = step_s - model_s
            share = f"{100 * rest / step_s:.0f} %" if step_s > 0 else "n/a"
            rtf = f"{1 / (step_s * EVENTS_PER_SECOND_OF_MUSIC):.1f}x" if step_s > 0 else "n/a"
            rows.append((f"{r.name} ({r.layers}x{r.d_model})", r.weights, controls, f"{1e3 * step_s:.2f}",
                         f"{1e3 * model_s:.2f}", f"{1e3 * rest:.2f}", share, rtf))  # fmt: skip
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    line = " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    return [line, "-" * len(line)] + [
        " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    ]


def ratios(results: list[ShapeResult]) -> list[str]:
    """Per shape measured both ways: int8's real-time factors over float32's (same run, interleaved)."""
    by = {(r.name, r.weights): r for r in results}
    lines = []
    for name in dict.fromkeys(r.name for r in results):
        q, f = by.get((name, "int8")), by.get((name, "float32"))
        if q is not None and f is not None:
            lines.append(
                f"int8 / float32, {name}: RTF b1 {q.rtf[1] / f.rtf[1]:.2f}x, b8 {q.rtf[8] / f.rtf[8]:.2f}x, "
                f"weights {q.weights_bytes / f.weights_bytes:.2f}x the bytes"
            )
    return lines


def run(args) -> int:
    import torch

    for name, value in (("--tokens", args.tokens), ("--repeats", args.repeats)):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    weights = [check_decode_weights(w.strip()) for w in dict.fromkeys(args.weights.split(","))]
    names = dict.fromkeys(args.shape or SHAPES)  # each shape once, in the order given
    models = [config_shape(name, args.configs) for name in names]
    models += [Shape(str(folder), checkpoint=str(folder)) for folder in dict.fromkeys(args.checkpoint)]
    shapes = [replace(shape, weights=w) for shape in models for w in weights]
    chosen = set_threads(args.threads)
    results = measure(shapes, args.tokens, args.repeats)

    print(
        f"musicrel bench shapes: torch threads {torch.get_num_threads()} ({chosen}); {args.tokens} tokens "
        f"per row per measurement, median of {args.repeats}; load average {os.getloadavg()[0]:.1f} on "
        f"{cpu_name()}, GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', 'default')}"
    )
    for line in table(results) + ratios(results) + [""] + split_table(results):
        print(line)
    primers = sorted({r.primer_events for r in results})
    for note in (
        f"RTF: events per second of decoding / {EVENTS_PER_SECOND_OF_MUSIC:g} (prefill not included), "
        "through generate_batch with the grammar and every control on, after a primer of "
        f"{'/'.join(map(str, primers))} events of real notes; b8: the 8 rows together (each gets 1/8).",
        "First note: batch 1, from the call to the first NOTE_ON sampled (prefill included; tokens up to "
        "it).",
        "Batch-1 step: the same steps timed whole and in the model's forward (token in, logits out); the "
        "rest is the grammar, the controls, the sampler and the batch's bookkeeping, measured in one run "
        "beside the rows above; controls every: as the RTF above, none: a request that asks for no control "
        "(the default); RTF: one event a step, the step's alone.",
        "Weights: as held while decoding (int8: every layer the CPU's int8 kernel takes; the service's "
        "default; auto holds the faster of the two here). KV: the cache at the whole context. Peak RSS: its "
        "growth while a job with a 3/4-window primer decodes into the whole window (prefill included), in a "
        "fresh process.",
    ):
        print(textwrap.fill(note, width=110, subsequent_indent="  "))
    best = verdict(results)
    if best is None:
        print(f"serve: none of these shapes decodes >= {SERVE_RTF:g}x real time at batch 1")
    else:
        print(
            f"serve: {best.name} ({best.layers}x{best.d_model}, {best.params / 1e6:.2f} M parameters, "
            f"{best.weights} weights, "
            f"context {best.context}): the largest shape >= {SERVE_RTF:g}x real time at batch 1 "
            f"({best.rtf[1]:.1f}x)"
        )
    return 0


if __name__ == "__main__":  # one shape's memory in a fresh process (see measure_memory)
    print(json.dumps(_memory_case(json.loads(sys.argv[1]))))
