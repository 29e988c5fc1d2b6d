"""What several `musicrel` subcommands share: `given` (the options a user gave), `positive_int`, the sampling
flags (`add_sampling_arguments`, `add_sample_arguments`) and the control flags (`add_control_arguments`),
the library's parameters they make (`params_options`), the held-out input of the evaluations
(`add_held_out_arguments`), the run's (`add_run_arguments`, `torch_setup`: threads) and where and how outputs
are written (`output_paths`, `write_midi`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def given(args, *names: str) -> dict:
    """The options among `names` that were given (not None): those left out are not passed, so their defaults
    stay in the function called."""
    return {name: value for name in names if (value := getattr(args, name, None)) is not None}


CONTROL_FLAGS = ("program", "key", "key_strength", "chords", "chord_strength", "density", "low_note",
                 "high_note", "max_polyphony", "instruments")  # fmt: skip


def add_control_arguments(p, what: str = "the continuation", source: str = "the motif", program: bool = True):
    """The control flags: they steer `what`, the key `auto` and chords in beats read `source`; `program`
    False leaves --program out (an infill's new notes join the file's own instrument)."""
    g = p.add_argument_group(
        "controls", f"steer {what} (musicrel.generation.controls; default: the model decides)"
    )
    if program:
        g.add_argument("--program", default=None, help="General MIDI program of the output: 0-127 or a name "
                       "such as 'Acoustic Guitar (nylon)' (default: the motif's)")  # fmt: skip
    g.add_argument("--key", default=None, help="keep new notes in a key: C:major, A:minor, Bb:dorian, ... or "
                   f"'auto' (detected from {source})")  # fmt: skip
    g.add_argument("--key-strength", default=None, help="prefer (a bias), only (a mask) or a bias in nats")
    g.add_argument("--chords", default=None, help="chord progression, repeated: 'C:2 G:2 Am:2 F:2' "
                   f"(seconds) or 'C:4b G:4b' (beats at {source}'s tempo)")  # fmt: skip
    g.add_argument("--chord-strength", default=None, help="prefer (a bias), only (a mask) or a bias in nats")
    g.add_argument("--density", type=float, default=None, help="target notes per second (a feedback loop)")
    g.add_argument("--low-note", type=int, default=None, help="lowest MIDI pitch of a new note")
    g.add_argument("--high-note", type=int, default=None, help="highest MIDI pitch of a new note")
    g.add_argument("--max-polyphony", type=int, default=None, help="most notes sounding at once")
    g.add_argument("--instruments", default=None, help="a model with instruments: who plays: motif (default: "
                   "the motif's instruments), any (the model may bring in others) or a list such as "
                   "'Violin, Cello, drums'")  # fmt: skip


def add_sampling_arguments(p, shift_temperature: bool = False) -> None:
    """--temperature, --top-k, --top-p (and --shift-temperature): the model's sampling. Left out, they are not
    passed: their defaults live in the library's parameters (SamplingParams, and the task's own)."""
    p.add_argument("--temperature", type=float, default=None, help="the model's sampling temperature")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass (1 = off)")
    if shift_temperature:
        p.add_argument(
            "--shift-temperature",
            type=float,
            default=None,
            help="temperature within the time shifts alone (> 1: longer waits, sparser music; 1 = off)",
        )


def add_sample_arguments(p, samples: str, default: int | None = None, seed: str = "file i uses seed + i"):
    """--num-samples (`samples`: what each is, and its default) and --seed (`seed`: how it is used)."""
    p.add_argument("--num-samples", type=positive_int, default=default, help=samples)
    p.add_argument("--seed", type=int, default=None, help=f"sampling seed ({seed})")


SAMPLING_FLAGS = ("temperature", "top_k", "top_p", "seed", "num_samples")


def params_options(args, *more: str) -> dict:
    """The keywords of the library's parameters (SamplingParams, InfillParams, AccompanimentParams) that the
    sampling, sample (and `more`) flags and the control flags give; those left out keep the library's
    defaults."""
    return {**given(args, *SAMPLING_FLAGS, *more), "controls": controls_from_args(args)}


def controls_from_args(args):
    """The Controls the flags ask for (ControlError when they cannot be honoured), or None for no flag."""
    from musicrel.generation.controls import Controls

    options = given(args, *CONTROL_FLAGS)
    return Controls(**options) if options else None


def torch_setup(args, rows: int = 8) -> str:
    """Threads for torch (runtime.threads.set_torch_threads): --threads, else the choice for `rows` decoding
    rows. Says what it chose (on stderr unless --quiet). The OpenMP spin count is set by musicrel.cli
    before torch loads."""
    from musicrel.runtime.threads import set_torch_threads

    said = str(set_torch_threads(args.threads, rows))
    if not getattr(args, "quiet", False):
        print(f"musicrel {args.command}: {said}", file=sys.stderr)
    return said


def add_run_arguments(p) -> None:
    """--threads and --quiet."""
    p.add_argument(
        "--threads", type=positive_int, default=None, help="torch CPU threads (default: the CPUs left free)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress")


def add_held_out_arguments(p, out: str) -> None:
    """What an evaluation reads and writes: --input (held-out pieces: a folder or a prepared one's --split
    and --source), --limit, --seeds, --seed, --out (`out`: what it writes there) and the run's flags."""
    p.add_argument(
        "--input",
        required=True,
        help="folder of held-out MIDI files, or a prepared data folder (manifest.json)",
    )
    p.add_argument("--split", default=None, help="split of a prepared data folder (a comma list: test,val)")
    p.add_argument("--source", default=None, help="only this source's pieces of a multi-source folder")
    p.add_argument("--limit", type=positive_int, default=None, help="use at most N pieces")
    p.add_argument("--seeds", type=positive_int, default=None, help="samples per piece and system")
    p.add_argument("--seed", type=int, default=None, help="base seed (each piece and sample derive theirs)")
    p.add_argument("--out", default=None, help=f"write {out} here")
    add_run_arguments(p)


def add_weights_argument(p) -> None:
    """--weights: how the model holds its weights while it decodes (musicrel.model.quantize)."""
    from musicrel.model.weights import DECODE_WEIGHTS, DEFAULT_DECODE_WEIGHTS

    p.add_argument(
        "--weights",
        choices=DECODE_WEIGHTS,
        default=DEFAULT_DECODE_WEIGHTS,
        help="int8 (default): every layer the CPU's int8 kernel takes holds int8 weights, held-out NLL "
        "within 0.001 nats/token; auto: int8 where that decodes faster on this machine (a probe of a few "
        "steps at load), else float32; float32: the weights as trained",
    )


# What --instruments-checkpoint takes, by default: what a piano model would flatten
FLATTENED = "a piano --checkpoint would flatten (drums, or more than one instrument in the tracks read)"


def add_instruments_checkpoint_argument(p, which: str) -> None:
    """--instruments-checkpoint: the model with instruments that takes `which` files (`instruments_model`),
    as `make run` routes uploads."""
    p.add_argument(
        "--instruments-checkpoint",
        default=None,
        help=f"a model with instruments (checkpoints/multi) for {which}, as `make run` routes uploads",
    )


def instruments_model(args, codec, check=None):
    """(model, codec) of --instruments-checkpoint, None without one. ConfigError `bad_instruments_checkpoint`
    when --checkpoint hears every instrument itself, when its codec has none, when `check(model, codec)` (the
    task's) refuses it, or with --devices/--accelerator (the Lightning path decodes one model)."""
    if getattr(args, "instruments_checkpoint", None) is None:
        return None
    from musicrel.errors import ConfigError, MusicrelError
    from musicrel.model.checkpoint import load_codec, load_model

    def refuse(why: str) -> ConfigError:
        return ConfigError(f"--instruments-checkpoint: {why}", code="bad_instruments_checkpoint")

    if codec.instrument_offset is not None:
        raise refuse("--checkpoint hears every instrument itself")
    if getattr(args, "devices", None) is not None or getattr(args, "accelerator", None) is not None:
        raise refuse("it decodes in this process: leave out --devices and --accelerator")
    beside = load_codec(args.instruments_checkpoint)
    if beside.instrument_offset is None:
        raise refuse(f"{args.instruments_checkpoint}'s codec has no instruments")
    model = load_model(args.instruments_checkpoint, weights=args.weights)
    if check is not None:
        try:
            check(model, beside)
        except MusicrelError as exc:
            raise refuse(str(exc)) from exc
    return model, beside


def positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return n


def output_paths(source: Path, root: Path, out: Path, num_samples: int) -> list[Path]:
    """`<out>/<relative folder>/<name>.sample<i>.mid`: folders are mirrored so equal names never collide."""
    rel = source.relative_to(root) if root.is_dir() else Path(source.name)
    return [out / rel.parent / f"{rel.stem}.sample{i}.mid" for i in range(num_samples)]


def write_midi(midi, path: Path) -> None:
    """A PrettyMIDI or a file's bytes, written atomically, so an interrupted run never leaves a half file
    that a rerun would skip."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if isinstance(midi, bytes):
        tmp.write_bytes(midi)
    else:
        midi.write(str(tmp))
    os.replace(tmp, path)
