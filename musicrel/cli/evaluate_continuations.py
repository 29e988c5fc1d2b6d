"""`musicrel evaluate-continuations`: continue held-out pieces with the model and the baselines and score them
against the truth (musicrel.evaluation.continuations).

Torch is imported inside the handler so that `musicrel --help` stays fast.
"""

from __future__ import annotations

from functools import partial

from musicrel.cli.args import (
    add_held_out_arguments,
    add_sampling_arguments,
    add_weights_argument,
    positive_int,
)
from musicrel.cli.tasks import run_evaluation


def _evaluation():
    from musicrel.evaluation.continuations import EvaluationOptions, evaluate_continuations
    from musicrel.evaluation.report import format_report, write_report

    return EvaluationOptions, evaluate_continuations, format_report, write_report


def _systems(value: str) -> list[str]:
    return [s.strip() for s in value.split(",") if s.strip()]


def register(subparsers) -> None:
    e = subparsers.add_parser(
        "evaluate-continuations",
        help="continue held-out pieces and compare with their true continuations",
        description="For each piece: the first --motif-seconds are the motif, the next --seconds the "
        "reference. The model and the baselines (model without the grammar mask, untrained model, n-gram, "
        "motif repeated, the real music that follows) continue every motif --seeds times; each metric is "
        "printed with its 95%% bootstrap interval over pieces. Options left out take the defaults of "
        "musicrel.evaluation.continuations.evaluate_continuations, and for sampling those of SamplingParams.",
    )
    e.add_argument("--checkpoint", required=True)
    add_weights_argument(e)
    add_held_out_arguments(e, "report.json, metrics.png, pianorolls.png and report.html")
    e.add_argument("--motif-seconds", type=float, default=None)
    e.add_argument("--seconds", type=float, default=None, help="length of the continuation and reference")
    add_sampling_arguments(e, shift_temperature=True)
    e.add_argument(
        "--systems",
        type=_systems,
        default=None,
        help="comma list of model, model-no-grammar, untrained, ngram, repeat-motif, real-music "
        "(default: all), e.g. --systems model for a sampling sweep",
    )
    e.add_argument(
        "--ngram-data",
        default=None,
        help="prepared data folder whose train split the n-gram is fitted on (default: --input when it is "
        "one; otherwise the n-gram is left out and the report says why)",
    )
    e.add_argument("--batch-size", type=positive_int, default=None, help="pieces generated together")
    e.set_defaults(func=partial(run_evaluation, load=_evaluation))
