"""`python -m musicrel.bench BENCH ...`: the library's benches without the `musicrel` command, which imports
the server's and training's commands and everything they import: a bare GPU machine runs the device check
this way (scripts/gpu-check.sh), with only the service's packages added."""

from __future__ import annotations

import argparse
import sys

from musicrel.bench import BENCH_MODULES
from musicrel.errors import MusicrelError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m musicrel.bench")
    bench_sub = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for module in BENCH_MODULES:
        module.register(bench_sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MusicrelError as exc:  # one line, as the `musicrel` command prints it
        print(f"musicrel bench {args.bench}: error [{exc.code}]: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
