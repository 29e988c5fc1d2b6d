"""`musicrel evaluate-infills`: cut gaps in held-out pieces, fill them with the infill model and the
baselines, and score them against the true gaps (musicrel.evaluation.infills; docs/INFILL.md, Evidence).

Torch is imported inside the handler so that `musicrel --help` stays fast.
"""

from __future__ import annotations

from functools import partial

from musicrel.cli.args import (
    add_held_out_arguments,
    add_sampling_arguments,
    add_weights_argument,
)
from musicrel.cli.tasks import run_evaluation

DEFAULT_CHECKPOINT = "checkpoints/infill"


def _evaluation():
    from musicrel.evaluation.gaps import InfillEvaluationOptions
    from musicrel.evaluation.infill_report import format_infill_report, write_infill_report
    from musicrel.evaluation.infills import evaluate_infills

    return InfillEvaluationOptions, evaluate_infills, format_infill_report, write_infill_report


def register(subparsers) -> None:
    e = subparsers.add_parser(
        "evaluate-infills",
        help="cut gaps in held-out pieces, fill them, compare with the true gaps",
        description="Gaps of --gap-seconds are cut at --cuts places per piece (from --seed). The infill "
        "model, the same checkpoint continuing the music before the gap (blind to what follows) and the "
        "stretch before the gap copied into it fill every gap --seeds times; each is scored against the "
        "true gap, the true gap's NLL is read with and without the music after it, and the decoding speed at "
        "batch 1 on the CPU is reported. Figures per source with 95%% bootstrap intervals over pieces.",
    )
    e.add_argument(
        "--checkpoint", default=DEFAULT_CHECKPOINT, help=f"an infill model (default: {DEFAULT_CHECKPOINT})"
    )
    add_weights_argument(e)
    add_held_out_arguments(e, "report.json and report.html (piano rolls, audio)")
    e.add_argument(
        "--gap-seconds", default=None, help="a gap's length in seconds, drawn in a range: 4,8 (default)"
    )
    e.add_argument("--cuts", type=int, default=None, help="gaps per piece (default 3)")
    add_sampling_arguments(e)
    # every sample is decoded alone: the speed is batch 1's
    e.set_defaults(func=partial(run_evaluation, load=_evaluation, rows=lambda options: 1))
