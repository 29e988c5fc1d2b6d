"""`musicrel encode IN.mid` (MIDI -> token JSON) and `musicrel decode tokens.json --out OUT.mid`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from musicrel.errors import ConfigError, MusicrelError


def parse_tracks(value: str):
    """argparse type for --tracks: 'merge' or comma-separated instrument indices."""
    if value == "merge":
        return "merge"
    try:
        return [int(v) for v in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'merge' or indices like 0,2, got {value!r}") from None


def register(subparsers) -> None:
    enc = subparsers.add_parser(
        "encode",
        help="MIDI file -> event tokens (JSON)",
        description='Encode a MIDI file as {"codec": settings, "tokens": [...]} JSON (stdout without --out).',
    )
    enc.add_argument("input", type=Path, help="MIDI file (.mid)")
    enc.add_argument("--out", type=Path, default=None, help="JSON file to write (default: stdout)")
    enc.add_argument(
        "--pedal",
        choices=("extend", "events"),
        default="extend",
        help="sustain pedal: lengthen notes (extend, default) or emit PEDAL_ON/OFF tokens (events)",
    )
    enc.add_argument(
        "--tracks",
        type=parse_tracks,
        default="merge",
        help="'merge' (default: all non-drum instruments) or instrument indices, e.g. 0,2",
    )
    enc.set_defaults(func=encode_command)

    dec = subparsers.add_parser(
        "decode",
        help="event tokens (JSON) -> MIDI file",
        description="Decode tokens written by `musicrel encode` (or a bare JSON list of ints) to MIDI; "
        "the codec settings in the JSON are used when present, else the defaults.",
    )
    dec.add_argument("input", type=Path, help="JSON file: {'codec': ..., 'tokens': [...]} or [...]")
    dec.add_argument("--out", type=Path, required=True, help="MIDI file to write")
    dec.set_defaults(func=decode_command)


def encode_command(args) -> int:
    from musicrel.midi.codec import CodecConfig, EventCodec

    codec = EventCodec(CodecConfig(pedal=args.pedal, tracks=args.tracks))
    tokens = codec.encode(args.input)
    text = json.dumps({"codec": codec.config.to_dict(), "tokens": tokens.tolist()})
    if args.out is None:
        sys.stdout.write(text + "\n")
    else:
        args.out.write_text(text + "\n")
        print(f"{len(tokens)} tokens -> {args.out}", file=sys.stderr)
    return 0


def load_tokens(path: Path):
    """Read token JSON ({"codec", "tokens"} or a bare list) -> (EventCodec, list[int])."""
    from musicrel.midi.codec import CodecConfig, EventCodec

    try:
        data = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MusicrelError(f"{path}: not valid JSON ({exc})", code="bad_tokens") from None
    config = CodecConfig()
    if isinstance(data, dict):
        if "tokens" not in data:
            raise MusicrelError(f"{path}: JSON object has no 'tokens' list", code="bad_tokens")
        if "codec" in data:
            try:
                config = CodecConfig.from_dict(data["codec"])
            except (ConfigError, TypeError) as exc:
                raise ConfigError(f"{path}: bad 'codec' settings: {exc}") from None
        data = data["tokens"]
    if not isinstance(data, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in data):
        raise MusicrelError(f"{path}: 'tokens' must be a list of integers", code="bad_tokens")
    return EventCodec(config), data


def decode_command(args) -> int:
    codec, tokens = load_tokens(args.input)
    pm = codec.decode(tokens)
    pm.write(str(args.out))
    n = sum(len(i.notes) for i in pm.instruments)
    print(f"{len(tokens)} tokens -> {n} notes, {pm.get_end_time():.1f} s -> {args.out}", file=sys.stderr)
    return 0
