"""`musicrel bench codec`: encoding speed side by side with MidiTok's MIDILike tokenizer on the same files
in the same run (repetitions alternate), and round-trip fidelity per file."""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from musicrel.bench.timing import side_by_side
from musicrel.errors import MusicrelError


def _default_dir() -> Path:
    shared = os.environ.get("MUSICREL_SHARED")
    root = Path(shared) if shared else Path(__file__).resolve().parents[2].parent / "shared"
    return root / "midi" / "real"


def register(bench_sub) -> None:
    parser = bench_sub.add_parser(
        "codec",
        help="encode speed vs MidiTok MIDILike, and round-trip fidelity",
        description="Files/s encoding MIDI files with EventCodec and with MidiTok's MIDILike tokenizer, "
        "alternating repetitions in one run; then per-file round-trip fidelity.",
    )
    parser.add_argument("--dir", type=Path, default=None, help="folder of .mid files (default: shared real)")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes over all files per encoder")
    parser.set_defaults(func=run)


def fidelity(codec, path, pm=None) -> dict:
    """Round trip of one file: the notes `to_notes` gives (after pedal extension) against
    `decode_notes(encode(path))`. A note survives when a decoded note of its pitch starts on its step, with
    onset and offset within half a step (5 ms) and velocity within one bin."""
    # pm: codec.read(path), when the caller already has it
    pm = codec.read(path) if pm is None else pm
    reference = codec.to_notes(pm)
    tokens = codec.encode(path)
    decoded = codec.decode_notes(tokens)
    step, bins = codec.step, codec.config.velocity_bins
    tol = step / 2 + 1e-9
    by_onset = {(n.pitch, round(n.start / step)): n for n in decoded}
    kept, onset, offset, vel = 0, 0.0, 0.0, 0
    for n in reference:
        d = by_onset.get((n.pitch, int(codec._steps(n.start))))
        if d is None:
            continue
        on, off = abs(d.start - n.start), abs(d.end - n.end)
        dv = abs(d.velocity * bins // 128 - n.velocity * bins // 128)
        onset, offset, vel = max(onset, on), max(offset, off), max(vel, dv)
        kept += on <= tol and off <= tol and dv <= 1
    return {
        "file": Path(path).name,
        "instruments": sum(not i.is_drum for i in pm.instruments),
        "drums": sum(i.is_drum for i in pm.instruments),
        "notes": len(reference),
        "decoded": len(decoded),
        "kept": kept / len(reference),
        "max_onset_ms": onset * 1000,
        "max_offset_ms": offset * 1000,
        "max_velocity_bins": vel,
        "tokens": len(tokens),
        "same_as_pretty_midi": bool((codec.encode(pm) == tokens).all()) if len(tokens) else True,
    }


def _pass(fn, files) -> Callable[[], None]:
    def encode_all() -> None:
        for f in files:
            fn(f)

    return encode_all


def run(args) -> int:
    from musicrel.midi.codec import EventCodec

    folder = args.dir or _default_dir()
    files = sorted(Path(folder).glob("*.mid"))
    if not files:
        raise MusicrelError(f"no .mid files in {folder} (use --dir)", code="no_data")
    if args.repeats < 1:
        raise MusicrelError("--repeats must be >= 1", code="invalid_argument")
    codec = EventCodec()
    encoders = {
        "musicrel EventCodec.encode(path)": codec.encode,
        "musicrel encode(read(path)) (pretty_midi)": lambda f: codec.encode(codec.read(f)),
    }
    try:
        from miditok import MIDILike, TokenizerConfig

        tokenizer = MIDILike(TokenizerConfig())
        encoders["miditok MIDILike(path)"] = tokenizer
    except ImportError:
        print("miditok is not installed (pip install 'musicrel[bench]'): musicrel alone", file=sys.stderr)

    for fn in encoders.values():  # warm-up on two files only: imports, caches
        _pass(fn, files[:2])()
    passes = {name: _pass(fn, files) for name, fn in encoders.items()}
    times = side_by_side(passes, args.repeats, warmup=False)

    n = len(files)
    ref = statistics.median(times["miditok MIDILike(path)"]) if "miditok MIDILike(path)" in times else None
    print(f"encode {n} files from {folder}, {args.repeats} alternating passes, median pass")
    print(f"{'encoder':44s} {'s/pass':>8s} {'files/s':>9s} {'vs miditok':>11s}")
    for name, ts in times.items():
        med = statistics.median(ts)
        ratio = f"{ref / med:10.2f}x" if ref else "         -"
        print(f"{name:44s} {med:8.3f} {n / med:9.1f} {ratio:>11s}")

    print()
    print("round trip (pedal extended): notes kept with onset/offset within 5 ms and velocity within 1 bin")
    print(
        f"{'file':36s} {'instr':>5s} {'drums':>5s} {'notes':>6s} {'kept %':>7s} {'on ms':>6s} "
        f"{'off ms':>7s} {'vel':>3s} {'tokens':>7s} {'=pm':>4s}"
    )
    for f in files:
        r = fidelity(codec, f)
        print(
            f"{r['file'][:36]:36s} {r['instruments']:5d} {r['drums']:5d} {r['notes']:6d} "
            f"{100 * r['kept']:7.2f} {r['max_onset_ms']:6.2f} {r['max_offset_ms']:7.2f} "
            f"{r['max_velocity_bins']:3d} {r['tokens']:7d} "
            f"{'yes' if r['same_as_pretty_midi'] else 'NO':>4s}"
        )
    return 0
