"""`musicrel accompany`: accompany every melody of a file or folder.

Torch is imported inside the handlers so that `musicrel --help` stays fast.
"""

from __future__ import annotations

from musicrel.cli.args import (
    add_control_arguments,
    add_instruments_checkpoint_argument,
    add_run_arguments,
    add_sample_arguments,
    add_sampling_arguments,
    add_weights_argument,
)
from musicrel.cli.tasks import FileTask, run_files


def _accompany(args) -> int:
    from musicrel.generation.accompaniment import AccompanimentParams, accompany_midi
    from musicrel.midi.instruments import asked_instruments

    def run(model, codec, melody, params, record):
        return accompany_midi(model, codec, melody, track=args.track, params=params)

    def fields(result) -> dict:
        return {"melody_track": result.melody_track, "seconds": round(result.seconds, 3)}

    def done(n: int, total: int) -> str:
        return f"accompanied {n} of {total} melodies"

    def route(codec, path, params) -> bool:
        # as the server routes an accompaniment: instruments named, which a piano accompaniment cannot write
        return asked_instruments(params.controls) is True

    return run_files(args, FileTask(AccompanimentParams, run, fields, done, route=route))


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "accompany",
        help="write an accompaniment for every melody of a MIDI file or folder",
        description="For each .mid/.midi of --input (recursive): the melody track (--track, or the "
        "file's only track with notes) is kept unchanged and an accompaniment is written on a track of its "
        "own (with a model whose codec has instruments, a track per instrument it writes; --instruments "
        "chooses them), <name>.sample<i>.mid under --out, with summary.json. Outputs that exist are skipped.",
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help="an accompaniment model folder (checkpoints/accompany), or a model with instruments",
    )
    add_instruments_checkpoint_argument(
        p, "the melodies whose --instruments name instruments (a piano accompaniment model writes one stream)"
    )
    add_weights_argument(p)
    p.add_argument("--input", required=True, help="a MIDI file or a folder of them")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--track", type=int, default=None, help="instrument index of the melody")
    add_sample_arguments(p, "accompaniments per melody (1)")
    add_sampling_arguments(p)
    add_run_arguments(p)
    add_control_arguments(p, "the accompaniment", "the melody")
    p.set_defaults(func=_accompany)
