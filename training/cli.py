"""`musicrel corpus | prepare | train | finetune | export | pack-gpu | evaluate`: the training side of
the CLI.

Handlers import numpy/torch/lightning lazily so that `musicrel --help` stays fast.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from musicrel.model.weights import DECODE_WEIGHTS


def register(subparsers) -> None:
    """The training commands, in the order `musicrel --help` lists them; each is added beside its handler."""
    for add in (
        _add_corpus,
        _add_prepare,
        _add_train,
        _add_finetune,
        _add_export,
        _add_pack_gpu,
        _add_curves,
        _add_evaluate,
    ):
        add(subparsers)


def _corpus(args) -> int:
    from training.corpus import REPORT_NAME, export_music21

    report = export_music21(args.out, workers=args.workers, limit=args.limit, progress=not args.quiet)
    print(
        f"music21 corpus: {report['works']} works, {report['exported']} exported, "
        f"{report['existing']} already there, {report['failed']} failed "
        f"({report['seconds']} s); report: {args.out}/{REPORT_NAME}"
    )
    return 0


def _add_corpus(subparsers) -> None:
    p = subparsers.add_parser("corpus", help="export a built-in corpus (music21's) to MIDI files")
    p.add_argument("source", choices=["music21"], help="which corpus")
    p.add_argument("--out", required=True, help="output folder (resumes: existing files are skipped)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: CPU count)")
    p.add_argument("--limit", type=int, default=None, help="export only the first N works")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_corpus)


def _prepare(args) -> int:
    from musicrel.data.prepared import MANIFEST
    from musicrel.errors import ConfigError
    from musicrel.midi.codec import CodecConfig, EventCodec
    from training.prepare import prepare

    overrides = {
        k: v
        for k, v in (("pedal", args.pedal), ("step_ms", args.step_ms), ("velocity_bins", args.velocity_bins))
        if v is not None
    }
    if args.tracks is not None:
        try:
            overrides["tracks"] = [int(i) for i in args.tracks.split(",")]
        except ValueError:
            raise ConfigError(f"--tracks wants instrument indices like 0,2, got {args.tracks!r}") from None
    if args.melody:
        overrides["melody"] = True
    if args.melody_lead_ms is not None:
        overrides["melody_lead_ms"] = args.melody_lead_ms
    if args.instruments:
        overrides["instruments"] = True
    codec = EventCodec(CodecConfig(**overrides))
    weights = {}
    for item in args.weight:
        name, sep, value = item.partition("=")
        try:
            weights[name] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise ConfigError(f"--weight wants NAME=NUMBER, got {item!r}", code="bad_sources")
    m = prepare(
        args.sources,
        args.out,
        codec=codec,
        workers=args.workers,
        progress=not args.quiet,
        weights=weights,
        novelty=not args.no_novelty,
    )
    c, g = m["counts"], m["compositions"]
    print(
        f"found {c['found']} files: {c['duplicates']} duplicates, {c['encoded']} encoded "
        f"({c['newly_encoded']} new, {c['cached']} cached), {c['skipped']} skipped "
        f"{m['skipped_by_code'] or ''}".rstrip()
    )
    print(
        f"compositions: {g['groups']} groups, {g['files_in_multi_file_groups']} files in "
        f"{g['multi_file_groups']} groups of versions (largest {g['largest_group']})"
    )
    for split, info in m["splits"].items():
        print(f"  {split:5s} {info['pieces']:6d} pieces {info['stream_tokens']:10d} tokens")
        if len(info["sources"]) > 1:
            for name, r in info["sources"].items():
                print(f"        {name:>14s} {r['pieces']:6d} pieces {r['event_tokens']:10d} tokens")
    print("weights: " + ", ".join(f"{k} {v:g}" for k, v in m["weights"].items()))
    print(f"manifest: {args.out}/{MANIFEST}")
    return 0


def _add_prepare(subparsers) -> None:
    p = subparsers.add_parser("prepare", help="encode MIDI files into a training data folder")
    p.add_argument(
        "sources",
        nargs="+",
        metavar="[NAME=]SRC",
        help="MIDI files, folders (searched recursively) or globs; NAME defaults to the folder's name",
    )
    p.add_argument(
        "--weight",
        action="append",
        default=[],
        metavar="NAME=W",
        help="mixing weight of a source (default 1: every token alike; 0.5 halves how often it is seen)",
    )
    p.add_argument("--out", required=True, help="data folder (re-runs reuse its cache)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: CPU count)")
    p.add_argument("--pedal", choices=["extend", "events"], default=None, help="codec pedal handling")
    p.add_argument("--step-ms", type=int, default=None, help="codec time-shift resolution in ms")
    p.add_argument("--velocity-bins", type=int, default=None, help="codec velocity bins")
    p.add_argument("--tracks", default=None, help="instrument indices to read, e.g. 0,2 (default: merge all)")
    p.add_argument(
        "--melody",
        action="store_true",
        help="accompaniment data: the first of --tracks is the given melody, the others its part",
    )
    p.add_argument(
        "--melody-lead-ms", type=int, default=None, help="with --melody: its tokens this far ahead (0)"
    )
    p.add_argument(
        "--instruments",
        action="store_true",
        help="an instrument token before notes of another instrument; drums kept (docs/INSTRUMENTS.md)",
    )
    p.add_argument(
        "--no-novelty",
        action="store_true",
        help="write no novelty index (faster; the service then reports no copied stretches for this data)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_prepare)


def _train(args) -> int:
    from training.module import run_cli

    run_cli(args.args)
    return 0


def _add_train(subparsers) -> None:
    # Everything after `train` goes to LightningCLI (`musicrel train --help` prints its help).
    p = subparsers.add_parser(
        "train",
        add_help=False,
        help="train a model: --config configs/X.yaml [--section.key value ...]",
        description="Forwards its arguments to LightningCLI's fit; see `musicrel train --help`.",
        # no options of its own: `--config`, `--help`... all land in `args` for LightningCLI
        prefix_chars="\0",
    )
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_train)


def _command_line(name: str, args) -> str:
    """The options that were given, as a command line (for a model card)."""
    words = ["musicrel", name]
    for key, value in vars(args).items():
        if key in ("command", "func") or value in (None, False, "auto"):
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            words.append(flag)
        else:
            words += [flag, *(map(str, value) if isinstance(value, list) else [str(value)])]
    return shlex.join(words)


def _finetune(args) -> int:
    from training.finetune import FinetuneConfig, FinetuneRun, finetune

    overrides = {
        k: v
        for k, v in (
            ("max_steps", args.max_steps),
            ("lr", args.lr),
            ("patience", args.patience),
            ("val_every", args.val_every),
            ("batch_size", args.batch_size),
        )
        if v is not None
    }
    if args.no_augment:
        overrides["augment"] = False
    run = FinetuneRun(
        args.checkpoint,
        args.data,
        args.out,
        work=args.work,
        accelerator=args.accelerator,
        devices=args.devices,
        precision=args.precision,
        max_time=args.max_time,
        resume=args.resume,
        progress=not args.quiet,
        command=_command_line("finetune", args),
        instruments=args.instruments,
    )
    s = finetune(run, FinetuneConfig(**overrides))
    for split in ("val", "test"):
        b, a = s["nll_before"][split], s["nll_after"][split]
        files = s["data"]["files"][split]
        print(f"{split:4s} NLL {b:.4f} -> {a:.4f} ({100 * (a / b - 1):+.1f} %), {files} files")
    print(f"{s['steps']} steps in {s['seconds']:.0f} s; exported {s['best_checkpoint']} -> {args.out}")
    return 0


def _add_finetune(subparsers) -> None:
    p = subparsers.add_parser(
        "finetune",
        help="go on training a model folder on your own MIDI files (held-out part, early stopping)",
        description="Prepares the files with the model's codec (80/10/10 %% train/val/test by file), trains "
        "from the model's weights at a low learning rate with augmentation, stops early on the validation "
        "NLL, and exports the best step with a card of the held-out NLL before and after. Defaults: "
        "training.finetune.FinetuneConfig.",
    )
    p.add_argument("--checkpoint", required=True, help="the base model folder (e.g. checkpoints/default)")
    p.add_argument("--data", required=True, nargs="+", help="MIDI files or folders, or a prepared folder")
    p.add_argument("--out", required=True, help="model folder to write")
    p.add_argument("--work", default=None, help="prepared data, logs, checkpoints (default: OUT.work)")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--patience", type=int, default=None, help="validations without improvement")
    p.add_argument("--val-every", type=int, default=None, help="steps between validations")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--no-augment", action="store_true", help="no transposition / time-stretch")
    p.add_argument("--accelerator", default="auto", help="Lightning's: cpu, gpu, auto")
    p.add_argument("--devices", default="auto", help="Lightning's: 1, 8, auto")
    p.add_argument("--precision", default=None, help="Lightning's (default: bf16-mixed on a GPU with it)")
    p.add_argument("--max-time", default=None, help="stop after DD:HH:MM:SS")
    p.add_argument("--resume", action="store_true", help="continue from WORK's last checkpoint")
    p.add_argument(
        "--instruments",
        action="store_true",
        help="prepare with instrument tokens (drums kept) and grow the model's vocabulary by them",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_finetune)


def _export(args) -> int:
    from musicrel.errors import ConfigError
    from training.export import export_checkpoint

    if not args.max_shard_mib > 0:
        raise ConfigError(f"--max-shard-mib must be > 0, got {args.max_shard_mib}")
    folder = export_checkpoint(
        args.checkpoint,
        args.out,
        card=args.card,
        max_shard_bytes=int(args.max_shard_mib * 2**20),
        dtype=args.dtype,
    )
    print(f"exported {args.checkpoint} -> {folder}")
    return 0


def _add_export(subparsers) -> None:
    from musicrel.model.checkpoint import MAX_SHARD_BYTES, WEIGHT_DTYPES  # no torch: cheap at start-up

    p = subparsers.add_parser("export", help="Lightning checkpoint -> self-contained model folder")
    p.add_argument("checkpoint", help="a .ckpt written by `musicrel train`")
    p.add_argument("--out", required=True, help="model folder to write (e.g. checkpoints/NAME)")
    p.add_argument("--card", default=None, help="Markdown file to ship as MODEL_CARD.md")
    p.add_argument(
        "--max-shard-mib",
        type=float,
        default=MAX_SHARD_BYTES / 2**20,
        help="weights larger than this go to shards of at most this size (default: %(default)g MiB)",
    )
    p.add_argument(
        "--dtype",
        choices=WEIGHT_DTYPES,
        default=WEIGHT_DTYPES[0],
        help="storage dtype of the weights (bfloat16 halves them; loading upcasts to float32)",
    )
    p.set_defaults(func=_export)


def _pack_gpu(args) -> int:
    from musicrel.errors import ConfigError
    from training.pack import pack_gpu

    if args.max_mib is not None and not args.max_mib > 0:
        raise ConfigError(f"--max-mib must be > 0, got {args.max_mib}")
    limit = None if args.max_mib is None else int(args.max_mib * 2**20)
    info = pack_gpu(args.data, args.out, wheels=not args.no_wheels, limit_bytes=limit)
    data = sum(n for f, n in info["files"].items() if f.startswith("data/"))
    wheels = sum(n for f, n in info["files"].items() if f.startswith("wheels/"))
    beside = f", beside the checkout's {info['checkout_bytes'] / 2**20:.1f}" if info["checkout_bytes"] else ""
    print(
        f"{args.out}: {info['total_bytes'] / 2**20:.1f} MiB of {info['limit_bytes'] / 2**20:.1f}{beside} "
        f"(data {data / 2**20:.1f} MiB, {len(info['wheels'])} wheels {wheels / 2**20:.1f} MiB)"
    )
    print(
        f"on the GPU machine, from the repo root: bash {args.out}/run.sh start 8m; see {args.out}/README.md"
    )
    return 0


def _add_pack_gpu(subparsers) -> None:
    from training.pack import PACK_LIMIT_BYTES

    p = subparsers.add_parser(
        "pack-gpu",
        help="pack a prepared data folder + the wheels a bare GPU machine lacks, with run.sh",
        description="Writes OUT/data (the split arrays xz-compressed, not the cache), OUT/wheels (pip "
        "download of what the GPU machine lacks, at the versions installed here, and musicrel's own wheel), "
        "OUT/run.sh (start, status, wait, collect) and OUT/README.md; refuses when the whole would exceed "
        "--max-mib: by default what a device command carries (64 MiB) less the checkout's own files, which "
        "travel with it.",
    )
    p.add_argument("--data", default="data/default", help="prepared data folder (default: %(default)s)")
    p.add_argument("--out", default="gpu_pack", help="pack folder (default: %(default)s, git-ignored)")
    p.add_argument("--no-wheels", action="store_true", help="data and scripts only (no network)")
    p.add_argument(
        "--max-mib",
        type=float,
        default=None,
        help=f"size limit (default: {PACK_LIMIT_BYTES / 2**20:g} less the checkout's tracked files)",
    )
    p.set_defaults(func=_pack_gpu)


def _curves(args) -> int:
    from training.curves import curves

    print(curves(args.runs, out=args.out))
    if args.out:
        print(f"wrote {args.out}")
    return 0


def _add_curves(subparsers) -> None:
    p = subparsers.add_parser(
        "curves",
        help="validation NLL against training time of several runs, per source (table + plot)",
        description="Each run is LABEL=RUN_DIR[+RUN_DIR...]:SECONDS_PER_STEP: its Lightning version "
        "folder(s) and its step time measured alone (musicrel bench train), so that runs slowed by other "
        "work compare at equal compute.",
    )
    p.add_argument("runs", nargs="+", metavar="LABEL=DIR:S")
    p.add_argument("--out", default=None, help="write the plot here (PNG)")
    p.set_defaults(func=_curves)


def _evaluate(args) -> int:
    from training.evaluate import evaluate, format_nll_table

    result = evaluate(
        args.checkpoint,
        args.data,
        split=args.split,
        batch_size=args.batch_size,
        max_windows=args.max_windows,
        seq_len=args.seq_len,
        weights=args.weights,
    )
    print(format_nll_table(result))
    return 0


def _add_evaluate(subparsers) -> None:
    p = subparsers.add_parser("evaluate", help="NLL / perplexity / accuracy of a model on a prepared split")
    p.add_argument("--checkpoint", required=True, help="model folder (config.json + model.safetensors)")
    p.add_argument("--data", required=True, help="data folder written by `musicrel prepare`")
    p.add_argument("--split", default="test", choices=["train", "val", "test"])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument(
        "--seq-len", type=int, default=None, help="window length (default: the model's max_seq_len)"
    )
    p.add_argument("--max-windows", type=int, default=None, help="score at most this many windows")
    p.add_argument(
        "--weights",
        choices=DECODE_WEIGHTS,
        default="float32",
        help="float32 (default): the model as trained; int8: as the service and the generating commands "
        "decode with it (musicrel.model.quantize)",
    )
    p.set_defaults(func=_evaluate)


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(prog="training")
    register(parser.add_subparsers(dest="command", required=True))
    a = parser.parse_args()
    sys.exit(a.func(a))
