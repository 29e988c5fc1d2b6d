"""`musicrel infill`: regenerate seconds START to END (or bars A to B) of a MIDI file or of each in a folder,
keep the rest.

Torch is imported inside the handler so that `musicrel --help` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from musicrel.cli.args import (
    FLATTENED,
    add_control_arguments,
    add_instruments_checkpoint_argument,
    add_run_arguments,
    add_sample_arguments,
    add_sampling_arguments,
    add_weights_argument,
)
from musicrel.cli.tasks import FileTask, run_files


def _bars(text: str) -> tuple[int, int]:
    """--bars A-B (or a single bar A) as (A, B); the order and the file's bar count are checked later."""
    first, _, last = text.partition("-")
    try:
        bars = int(first), int(last or first)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected bars as A-B (e.g. 5-8) or A, got {text!r}") from None
    if min(bars) < 1:
        raise argparse.ArgumentTypeError(f"bars count from 1, got {text!r}")
    return bars


def _tracks(text: str) -> tuple[int, ...]:
    """--tracks 2 or 0,2: instrument indices as pretty_midi counts them (each file says if it has them)."""
    try:
        tracks = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected instrument indices such as 2 or 0,2, got {text!r}"
        ) from None
    if min(tracks) < 0:
        raise argparse.ArgumentTypeError(f"instrument indices count from 0, got {text!r}")
    return tracks


def _refuse(message: str) -> int:
    print(f"musicrel infill: {message}", file=sys.stderr)
    return 2


def _infill(args) -> int:
    from musicrel.generation.infill import (
        InfillParams,
        InfillResult,
        bar_span,
        check_bars,
        check_model,
        check_span,
        infill,
    )
    from musicrel.midi.instruments import asked_instruments, wants_instruments

    seconds = args.start is not None or args.end is not None
    if args.bars is None and (args.start is None or args.end is None):
        return _refuse("give the span as --start and --end (seconds) or as --bars A-B")
    if args.bars is not None and seconds:
        return _refuse("give the span in seconds (--start, --end) or in bars (--bars), not both")
    # a bad span is every file's: one error, exit 2
    if args.bars is None:
        start, end = check_span(args.start, args.end)
        span, record = f"{start:g}-{end:g} s", {"start": start, "end": end}
    else:
        check_bars(*args.bars)
        span, record = "bars {}-{}".format(*args.bars), {"bars": list(args.bars)}

    def run(model, codec, path, params, record):
        if args.tracks is not None:  # each file says whether it has these tracks (no_such_track)
            params = dataclasses.replace(params, tracks=args.tracks)
        if args.bars is None:
            return infill(model, path, start, end, codec=codec, params=params)
        # each file's bars at its own tempo and time signatures
        a, b = check_span(*bar_span(codec.read(path), *args.bars))
        record.update(start=round(a, 6), end=round(b, 6))
        return infill(model, path, a, b, codec=codec, params=params)

    def fields(result) -> dict:
        return {
            "removed": result.removed,
            "prompt_tokens": result.prompt_tokens,
            "tracks": result.tracks,
            "new_notes_by_track": [
                {str(t): where.count(t) for t in sorted(set(where))} for where in result.note_tracks
            ],
        }

    def done(n: int, total: int) -> str:
        return f"filled {span} in {n} of {total} files"

    def route(codec, path, params) -> bool:
        # as the server routes an upload: every track heard, the controls' instruments asked for
        return wants_instruments(codec.read(path), asked=asked_instruments(params.controls))

    # each sample's file: the input's own bytes, edited
    task = FileTask(InfillParams, run, fields, done, check_model, record, route, files=InfillResult.files)
    return run_files(args, task)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "infill",
        help="regenerate seconds START to END (or bars A-B) of a MIDI file (or of each in a folder), keeping "
        "the rest",
        description="For each .mid/.midi of INPUT (recursive): the notes that start in [START, END) (or in "
        "bars A to B, by each file's tempo and time signatures) are "
        "written anew by an infill model (one trained with data.infill_rate: docs/INFILL.md), which hears "
        "the music before and after the span; every other note comes back unchanged. Writes "
        "<name>.sample<i>.mid under --out, with summary.json. Outputs that exist are skipped.",
    )
    p.add_argument("input", help="a MIDI file or a folder of them")
    p.add_argument("--checkpoint", required=True, help="an infill model folder")
    add_instruments_checkpoint_argument(p, f"the files {FLATTENED}")
    add_weights_argument(p)
    p.add_argument("--start", type=float, default=None, help="start of the span, seconds")
    p.add_argument("--end", type=float, default=None, help="end of the span, seconds (at most 30 s later)")
    p.add_argument(
        "--bars",
        type=_bars,
        default=None,
        metavar="A-B",
        help="the span as bars instead: from the start of bar A to the end of bar B (counted from 1)",
    )
    p.add_argument(
        "--tracks",
        type=_tracks,
        default=None,
        metavar="I,J",
        help="regenerate only these tracks (instrument indices as pretty_midi counts them, e.g. 2 or 0,2) "
        "and keep every other note exactly; default: every track the model reads",
    )
    p.add_argument("--out", required=True, help="output folder")
    add_sample_arguments(p, "versions per file (1)")
    add_sampling_arguments(p)
    add_run_arguments(p)
    add_control_arguments(p, "the new notes", "the music around the span", program=False)
    p.set_defaults(func=_infill)
