"""`musicrel bench ...`: side-by-side measurements printed as tables of ratios (never timed in tests).

`serve` and `reliability` (with loadgen and genfuzz) measure the service from outside: they start
`uvicorn server.app:app` as a process and talk HTTP to it, never importing `server`. `bench train` is
training's own, imported by name here in plain sight."""

from __future__ import annotations

import training.bench
from musicrel.bench import attention, codec, generate, neighbour, probes, serve, shapes

BENCH_MODULES = (codec, attention, generate, shapes, neighbour, serve, probes, training.bench)


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="run a benchmark and print a table of ratios")
    bench_sub = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for module in BENCH_MODULES:
        module.register(bench_sub)
