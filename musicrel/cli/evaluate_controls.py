"""`musicrel evaluate-controls`: does each control hold on held-out motifs? (The control flags themselves are
in args.py: `musicrel generate` reads them too.)"""

from __future__ import annotations

import sys
from pathlib import Path

from musicrel.cli.args import add_weights_argument


def _evaluate_controls(args) -> int:
    from musicrel.evaluation.control_evidence import evaluate_controls, format_checks
    from musicrel.evaluation.pieces import held_out_files, load_pieces
    from musicrel.model.checkpoint import load_codec, load_model
    from musicrel.runtime.threads import set_torch_threads

    if args.threads:
        set_torch_threads(args.threads)
    model = load_model(args.checkpoint, device=args.device, weights=args.weights)
    codec = load_codec(args.checkpoint)
    files = held_out_files(Path(args.input), args.split)
    pieces, skipped = load_pieces(model, codec, files, args.motif_seconds, args.seconds, args.limit)
    if not pieces:
        print(
            f"musicrel evaluate-controls: no usable piece in {args.input} (skipped: {skipped})",
            file=sys.stderr,
        )
        return 2
    checks = evaluate_controls(
        model, codec, [p.primer for p in pieces], args.seconds, args.samples, args.seed, args.batch_size
    )
    print(
        f"{len(pieces)} held-out motifs ({args.motif_seconds:g} s) x {args.samples} samples, continuation "
        f"{args.seconds:g} s, seed {args.seed}; skipped: {skipped or 'none'}"
    )
    print(format_checks(checks))
    return 0 if all(c.ok for c in checks) else 1


def register(subparsers) -> None:
    e = subparsers.add_parser(
        "evaluate-controls",
        help="measure whether key, chords, density and range controls hold on held-out motifs",
        description="Continue held-out motifs under each control (key only/prefer in the motif's key, a "
        "I-V-vi-IV progression, density 3 and 8 notes/s, range 48-72 with 3 voices) and print the measured "
        "figure beside its target and beside the same figure with no control. Exit 1 if a target is missed.",
    )
    e.add_argument("--checkpoint", required=True)
    add_weights_argument(e)
    e.add_argument("--input", required=True, help="a prepared data folder (its --split) or a folder of MIDI")
    e.add_argument("--split", default="test")
    e.add_argument("--limit", type=int, default=10, help="motifs (10)")
    e.add_argument("--motif-seconds", type=float, default=10.0)
    e.add_argument("--seconds", type=float, default=20.0, help="continuation length (20)")
    e.add_argument("--samples", type=int, default=2, help="continuations per motif and control (2)")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument(
        "--batch-size", type=int, default=4, help="motifs decoded together (x 7 controls x samples)"
    )
    e.add_argument("--device", default="cpu")
    e.add_argument("--threads", type=int, default=None)
    e.set_defaults(func=_evaluate_controls)
