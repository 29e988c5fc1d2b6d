"""What several `musicrel` subcommands share: `given` (the options a user gave), `positive_int`, the control
flags (`add_control_arguments`, `controls_from_args`), `torch_setup` (threads) and where and how outputs are
written (`output_paths`, `write_midi`)."""

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
                 "high_note", "max_polyphony")  # fmt: skip


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


def add_weights_argument(p) -> None:
    """--weights: how the model holds its weights while it decodes (musicrel.model.quantize)."""
    from musicrel.model.checkpoint import DECODE_WEIGHTS, DEFAULT_DECODE_WEIGHTS

    p.add_argument(
        "--weights",
        choices=DECODE_WEIGHTS,
        default=DEFAULT_DECODE_WEIGHTS,
        help="int8 (default): every layer the CPU's int8 kernel takes holds int8 weights, decoding ~1.7x "
        "faster at batch 1 with held-out NLL within 0.001 nats/token; float32: the weights as trained",
    )


def positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return n


def output_paths(source: Path, root: Path, out: Path, num_samples: int) -> list[Path]:
    """`<out>/<relative folder>/<name>.sample<i>.mid`: folders are mirrored so equal names never collide."""
    rel = source.relative_to(root) if root.is_dir() else Path(source.name)
    return [out / rel.parent / f"{rel.stem}.sample{i}.mid" for i in range(num_samples)]


def write_midi(pm, path: Path) -> None:
    """Write atomically, so an interrupted run never leaves a half file that a rerun would skip."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pm.write(str(tmp))
    os.replace(tmp, path)
