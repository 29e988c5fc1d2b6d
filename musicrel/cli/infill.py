"""`musicrel infill`: regenerate seconds START to END (or bars A to B) of a MIDI file or of each in a folder,
keep the rest.

Torch is imported inside the handler so that `musicrel --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from musicrel.cli.args import (
    add_control_arguments,
    add_weights_argument,
    controls_from_args,
    given,
    output_paths,
    positive_int,
    torch_setup,
    write_midi,
)
from musicrel.midi.files import find_midi_files

SUMMARY_FILE = "summary.json"


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


def _refuse(message: str) -> int:
    print(f"musicrel infill: {message}", file=sys.stderr)
    return 2


def _infill(args) -> int:
    from musicrel.errors import MusicrelError
    from musicrel.generation.infill import (
        InfillParams,
        bar_span,
        check_bars,
        check_model,
        check_span,
        infill,
    )
    from musicrel.generation.sampling import SEED_RANGE
    from musicrel.model.checkpoint import load_codec, load_model

    seconds = args.start is not None or args.end is not None
    if args.bars is None and (args.start is None or args.end is None):
        return _refuse("give the span as --start and --end (seconds) or as --bars A-B")
    if args.bars is not None and seconds:
        return _refuse("give the span in seconds (--start, --end) or in bars (--bars), not both")
    # a bad span is every file's: one error, exit 2
    if args.bars is None:
        start, end = check_span(args.start, args.end)
    else:
        check_bars(*args.bars)
    params = InfillParams(
        **given(args, "temperature", "top_k", "top_p", "seed", "num_samples"),
        controls=controls_from_args(args),
    )
    root, out = Path(args.input), Path(args.out)
    files = find_midi_files(root)
    if not files:
        print(f"musicrel infill: no .mid/.midi file in {root}", file=sys.stderr)
        return 2
    torch_setup(args, rows=params.num_samples)
    model, codec = load_model(args.checkpoint, weights=args.weights), load_codec(args.checkpoint)
    check_model(model, codec)
    records, failed = [], 0
    for i, path in enumerate(files):
        paths = output_paths(path, root, out, params.num_samples)
        record = {"input": str(path), "outputs": [str(p) for p in paths]}
        if args.bars is None:
            record.update(start=start, end=end)
        else:
            record["bars"] = list(args.bars)
        if all(p.is_file() for p in paths):
            record["skipped"] = "outputs exist"
            records.append(record)
            continue
        seed = None if params.seed is None else (params.seed + i) % SEED_RANGE
        try:
            if args.bars is not None:  # each file's bars at its own tempo and time signatures
                start, end = check_span(*bar_span(codec.read(path), *args.bars))
                record.update(start=round(start, 6), end=round(end, 6))
            result = infill(
                model, path, start, end, codec=codec, params=InfillParams(**{**vars(params), "seed": seed})
            )
        except MusicrelError as exc:
            record["error"] = {"code": exc.code, "message": str(exc)}
            failed += 1
            print(f"musicrel infill: {path}: error [{exc.code}]: {exc}", file=sys.stderr)
            records.append(record)
            continue
        for pm, p in zip(result.midis, paths, strict=True):
            write_midi(pm, p)
        record.update(
            seed=result.seed,
            removed=result.removed,
            notes=[len(n) for n in result.notes],
            prompt_tokens=result.prompt_tokens,
            decode_seconds=round(result.decode_seconds, 3),
            controls=result.controls,
            warnings=result.warnings,
        )
        records.append(record)
        if not args.quiet:
            print(f"{path} -> {', '.join(map(str, paths))}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    (out / SUMMARY_FILE).write_text(json.dumps({"files": records}, indent=1))
    done = len(files) - failed
    span = f"{start:g}-{end:g} s" if args.bars is None else "bars {}-{}".format(*args.bars)
    print(f"filled {span} in {done} of {len(files)} files; summary: {out / SUMMARY_FILE}")
    return 1 if failed == len(files) else 0


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
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--num-samples", type=positive_int, default=None, help="versions per file (1)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (file i uses seed + i)")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    p.add_argument("--quiet", action="store_true")
    add_control_arguments(p, "the new notes", "the music around the span", program=False)
    p.set_defaults(func=_infill)
