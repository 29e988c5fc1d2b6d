"""`musicrel evaluate-accompaniments`: accompany held-out POP909 melodies and compare with the songs' own
piano parts (musicrel.evaluation.accompaniments)."""

from __future__ import annotations

import sys
from functools import partial

from musicrel.cli.args import add_run_arguments, add_weights_argument, positive_int
from musicrel.cli.tasks import run_evaluation


def _evaluation():
    from dataclasses import asdict

    from musicrel.evaluation.accompaniments import (
        AccompanimentEvaluationOptions,
        evaluate_accompaniments,
        format_report,
        write_report,
    )

    def evaluate(checkpoint, data, options, progress: bool) -> dict:
        said = (lambda k, n: print(f"{k}/{n} songs", file=sys.stderr, flush=True)) if progress else None
        return evaluate_accompaniments(checkpoint, data, progress=said, **asdict(options))

    return AccompanimentEvaluationOptions, evaluate, format_report, write_report


def _systems(value: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in value.split(","))


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
    e.add_argument(
        "--data",
        dest="input",  # the evaluations' one flow reads args.input
        metavar="DATA",
        required=True,
        help="a folder of `musicrel prepare ... --melody` (POP909)",
    )
    e.add_argument("--split", default=None, help="split of the folder (default: test)")
    e.add_argument("--seeds", type=positive_int, default=None, help="samples per song and system (3)")
    e.add_argument("--seconds", type=float, default=None, help="length of each song's excerpt (30)")
    e.add_argument("--limit", type=positive_int, default=None, help="at most N songs")
    e.add_argument(
        "--systems",
        type=_systems,
        default=None,
        help="comma list of model, chords, real, rule, continuation (default: all)",
    )
    e.add_argument("--continuation", default=None, help="continuation model folder for that baseline")
    e.add_argument("--out", default=None, help="write report.json and report.txt here")
    add_run_arguments(e)
    e.set_defaults(func=partial(run_evaluation, load=_evaluation, rows=lambda options: options.seeds))
