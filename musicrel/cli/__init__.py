"""The `musicrel` command. Each subcommand lives in the module that owns its feature and exposes
`register(subparsers)`, which adds its parser and sets `func(args) -> int | None` as the default."""

from __future__ import annotations

import argparse
import importlib
import sys

from musicrel.threads import set_spin_count

set_spin_count()  # before torch starts OpenMP (an explicit GOMP_SPINCOUNT wins)

from musicrel.errors import MusicrelError  # noqa: E402

# Modules are imported for their `register`; they keep heavy imports (torch, lightning) inside handlers
# so that `musicrel --help` stays fast.
COMMAND_MODULES = (
    "musicrel.cli.codec",  # encode, decode
    "training.cli",  # corpus, prepare, train, finetune, export, pack-gpu, evaluate
    "musicrel.cli.generate",
    "musicrel.cli.evaluate_continuations",
    "musicrel.cli.accompany",
    "musicrel.cli.evaluate_accompaniments",
    "musicrel.cli.evaluate_controls",
    "musicrel.cli.sweep_sampling",
    "server.cli",  # serve
    "musicrel.bench",  # bench codec | attention | generate
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="musicrel", description="Music Transformer: MIDI in, continuation out."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
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
