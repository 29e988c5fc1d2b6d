"""`musicrel bench ...`: side-by-side measurements printed as tables of ratios (never timed in tests)."""

from __future__ import annotations

import importlib

BENCH_MODULES = (
    "musicrel.bench.codec",
    "musicrel.bench.attention",
    "musicrel.bench.generate",
    "musicrel.bench.shapes",
    "musicrel.bench.neighbour",
    "server.bench",
    "server.probes",
    "training.bench",
)


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="run a benchmark and print a table of ratios")
    bench_sub = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for name in BENCH_MODULES:
        importlib.import_module(name).register(bench_sub)
