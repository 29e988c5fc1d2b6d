"""`musicrel evaluate-accompaniments`: accompany held-out POP909 melodies and compare with the songs' own
piano parts (musicrel.evaluation.accompaniments)."""

from __future__ import annotations

import sys
from pathlib import Path

from musicrel.cli.args import add_weights_argument, positive_int, torch_setup


def _evaluate(args) -> int:
    from musicrel.evaluation.accompaniments import evaluate_accompaniments, format_report, write_report

    torch_setup(args, rows=args.seeds)
    systems = {} if args.systems is None else {"systems": tuple(s.strip() for s in args.systems.split(","))}
    report = evaluate_accompaniments(
        args.checkpoint,
        args.data,
        split=args.split,
        seeds=args.seeds,
        seconds=args.seconds,
        continuation=args.continuation,
        limit=args.limit,
        weights=args.weights,
        progress=None if args.quiet else lambda k, n: print(f"{k}/{n} songs", file=sys.stderr, flush=True),
        **systems,
    )
    print(format_report(report))
    if args.out:
        write_report(report, Path(args.out))
        print(f"wrote {args.out}/report.json, report.txt")
    return 0


def register(subparsers) -> None:
    e = subparsers.add_parser(
        "evaluate-accompaniments",
        help="accompany held-out POP909 melodies and compare with the songs' own piano parts",
        description="Harmony at downbeats against the annotated chords, clashes with the melody on beats, "
        "texture against the real PIANO track; baselines in the same run "
        "(musicrel.evaluation.accompaniments).",
    )
    e.add_argument("--checkpoint", required=True, help="the accompaniment model folder")
    add_weights_argument(e)
    e.add_argument("--data", required=True, help="a folder of `musicrel prepare ... --melody` (POP909)")
    e.add_argument("--split", default="test")
    e.add_argument("--seeds", type=positive_int, default=3)
    e.add_argument("--seconds", type=float, default=30.0, help="length of each song's excerpt")
    e.add_argument("--limit", type=positive_int, default=None, help="at most N songs")
    e.add_argument(
        "--systems", default=None, help="comma list of model, chords, real, rule, continuation (default: all)"
    )
    e.add_argument("--continuation", default=None, help="continuation model folder for that baseline")
    e.add_argument("--out", default=None, help="write report.json and report.txt here")
    e.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    e.add_argument("--quiet", action="store_true")
    e.set_defaults(func=_evaluate)
