"""`musicrel sweep-sampling`: the sampling defaults chosen by measurement (see musicrel.evaluation.sweep)."""

from __future__ import annotations

import argparse

from musicrel.cli.args import add_run_arguments, given, positive_int, torch_setup


def _floats(value: str) -> list[float]:
    try:
        return [float(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {value!r}") from None


def _top_ks(value: str) -> list[int | None]:
    out: list[int | None] = []
    for v in (v.strip() for v in value.split(",") if v.strip()):
        if v in ("none", "-"):
            out.append(None)
        elif v.isdigit() and int(v) >= 1:
            out.append(int(v))
        else:
            raise argparse.ArgumentTypeError(f"top-k values are integers >= 1 or 'none', got {v!r}")
    return out


def _sweep(args) -> int:
    import json
    from pathlib import Path

    from musicrel.evaluation.sweep import choose_across, format_sweep, sweep_sampling, write_sweep

    torch_setup(args)
    options = given(
        args,
        "temperatures",
        "top_ps",
        "top_ks",
        "shift_temperatures",
        "split",
        "limit",
        "seeds",
        "motif_seconds",
        "seconds",
        "batch_size",
    )
    sources = [s.strip() for s in args.source.split(",") if s.strip()] if args.source else [None]
    sweeps = []
    for source in sources:
        sweep = sweep_sampling(args.checkpoint, args.input, progress=not args.quiet, source=source, **options)
        sweeps.append(sweep)
        if source is not None:
            print(f"source {source}")
        print(format_sweep(sweep))
        if args.out:
            out = Path(args.out) if len(sources) == 1 else Path(args.out) / str(source)
            paths = write_sweep(sweep, out)
            print("wrote " + ", ".join(str(p) for p in paths.values()))
    if len(sweeps) > 1:
        choice = choose_across(sweeps)
        where = ", ".join(map(str, sources))
        print(f"across {where}: recommended {choice['recommended']} ({choice['reason']})")
        if args.out:
            path = Path(args.out) / "choice.json"
            path.write_text(json.dumps({"sources": sources, **choice}, indent=1) + "\n")
            print(f"wrote {path}")
    return 0


def register(subparsers) -> None:
    s = subparsers.add_parser(
        "sweep-sampling",
        help="evaluate-continuations over a grid of temperature x top-p x top-k; recommends defaults",
        description="Continue the same held-out pieces with every setting of the grid (and the current "
        "defaults), score each piece by its mean histogram overlap with the truth, and recommend the best "
        "setting whose density ratio is in 0.8-1.25 and that drones no more than the truth, only if it beats "
        "the defaults piece by piece beyond the 95%% interval (per --source, then across them). Options left "
        "out take musicrel.evaluation.sweep.sweep_sampling's defaults.",
    )
    s.add_argument("--checkpoint", required=True)
    s.add_argument("--input", required=True, help="a prepared data folder (or a folder of MIDI files)")
    s.add_argument("--split", default=None, help="split of a prepared folder (default: val)")
    s.add_argument(
        "--source",
        default=None,
        help="a source of a multi-source prepared folder, or a comma list: one sweep per source (never "
        "averaged) in --out/SOURCE, and the one setting eligible in all of them in --out/choice.json",
    )
    s.add_argument("--temperatures", type=_floats, default=None, help="e.g. 0.8,0.9,1.0,1.1")
    s.add_argument("--top-ps", type=_floats, default=None, help="e.g. 0.9,0.95,1.0")
    s.add_argument("--top-ks", type=_top_ks, default=None, help="e.g. none,20")
    s.add_argument(
        "--shift-temperatures", type=_floats, default=None, help="within the time shifts alone, e.g. 1,1.2"
    )
    s.add_argument("--motif-seconds", type=float, default=None)
    s.add_argument("--seconds", type=float, default=None, help="length of the continuation and reference")
    s.add_argument("--limit", type=positive_int, default=None, help="use at most N pieces")
    s.add_argument("--seeds", type=positive_int, default=None, help="continuations per piece and setting")
    s.add_argument("--batch-size", type=positive_int, default=None, help="pieces generated together")
    s.add_argument("--out", default=None, help="write sweep.json and sweep.png here")
    add_run_arguments(s)
    s.set_defaults(func=_sweep)
