"""`musicrel evaluate-infills`: cut gaps in held-out pieces, fill them with the infill model and the
baselines, and score them against the true gaps (musicrel.evaluation.infills; docs/INFILL.md, Evidence).

Torch is imported inside the handler so that `musicrel --help` stays fast.
"""

from __future__ import annotations

from musicrel.cli.args import add_weights_argument, given, positive_int, torch_setup


def _evaluate(args) -> int:
    torch_setup(args, rows=1)  # every sample is decoded alone: the speed is batch 1's
    from musicrel.evaluation.gaps import InfillEvaluationOptions
    from musicrel.evaluation.infill_report import format_infill_report, write_infill_report
    from musicrel.evaluation.infills import DEFAULT_CHECKPOINT, evaluate_infills

    # Options left out are not passed: their defaults live in InfillEvaluationOptions and SamplingParams.
    options = given(
        args,
        "gap_seconds",
        "cuts",
        "seeds",
        "seed",
        "limit",
        "split",
        "source",
        "temperature",
        "top_k",
        "top_p",
        "weights",
    )
    options = InfillEvaluationOptions(**options)
    checkpoint = args.checkpoint or DEFAULT_CHECKPOINT
    report = evaluate_infills(checkpoint, args.input, options, progress=not args.quiet)
    print(format_infill_report(report))
    if args.out:
        paths = write_infill_report(report, args.out)
        print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


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
    e.add_argument("--checkpoint", default=None, help="an infill model (default: checkpoints/infill)")
    add_weights_argument(e)
    e.add_argument(
        "--input",
        required=True,
        help="folder of held-out MIDI files, or a prepared data folder (manifest.json)",
    )
    e.add_argument("--split", default=None, help="split of a prepared data folder (a comma list: test,val)")
    e.add_argument("--source", default=None, help="only this source's pieces of a multi-source folder")
    e.add_argument(
        "--gap-seconds", default=None, help="a gap's length in seconds, drawn in a range: 4,8 (default)"
    )
    e.add_argument("--cuts", type=int, default=None, help="gaps per piece (default 3)")
    e.add_argument("--seeds", type=int, default=None, help="fills per gap and system (default 3)")
    e.add_argument("--seed", type=int, default=None, help="base seed (the gaps' places and every sample's)")
    e.add_argument("--limit", type=int, default=None, help="use at most N pieces")
    e.add_argument("--temperature", type=float, default=None, help="the model's sampling temperature")
    e.add_argument("--top-k", type=int, default=None, help="the model's top-k")
    e.add_argument("--top-p", type=float, default=None, help="the model's nucleus mass")
    e.add_argument("--out", default=None, help="write report.json and report.html (piano rolls, audio) here")
    e.add_argument(
        "--threads", type=positive_int, default=None, help="torch CPU threads (default: the CPUs left free)"
    )
    e.add_argument("--quiet", action="store_true")
    e.set_defaults(func=_evaluate)
