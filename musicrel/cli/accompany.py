"""`musicrel accompany`: accompany every melody of a file or folder.

Torch is imported inside the handlers so that `musicrel --help` stays fast.
"""

from __future__ import annotations

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


def _accompany(args) -> int:
    from musicrel.errors import MusicrelError
    from musicrel.generation.accompaniment import AccompanimentParams, accompany_midi
    from musicrel.generation.sampling import SEED_RANGE
    from musicrel.model.checkpoint import load_codec, load_model

    params = AccompanimentParams(
        **given(args, "temperature", "top_k", "top_p", "seed", "num_samples"),
        controls=controls_from_args(args),
    )
    root, out = Path(args.input), Path(args.out)
    files = find_midi_files(root)
    if not files:
        print(f"musicrel accompany: no .mid/.midi file in {root}", file=sys.stderr)
        return 2
    torch_setup(args, rows=params.num_samples)
    model, codec = load_model(args.checkpoint, weights=args.weights), load_codec(args.checkpoint)
    records, failed = [], 0
    for i, melody in enumerate(files):
        paths = output_paths(melody, root, out, params.num_samples)
        record = {"input": str(melody), "outputs": [str(p) for p in paths]}
        if all(p.is_file() for p in paths):
            record["skipped"] = "outputs exist"
            records.append(record)
            continue
        try:
            seed = None if params.seed is None else (params.seed + i) % SEED_RANGE
            result = accompany_midi(
                model,
                codec,
                melody,
                track=args.track,
                params=AccompanimentParams(**{**vars(params), "seed": seed}),
            )
        except MusicrelError as exc:
            record["error"] = {"code": exc.code, "message": str(exc)}
            failed += 1
            if not args.quiet:
                print(f"musicrel accompany: {melody}: error [{exc.code}]: {exc}", file=sys.stderr)
            records.append(record)
            continue
        for pm, path in zip(result.midis, paths, strict=True):
            write_midi(pm, path)
        record.update(
            seed=result.seed,
            melody_track=result.melody_track,
            seconds=round(result.seconds, 3),
            notes=[len(n) for n in result.notes],
            decode_seconds=round(result.decode_seconds, 3),
            controls=result.controls,
            warnings=result.warnings,
        )
        records.append(record)
        if not args.quiet:
            print(f"{melody} -> {', '.join(map(str, paths))}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    (out / SUMMARY_FILE).write_text(json.dumps({"files": records}, indent=1))
    print(f"accompanied {len(files) - failed} of {len(files)} melodies; summary: {out / SUMMARY_FILE}")
    return 1 if failed == len(files) else 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "accompany",
        help="write an accompaniment for every melody of a MIDI file or folder",
        description="For each .mid/.midi of --input (recursive): the melody track (--track, or the "
        "file's only track with notes) is kept unchanged and an accompaniment is written on a track of its "
        "own, <name>.sample<i>.mid under --out, with summary.json. Outputs that exist are skipped.",
    )
    p.add_argument(
        "--checkpoint", required=True, help="an accompaniment model folder (checkpoints/accompany)"
    )
    add_weights_argument(p)
    p.add_argument("--input", required=True, help="a MIDI file or a folder of them")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--track", type=int, default=None, help="instrument index of the melody")
    p.add_argument("--num-samples", type=positive_int, default=None, help="accompaniments per melody (1)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (file i uses seed + i)")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    p.add_argument("--quiet", action="store_true")
    add_control_arguments(p, "the accompaniment", "the melody")
    p.set_defaults(func=_accompany)
