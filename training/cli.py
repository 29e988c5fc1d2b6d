"""`musicrel corpus | prepare | train | export | evaluate`: the training side of the CLI.

Handlers import numpy/torch/lightning lazily so that `musicrel --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys


def _corpus(args) -> int:
    from training.corpus import REPORT_NAME, export_music21

    report = export_music21(args.out, workers=args.workers, limit=args.limit, progress=not args.quiet)
    print(
        f"music21 corpus: {report['works']} works, {report['exported']} exported, "
        f"{report['existing']} already there, {report['failed']} failed "
        f"({report['seconds']} s); report: {args.out}/{REPORT_NAME}"
    )
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("corpus", help="export a built-in corpus (music21's) to MIDI files")
    p.add_argument("source", choices=["music21"], help="which corpus")
    p.add_argument("--out", required=True, help="output folder (resumes: existing files are skipped)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: CPU count)")
    p.add_argument("--limit", type=int, default=None, help="export only the first N works")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_corpus)

    _register_rest(subparsers)


def _register_rest(subparsers) -> None:
    pass


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(prog="training")
    register(parser.add_subparsers(dest="command", required=True))
    a = parser.parse_args()
    sys.exit(a.func(a))
