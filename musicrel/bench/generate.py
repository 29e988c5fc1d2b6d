"""`musicrel bench generate`: what the KV cache and batching buy, measured side by side in one run.

- decoding one token with the cache vs recomputing the whole prefix (what a cache-less generator does), at
  prefixes 512 and 1024 (goal >= 50x);
- generate() throughput (sampling and grammar included) with 8 rows vs 1 (goal >= 4x);
- the real-time factor of generate_batch on this machine: events per second / 40 (a dense piano texture plays
  ~40 events per second; goal >= 10x);
- generate_batch with every control set (key, chords, density, range, polyphony) vs none, 8 rows: what the
  controls cost per token (goal: within 5 %, i.e. nothing measurable).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from musicrel.bench.timing import cpu_name, medians, side_by_side

DEFAULT_CHECKPOINT = Path("checkpoints/default")
EVENTS_PER_SECOND_OF_MUSIC = 40.0


def register(bench_sub) -> None:
    parser = bench_sub.add_parser(
        "generate",
        help="cached vs full-recompute decoding, batch 8 vs 1, real-time factor",
        description="Token throughput of cached decoding against recomputing the prefix (512, 1024), of "
        "batch 8 against batch 1, and the real-time factor (events/s / 40), measured in one run.",
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="checkpoint folder (default: checkpoints/default if present, else a default-size random model)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: chosen as musicrel generate does)",
    )
    parser.add_argument("--tokens", type=int, default=64, help="tokens decoded per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions (the median counts)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.set_defaults(func=run)


def every_control():
    """Every control set at once (key, chords, density, range, polyphony): what the benchmarks steer with."""
    from musicrel.generation.controls import Controls

    return Controls(key="C:major", chords="C:2 G:2 Am:2 F:2", density=8.0, low_note=36, high_note=96,
                    max_polyphony=6)  # fmt: skip


def set_threads(threads: int | None, rows: int = 8) -> str:
    """Torch threads: `threads` (--threads), else what `musicrel generate` would choose for `rows` rows (the
    largest batch measured). Returns how the count was chosen, for the benchmark's header."""
    from musicrel.runtime.threads import set_torch_threads

    choice = set_torch_threads(threads, rows)
    return "--threads" if threads else f"chosen: {choice}"


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


@dataclass
class _Bench:
    """What every measurement of one run shares."""

    model: Any
    codec: Any
    device: Any
    tokens: int  # decoded per measurement
    repeats: int
    stream: Any  # (8, max_seq_len) event tokens (no specials): speed does not depend on content

    @property
    def prompts(self) -> Any:
        """The first 256 tokens of each row (fewer where the window is short), as numpy."""
        return self.stream[:, : min(256, self.model.cfg.max_seq_len - self.tokens)].cpu().numpy()

    def sync(self) -> None:
        _sync(self.device)

    def generate(self, primer, params) -> None:
        from musicrel.generation.decode_batch import generate_batch

        generate_batch(self.model, self.codec, [(primer, params)])
        self.sync()


def run(args) -> int:
    omp_policy = os.environ.get("OMP_WAIT_POLICY", "default")
    spin = os.environ.get("GOMP_SPINCOUNT", "default")
    import numpy as np
    import torch

    from musicrel.model.quantize import is_quantized

    chosen = set_threads(args.threads)
    device = torch.device(args.device)
    model, codec, source = _load(args.checkpoint, device)
    rng = np.random.default_rng(0)
    stream = torch.as_tensor(rng.integers(0, codec.pad_id, size=(8, model.cfg.max_seq_len)), device=device)
    bench = _Bench(model, codec, device, args.tokens, args.repeats, stream)
    long_model, long_stream = _long_window(bench, rng)
    long_note = " *" if long_model is not model else ""

    rows = _cache_rows(bench, long_model, long_stream, long_note)
    rows.append(_batch_row(bench))
    primer, params = _end_to_end_job(bench)
    rows += _real_time_rows(bench, primer, params)
    rows += _control_rows(bench, primer, params[8])

    cfg = model.cfg
    print(
        f"musicrel bench generate: {source}; {cfg.n_layers} layers, d_model {cfg.d_model}, "
        f"{cfg.n_heads} heads, "
        f"attention {cfg.attention}, max_seq_len {cfg.max_seq_len}, {model.num_parameters() / 1e6:.1f} M "
        f"params, {'int8' if is_quantized(model) else 'float32'} weights (as served); device {device}, "
        f"torch threads {torch.get_num_threads()} ({chosen}), {bench.tokens} tokens "
        "per measurement, "
        f"median of {args.repeats}; load average {os.getloadavg()[0]:.1f} on {cpu_name()}, "
        f"OMP_WAIT_POLICY={omp_policy}, GOMP_SPINCOUNT={spin}"
    )
    _print_table(rows)
    if long_note:
        print(
            f"* same architecture with max_seq_len 1024 (random weights); the checkpoint's is "
            f"{cfg.max_seq_len}"
        )
    return 0


def _load(checkpoint: Path | None, device) -> tuple[Any, Any, str]:
    """The model, its codec and where they came from: `checkpoint`, else checkpoints/default if present,
    else a default-size model with random weights."""
    import torch

    from musicrel.midi.codec import EventCodec
    from musicrel.model.checkpoint import load_codec, load_model
    from musicrel.model.config import ModelConfig
    from musicrel.model.quantize import hold_weights
    from musicrel.model.transformer import MusicTransformer
    from musicrel.model.weights import DEFAULT_DECODE_WEIGHTS

    checkpoint = checkpoint or (
        DEFAULT_CHECKPOINT if (DEFAULT_CHECKPOINT / "config.json").is_file() else None
    )
    if checkpoint is not None:
        model = load_model(checkpoint, device=device, weights=DEFAULT_DECODE_WEIGHTS)  # as served
        return model, load_codec(checkpoint), str(checkpoint)
    codec = EventCodec()
    torch.manual_seed(0)
    model = MusicTransformer(ModelConfig(vocab_size=codec.vocab_size)).to(device).eval()
    return hold_weights(model, DEFAULT_DECODE_WEIGHTS), codec, "random init (no checkpoint)"


def _long_window(bench: _Bench, rng) -> tuple[Any, Any]:
    """The model and one row of tokens to measure the long prefixes with. Speed does not depend on the
    weights: a checkpoint whose window is shorter than 1024 is measured there through the same architecture
    with a 1024 window (random weights)."""
    import torch

    from musicrel.model.config import ModelConfig
    from musicrel.model.quantize import hold_weights
    from musicrel.model.transformer import MusicTransformer
    from musicrel.model.weights import DEFAULT_DECODE_WEIGHTS

    cfg = bench.model.cfg
    if cfg.max_seq_len >= 1024:
        return bench.model, bench.stream
    torch.manual_seed(0)
    long_cfg = ModelConfig.from_dict({**cfg.to_dict(), "max_seq_len": 1024})
    long_model = hold_weights(MusicTransformer(long_cfg).to(bench.device).eval(), DEFAULT_DECODE_WEIGHTS)
    long_stream = torch.as_tensor(rng.integers(0, bench.codec.pad_id, size=(1, 1024)), device=bench.device)
    return long_model, long_stream


def _cache_rows(bench: _Bench, model, stream, note: str) -> list[tuple]:
    """Decoding one token with the cache against recomputing the whole prefix, at prefixes 512 and 1024."""
    import torch

    from musicrel.generation.decode import prefill

    rows = []
    decode = model.decoder()
    with torch.inference_mode():
        for prefix in (512, 1024):
            x = stream[:1, :prefix]
            steps = min(bench.tokens, prefix - 1)

            def full(x=x):
                model(x)[:, -1]  # one new token costs a whole forward over the prefix
                bench.sync()

            def cached(x=x, steps=steps, prefix=prefix):
                cache = model.new_cache(1, prefix)
                prefill(model, x[:, : prefix - steps], cache)
                bench.sync()
                t0 = time.perf_counter()
                for i in range(prefix - steps, prefix):
                    decode(x[:, i], cache)
                bench.sync()
                return time.perf_counter() - t0

            t = medians(side_by_side({"full": full, "cached": cached}, bench.repeats))
            t_full, t_cached = t["full"], t["cached"] / steps
            rows.append(
                (
                    f"decode @ prefix {prefix} (tok/s){note}",
                    f"recompute {1 / t_full:,.1f}",
                    f"cached {1 / t_cached:,.1f}",
                    f"{t_full / t_cached:,.1f}x",
                    ">= 50x",
                )
            )
    return rows


def _batch_row(bench: _Bench) -> tuple:
    """Throughput of the generation loop itself (sampling + grammar), 8 rows vs 1, after a 256-token
    primer."""
    from musicrel.generation.decode import generate
    from musicrel.generation.grammar import Grammar

    n, prompts = bench.tokens, bench.prompts
    prompt_len = prompts.shape[1]

    def loop(batch):
        grammar = Grammar(bench.codec, list(prompts[:batch]), [10**9] * batch, device=bench.device)
        it = generate(
            bench.model, bench.stream[:batch, :prompt_len], n, seeds=range(batch), grammar=grammar, top_p=0.95
        )
        next(it)  # the prefill and the first token
        bench.sync()
        t0 = time.perf_counter()
        for _ in it:
            pass
        bench.sync()
        return time.perf_counter() - t0

    t = medians(side_by_side({1: lambda: loop(1), 8: lambda: loop(8)}, bench.repeats))
    decode_rate = {batch: batch * (n - 1) / t[batch] for batch in (1, 8)}
    return (
        "batch 8 vs 1 (tok/s)",
        f"b=1 {decode_rate[1]:,.1f}",
        f"b=8 {decode_rate[8]:,.1f}",
        f"{decode_rate[8] / decode_rate[1]:.1f}x",
        ">= 4x",
    )


def _end_to_end_job(bench: _Bench) -> tuple[Any, dict[int, Any]]:
    """A 256-token primer (fewer where the window is short) and the parameters for 8n tokens after it, for
    batches of 1 and 8."""
    from musicrel.generation.primer import Primer
    from musicrel.generation.sampling import SamplingParams

    n = bench.tokens
    primer = Primer(
        tokens=bench.prompts[0][: min(256, bench.model.cfg.max_seq_len // 2)],
        start_time=0.0,
        end_time=0.0,
        tempo=120.0,
        program=0,
        notes=[],
    )
    params = {
        b: SamplingParams(seconds=10_000.0, max_new_tokens=n * 8, seed=0, num_samples=b) for b in (1, 8)
    }
    return primer, params


def _real_time_rows(bench: _Bench, primer, params: dict[int, Any]) -> list[tuple]:
    """End to end: generate_batch (prefill, sampling, grammar, rendering) as events per second of music."""
    t = medians(
        side_by_side(
            {1: lambda: bench.generate(primer, params[1]), 8: lambda: bench.generate(primer, params[8])},
            bench.repeats,
        )
    )
    rows = []
    for batch in (1, 8):
        rate = batch * params[batch].max_new_tokens / t[batch]
        rows.append(
            (
                f"real-time factor, b={batch}",
                f"{rate:,.0f} events/s",
                f"/ {EVENTS_PER_SECOND_OF_MUSIC:g} events/s",
                f"{rate / EVENTS_PER_SECOND_OF_MUSIC:,.1f}x",
                ">= 10x" if batch == 1 else "",
            )
        )
    return rows


def _control_rows(bench: _Bench, primer, params) -> list[tuple]:
    """The same 8-row job with every control against none (what the controls' rules cost per token), and the
    rules alone (constrain + advance, 8 rows, fixed logits): end to end, their cost is within noise."""
    import torch

    from musicrel.generation.grammar import Grammar

    steer = every_control()
    controlled = replace(params, controls=steer)
    t = medians(
        side_by_side(
            {
                "none": lambda: bench.generate(primer, params),
                "controls": lambda: bench.generate(primer, controlled),
            },
            bench.repeats,
        )
    )
    rate = {name: 8 * params.max_new_tokens / t[name] for name in t}

    resolved = steer.resolve(primer, bench.codec.config.step_ms)
    fixed = torch.randn(8, bench.model.cfg.vocab_size, device=bench.device)
    prompts = bench.prompts

    def rules(controls, steps=200):
        g = Grammar(
            bench.codec, list(prompts[:8]), [10**9] * 8, [300] * 8, device=bench.device, controls=controls
        )
        t0 = time.perf_counter()
        for _ in range(steps):
            g.advance(g.constrain(fixed).argmax(dim=1))
        bench.sync()
        return (time.perf_counter() - t0) / steps

    g_t = medians(side_by_side({"none": lambda: rules(None), "all": lambda: rules([resolved] * 8)}, 5))
    return [
        (
            "controls vs none, b=8 (tok/s)",
            f"none {rate['none']:,.0f}",
            f"controls {rate['controls']:,.0f}",
            f"{rate['controls'] / rate['none']:.2f}x",
            ">= 0.95x",
        ),
        (
            "rules per step, b=8 (ms)",
            f"none {1e3 * g_t['none']:.2f}",
            f"controls {1e3 * g_t['all']:.2f}",
            f"+{1e3 * (g_t['all'] - g_t['none']):.2f} ms",
            "",
        ),
    ]


def _print_table(rows: list[tuple]) -> None:
    header = ("measure", "baseline", "ours", "ratio", "goal")
    widths = [max(len(str(r[i])) for r in [*rows, header]) for i in range(len(header))]
    line = " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    print(line)
    print("-" * len(line))
    for r in rows:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
