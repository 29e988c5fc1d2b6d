"""`musicrel bench attention`: memory and speed of relative attention, side by side in one run.

(a) memory of the relative term: skew (Huang et al.) vs a Shaw-style O(L²D) gather, and the model's attention
    with and without query blocks; (b) one attention layer: skew ÷ causal SDPA; (c) the whole default model:
    each scheme ÷ absolute; (d) growth of the query-blocked path's peak memory from L to 4L.

Memory is measured, not computed: every case runs in a fresh subprocess and reports its peak resident set
(VmHWM, reset through /proc/self/clear_refs) above the resident set just before the case, with glibc's mmap
threshold pinned low so freed tensors really leave the process. Timings interleave the variants repetition by
repetition and report medians.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from musicrel.bench.rss import fresh_process_env, reset_peak, status_kb
from musicrel.bench.timing import cpu_name, medians, side_by_side

MB = 1024 * 1024


def register(bench_sub) -> None:
    parser = bench_sub.add_parser(
        "attention",
        help="relative attention memory and speed: skew vs Shaw gather vs SDPA, chunked path growth",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a minute instead of several)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repetitions per variant")
    parser.add_argument("--batch", type=int, default=1, help="batch size of the memory and layer cases")
    parser.set_defaults(func=run)


# ---------------------------------------------------------------- memory cases (run in a subprocess)


def _memory_case(case: str, L: int, B: int, H: int, D: int, chunk: int) -> dict:
    """Peak bytes a case allocates above what it held before. Inputs (q, k, v, E_r) are made first and
    excluded, except for the `layer_*` cases of (d), which count them since they grow with L as well."""
    import torch

    from musicrel.model.attention import causal_allowed, relative_logits_naive, relative_logits_skew
    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import CausalSelfAttention

    torch.set_num_threads(1)

    def setup(L):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, H, L, D // H, generator=g) for _ in range(3))
        E_r = torch.randn(H, L, D // H, generator=g) * 0.1
        cfg = ModelConfig(
            vocab_size=8, n_layers=1, d_model=D, n_heads=H, d_ff=4, max_seq_len=L, dropout=0.0,
            query_chunk_size=chunk if case.endswith("chunked") else None,
        )  # fmt: skip
        attn = CausalSelfAttention(cfg).eval()
        with torch.no_grad():
            attn.E_r.copy_(E_r)
        return q, k, v, E_r, attn

    @torch.inference_mode()
    def compute(q, k, v, E_r, attn):
        if case == "rel_skew":
            return relative_logits_skew(q, E_r)
        if case == "rel_shaw":
            return relative_logits_naive(q, E_r)
        if case.startswith("plain"):
            logits = q @ k.transpose(-1, -2)  # (B, H, L, L)
            if case == "plain+skew":
                logits.add_(relative_logits_skew(q, E_r))
            elif case == "plain+shaw":
                logits.add_(relative_logits_naive(q, E_r))
            causal = causal_allowed(q.size(2), q.size(2), None)
            probs = logits.mul_((q.size(-1)) ** -0.5).masked_fill_(~causal, float("-inf")).softmax(dim=-1)
            del logits
            return probs @ v
        return attn.attend(q, k, v, None)  # model_* / layer_*: the model's own attention core

    compute(*setup(min(L, 2 * chunk)))  # warm-up: library workspaces and thread pools are not the case's
    if case.startswith("layer_"):
        base = reset_peak()
        out = compute(*setup(L))
    else:
        inputs = setup(L)
        base = reset_peak()
        out = compute(*inputs)
    peak = status_kb("VmHWM")
    del out
    return {"case": case, "L": L, "peak_bytes": max(peak - base, 0) * 1024}


def _measure(case: str, L: int, B: int, H: int = 8, D: int = 512, chunk: int = 128) -> dict:
    env = fresh_process_env(OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "musicrel.bench.attention", case, str(L), str(B), str(H), str(D), str(chunk)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"case": case, "L": L, "peak_bytes": None, "error": tail}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------- timing


def _time_interleaved(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each (what they return is a tensor, not a timing: dropped)."""

    def timed(fn):
        def run() -> None:
            fn()

        return run

    return medians(side_by_side({name: timed(fn) for name, fn in fns.items()}, repeats))


def _naive_skew_layer(q, k, v, E_r):
    """The textbook implementation: Q·E_rᵀ, pad, reshape, slice, add, float causal mask, softmax, matmul."""
    import torch
    import torch.nn.functional as F

    B, H, L, D = q.shape
    QE = q @ E_r.transpose(-1, -2)  # (B, H, L, L)
    S_rel = F.pad(QE, (1, 0)).reshape(B, H, L + 1, L)[:, :, 1:]  # (B, H, L, L)
    mask = torch.full((L, L), float("-inf")).triu(1)
    return ((q @ k.transpose(-1, -2) + S_rel) / D**0.5 + mask).softmax(dim=-1) @ v


# ---------------------------------------------------------------- the command


def _fmt_mb(n: int | None) -> str:
    return "n/a" if n is None else f"{n / MB:,.1f}"


def run(args) -> int:
    # OpenMP waiting (musicrel.cli sets a short spin count before torch loads) decides how long the many small
    # parallel ops wait for their workers: printed so runs can be compared.
    omp_policy = os.environ.get("OMP_WAIT_POLICY", "default")
    spin = os.environ.get("GOMP_SPINCOUNT", "default")
    import torch

    quick = args.quick
    repeats = args.repeats or (3 if quick else 7)
    torch.set_num_threads(args.threads)
    B, H, D = args.batch, 8, 512
    print(f"musicrel bench attention: torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"{cpu_name()}, OMP_WAIT_POLICY={omp_policy}, GOMP_SPINCOUNT={spin}, batch {B}, H={H}, "
          f"D={D} (head size {D // H}), fp32, CPU")  # fmt: skip

    _memory_table(quick, B, H, D)
    _layer_timing(args.threads, quick, B, H, D, repeats)
    _model_timing(quick, repeats)
    _blocked_growth(quick, B, H, D)
    return 0


def _memory_table(quick: bool, B: int, H: int, D: int) -> None:
    """(a) memory of the relative term, skew against a Shaw gather, and of the model's attention in one block
    and in query blocks, each case in a fresh process."""
    lengths = (256, 512, 1024) if quick else (512, 1024, 2048)
    print("\n(a) memory above the inputs, MB (x = multiples of one B·H·L·L fp32 logits tensor)")
    header = (
        f"{'L':>5} {'logits':>8} | {'S_rel skew':>14} {'Shaw gather':>16} {'Shaw/skew':>9} | "
        f"{'plain layer':>11} {'+skew':>7} {'+Shaw':>9} | {'model 1 block':>14} {'model blocks':>13}"
    )
    print(header)
    print("-" * len(header))
    for L in lengths:
        logits = B * H * L * L * 4
        shaw_need = B * H * L * L * (D // H) * 4 * 1.3 + 4 * logits
        results = {}
        for case in (
            "rel_skew",
            "rel_shaw",
            "plain",
            "plain+skew",
            "plain+shaw",
            "model_full",
            "model_chunked",
        ):
            if "shaw" in case and _available_bytes() < shaw_need:
                results[case] = {"peak_bytes": None, "error": f"needs ~{shaw_need / 2**30:.1f} GiB free"}
                continue
            results[case] = _measure(case, L, B, H, D)
        p = {c: r["peak_bytes"] for c, r in results.items()}

        def x(n, logits=logits):
            return "" if n is None else f" ({n / logits:.2f}x)"

        ratio = (
            "n/a" if p["rel_shaw"] is None or not p["rel_skew"] else f"{p['rel_shaw'] / p['rel_skew']:.0f}x"
        )
        extra_skew = None if p["plain+skew"] is None or p["plain"] is None else p["plain+skew"] - p["plain"]
        extra_shaw = None if p["plain+shaw"] is None or p["plain"] is None else p["plain+shaw"] - p["plain"]
        model_full, model_chunked = (_fmt_mb(p[c]) + x(p[c]) for c in ("model_full", "model_chunked"))
        print(
            f"{L:>5} {_fmt_mb(logits):>8} | {_fmt_mb(p['rel_skew']) + x(p['rel_skew']):>14} "
            f"{_fmt_mb(p['rel_shaw']) + x(p['rel_shaw']):>16} {ratio:>9} | {_fmt_mb(p['plain']):>11} "
            f"{_fmt_mb(extra_skew):>7} {_fmt_mb(extra_shaw):>9} | {model_full:>14} {model_chunked:>13}"
        )
        for c, r in results.items():
            if r.get("error"):
                print(f"      {c} at L={L} not measured: {r['error']}")
    print(
        "  S_rel skew / Shaw gather: computing the relative logits alone. +skew / +Shaw: a plain attention"
        "\n  layer (q·kᵀ, softmax, ·v, holding L x L logits and probabilities) with the term added, minus the"
        "\n  plain layer. model: the model's skew attention (S_rel as SDPA's float mask) in one block / in"
        "\n  query blocks of 128. Goals: skew <= 1 logits tensor, >= 30x less than Shaw at the largest L;"
        "\n  blocks hold no L x L tensor."
    )


def _layer_timing(threads: int, quick: bool, B: int, H: int, D: int, repeats: int) -> None:
    """(b) one attention layer forward: each variant ÷ causal SDPA, at `threads` threads and at one."""
    import torch

    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import CausalSelfAttention

    L = 512 if quick else 1024
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D // H, generator=g) for _ in range(3))
    layers = {}
    for name, kw in {
        "skew, query blocks of 128 (default)": dict(query_chunk_size=128),
        "skew, one block (S_rel as SDPA mask)": dict(query_chunk_size=None),
    }.items():
        cfg = ModelConfig(
            vocab_size=8, n_layers=1, d_model=D, n_heads=H, d_ff=4, max_seq_len=L, dropout=0.0, **kw
        )
        layers[name] = CausalSelfAttention(cfg).eval()
    E_r = layers["skew, one block (S_rel as SDPA mask)"].E_r.detach()
    fns = {"causal SDPA, no relative term": lambda: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True)}  # fmt: skip
    fns.update({name: (lambda m=m: m.attend(q, k, v, None)) for name, m in layers.items()})
    fns["naive skew (pad/reshape, float mask)"] = lambda: _naive_skew_layer(q, k, v, E_r)
    # Also at one thread: a block issues a few small parallel ops where SDPA issues one, so on a busy shared
    # CPU the thread count skews the ratio; one thread shows the algorithmic cost.
    thread_counts = [threads] if threads == 1 else [threads, 1]
    results = {}
    with torch.inference_mode():
        for n in thread_counts:
            torch.set_num_threads(n)
            results[n] = _time_interleaved(fns, repeats)
    torch.set_num_threads(threads)
    print(f"\n(b) one attention layer forward, L={L}, B={B}: time / causal SDPA (goal: skew <= 2x)")
    print(f"  {'':<40} " + " ".join(f"{f'{n} thread(s)':>22}" for n in thread_counts))
    for name in fns:
        cells = []
        for n in thread_counts:
            t, base = results[n][name], results[n]["causal SDPA, no relative term"]
            cells.append(f"{t * 1000:11.1f} ms {t / base:6.2f}x")
        print(f"  {name:<40} " + " ".join(cells))


def _model_timing(quick: bool, repeats: int) -> None:
    """(c) the whole default model forward under each attention scheme ÷ absolute."""
    import torch

    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import MusicTransformer

    L, Bm = (512, 1) if quick else (1024, 1)
    n_layers = 2 if quick else ModelConfig(vocab_size=8).n_layers
    models = {}
    for name, kw in {
        "absolute (SDPA causal)": dict(attention="absolute"),
        "skew (default)": dict(attention="skew"),
        "skew, one block": dict(attention="skew", query_chunk_size=None),
        "t5": dict(attention="t5"),
        "shaw": dict(attention="shaw"),
    }.items():
        torch.manual_seed(0)
        models[name] = MusicTransformer(
            ModelConfig(vocab_size=391, n_layers=n_layers, max_seq_len=L, **kw)
        ).eval()
    x = torch.randint(0, 391, (Bm, L))
    with torch.inference_mode():
        times = _time_interleaved({name: (lambda m=m: m(x)) for name, m in models.items()}, repeats)
    base = times["absolute (SDPA causal)"]
    cfg = models["skew (default)"].cfg
    print(
        f"\n(c) whole model forward, L={L}, B={Bm}, {cfg.n_layers} layers, d_model {cfg.d_model}, "
        f"{cfg.n_heads} heads: time / absolute (goal: skew <= 1.5x)"
    )
    for name, t in times.items():
        print(f"  {name:<40} {t * 1000:9.1f} ms  {t / base:6.2f}x")


def _blocked_growth(quick: bool, B: int, H: int, D: int) -> None:
    """(d) growth of an attention layer's peak memory from L to 4L, with and without query blocks."""
    L0 = 512 if quick else 1024
    print(
        f"\n(d) attention layer peak memory incl. q, k, v, output, L={L0} -> {4 * L0} (goal blocks: <= 4.5x)"
    )
    for case, label in (("layer_chunked", "skew, query blocks of 128"), ("layer_full", "skew, one block")):
        a, b = _measure(case, L0, B, H, D)["peak_bytes"], _measure(case, 4 * L0, B, H, D)["peak_bytes"]
        growth = "n/a" if not a or b is None else f"{b / a:.2f}x"
        print(f"  {label:<28} {_fmt_mb(a):>9} MB -> {_fmt_mb(b):>9} MB   growth {growth}")


if __name__ == "__main__":  # one memory case per fresh process (see _measure)
    case, *nums = sys.argv[1:]
    print(json.dumps(_memory_case(case, *map(int, nums))))
