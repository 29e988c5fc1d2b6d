"""The `musicrel` command. Each subcommand lives in the module that owns its feature and exposes
`register(subparsers)`, which adds its parser and sets `func(args) -> int | None` as the default.

The command sits above the packages it gathers: it imports `training.cli` and `server.cli` by name, in plain
sight (the one place the library reaches up; the library's modules below it never do)."""

from __future__ import annotations

import argparse
import sys

from musicrel.runtime.threads import set_spin_count

set_spin_count()  # before torch starts OpenMP (an explicit GOMP_SPINCOUNT wins)

# Modules are imported for their `register`; they keep heavy imports (torch, lightning) inside handlers
# so that `musicrel --help` stays fast.
import server.cli  # noqa: E402
import training.bench  # noqa: E402
import training.cli  # noqa: E402
from musicrel import bench  # noqa: E402
from musicrel.cli import (  # noqa: E402
    accompany,
    codec,
    evaluate_accompaniments,
    evaluate_continuations,
    evaluate_controls,
    evaluate_infills,
    generate,
    infill,
    sweep_sampling,
)
from musicrel.errors import MusicrelError  # noqa: E402

COMMAND_MODULES = (
    codec,  # encode, decode
    training.cli,  # corpus, prepare, train, finetune, export, pack-gpu, evaluate
    generate,
    evaluate_continuations,
    accompany,
    infill,
    evaluate_infills,
    evaluate_accompaniments,
    evaluate_controls,
    sweep_sampling,
    server.cli,  # serve
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="musicrel", description="Music Transformer: MIDI in, continuation out."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(subparsers)
    # bench codec | attention | generate | shapes | neighbour | serve | reliability, and training's `train`
    bench.register(subparsers, more=(training.bench,))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MusicrelError as exc:
        print(f"musicrel {args.command}: error [{exc.code}]: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # missing file, permission denied, disk full: one line, no traceback
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        print(f"musicrel {args.command}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"musicrel {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
