"""`musicrel bench ...`: side-by-side measurements printed as tables of ratios (never timed in tests).

`serve`, `listeners` and `reliability` (with loadgen and genfuzz) measure the service from outside: they start
`uvicorn server.app:app` as a process and talk HTTP to it, never importing `server`. Benches of packages above
the library (training's `bench train`) are handed in by the `musicrel` command, which imports them."""

from __future__ import annotations

from types import ModuleType

from musicrel.bench import attention, codec, generate, gpucheck, listeners, neighbour, probes, serve, shapes

BENCH_MODULES = (codec, attention, generate, shapes, neighbour, serve, listeners, gpucheck, probes)


def register(subparsers, more: tuple[ModuleType, ...] = ()) -> None:
    """`musicrel bench`, with the library's benches and `more` (modules with their own `register`)."""
    parser = subparsers.add_parser("bench", help="run a benchmark and print a table of ratios")
    bench_sub = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for module in (*BENCH_MODULES, *more):
        module.register(bench_sub)
