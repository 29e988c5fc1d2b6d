"""`musicrel bench train`: one training step (forward, backward, AdamW) of each shape in fp32, bf16 autocast
and torch.compile, at each thread count, measured side by side; the seconds per step are what
`musicrel curves` takes to put runs on one time axis."""

from __future__ import annotations

MODES = ("fp32", "bf16", "compile")


def parse_shape(text: str) -> tuple[int, int]:
    """`LxD` (layers x width) -> (L, D); heads D / 32 and feed-forward 4 D, as in the shipped shapes."""
    from musicrel.errors import ConfigError

    layers, _, width = text.lower().partition("x")
    if not (layers.isdigit() and width.isdigit() and int(layers) > 0 and int(width) % 32 == 0 and int(width)):
        raise ConfigError(
            f"a shape is LAYERSxWIDTH with WIDTH a multiple of 32, got {text!r}", code="bad_shape"
        )
    return int(layers), int(width)


def _step_fn(layers: int, width: int, seq_len: int, batch: int, mode: str, threads: int):
    import torch
    import torch.nn.functional as F

    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import MusicTransformer

    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=391,
        n_layers=layers,
        d_model=width,
        n_heads=width // 32,
        d_ff=4 * width,
        max_seq_len=seq_len,
    )
    model = MusicTransformer(cfg).train()
    run = torch.compile(model) if mode == "compile" else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 388, (batch, seq_len))
    y = torch.randint(0, 388, (batch, seq_len))

    def step() -> None:
        torch.set_num_threads(threads)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode != "fp32"):
            logits = run(x)
        F.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), y.reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, sum(p.numel() for p in model.parameters())


def run(args) -> int:
    from musicrel.bench.timing import cpu_name, medians, side_by_side

    shapes = [parse_shape(s) for s in args.shapes.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    threads = sorted({int(t) for t in args.threads.split(",")})
    fns, params = {}, {}
    for layers, width in shapes:
        for mode in modes:
            for t in threads:
                fns[(layers, width, mode, t)], params[(layers, width)] = _step_fn(
                    layers, width, args.seq_len, args.batch_size, mode, t
                )
    print(
        f"one step of {args.batch_size} x {args.seq_len} tokens; {cpu_name()}; median of "
        f"{args.repeats} interleaved repetitions"
    )
    secs = medians(side_by_side(fns, args.repeats, alternate=True))
    print(
        f"{'shape':>8s} {'params':>8s} {'mode':>8s} {'threads':>7s} {'s/step':>8s} {'tokens/s':>9s} "
        f"{'vs fp32, 1st thread count':>26s}"
    )
    for (layers, width, mode, t), s in secs.items():
        base = secs.get((layers, width, "fp32", threads[0]))
        ratio = f"{base / s:.2f}x" if base else ""
        print(
            f"{layers}x{width:<6d} {params[(layers, width)] / 1e6:7.2f}M {mode:>8s} {t:>7d} {s:8.3f} "
            f"{args.batch_size * args.seq_len / s:9.0f} {ratio:>26s}"
        )
    return 0


def register(bench_sub) -> None:
    p = bench_sub.add_parser(
        "train",
        help="training step time per shape: fp32 vs bf16 autocast vs torch.compile, per thread count",
        description="Times forward + backward + AdamW of random batches for each shape, precision mode and "
        "thread count, interleaved so that a shared machine's drift hits all alike.",
    )
    p.add_argument("--shapes", default="3x192", help="comma list of LAYERSxWIDTH (default: %(default)s)")
    p.add_argument("--modes", default=",".join(MODES), help="comma list of fp32, bf16, compile")
    p.add_argument(
        "--threads", default="1,2", help="comma list of torch thread counts (default: %(default)s)"
    )
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.set_defaults(func=run)
