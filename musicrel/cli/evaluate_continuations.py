"""`musicrel evaluate-continuations`: continue held-out pieces with the model and the baselines and score them
against the truth (musicrel.evaluation.continuations).

Torch is imported inside the handler so that `musicrel --help` stays fast.
"""

from __future__ import annotations

from musicrel.cli.args import add_weights_argument, given, positive_int, torch_setup


def _evaluate(args) -> int:
    torch_setup(args)
    from musicrel.evaluation.continuations import EvaluationOptions, evaluate_continuations
    from musicrel.evaluation.report import format_report, write_report

    # Options left out are not passed: their defaults live in EvaluationOptions and SamplingParams.
    options = given(
        args,
        "motif_seconds",
        "seconds",
        "limit",
        "seed",
        "seeds",
        "batch_size",
        "split",
        "temperature",
        "top_k",
        "top_p",
        "shift_temperature",
        "systems",
        "ngram_data",
        "source",
        "weights",
    )
    options = EvaluationOptions(**options)
    report = evaluate_continuations(args.checkpoint, args.input, options, progress=not args.quiet)
    print(format_report(report))
    if args.out:
        paths = write_report(report, args.out)
        print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


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
    e.add_argument(
        "--input",
        required=True,
        help="folder of held-out MIDI files, or a prepared data folder (manifest.json)",
    )
    e.add_argument("--split", default=None, help="split of a prepared data folder (a comma list: test,val)")
    e.add_argument("--source", default=None, help="only this source's pieces of a multi-source folder")
    e.add_argument("--motif-seconds", type=float, default=None)
    e.add_argument("--seconds", type=float, default=None, help="length of the continuation and reference")
    e.add_argument("--limit", type=positive_int, default=None, help="use at most N pieces")
    e.add_argument("--seeds", type=positive_int, default=None, help="continuations per piece and system")
    e.add_argument("--seed", type=int, default=None, help="base seed (each piece and sample derive theirs)")
    e.add_argument("--temperature", type=float, default=None, help="the model's sampling temperature")
    e.add_argument("--top-k", type=positive_int, default=None, help="the model's top-k")
    e.add_argument("--top-p", type=float, default=None, help="the model's nucleus mass")
    e.add_argument(
        "--shift-temperature", type=float, default=None, help="the temperature within the time shifts alone"
    )
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
    e.add_argument("--out", default=None, help="write report.json, metrics.png and pianorolls.png here")
    e.add_argument(
        "--threads", type=positive_int, default=None, help="torch CPU threads (default: the CPUs left free)"
    )
    e.add_argument("--quiet", action="store_true")
    e.set_defaults(func=_evaluate)
