"""`musicrel generate`: continue every motif of a file or folder.

Torch and Lightning are imported inside the handlers so that `musicrel --help` stays fast.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from musicrel.cli.args import (
    FLATTENED,
    add_control_arguments,
    add_instruments_checkpoint_argument,
    add_run_arguments,
    add_sample_arguments,
    add_sampling_arguments,
    add_weights_argument,
    instruments_model,
    output_paths,
    params_options,
    positive_int,
    torch_setup,
    write_midi,
)
from musicrel.cli.codec import parse_tracks
from musicrel.cli.tasks import SUMMARY_FILE
from musicrel.midi.files import find_midi_files


def run_jobs(
    model,
    codec,
    items,
    params,
    primer_seconds: float,
    tracks,
    novelty=None,
    motif_end: float | None = None,
    read: dict | None = None,
) -> list[dict]:
    """Continue the motifs of `items` ((motif path, output paths) pairs) in ONE batch; write the outputs and
    return one record per motif. Unreadable motifs get an error record and do not stop the others. With a
    novelty index, each sample's longest stretch shared with the training data is in the record. A model
    with instruments writes the motif's tracks (the record lists them) and refuses --program per motif.
    `read`: motifs already read (path -> PrettyMIDI), not parsed again."""
    from musicrel.errors import MusicrelError
    from musicrel.evaluation.novelty import longest_copy
    from musicrel.generation.decode_batch import generate_batch
    from musicrel.generation.primer import (
        default_max_primer_tokens,
        prepare_primer,
        refuse_program,
        render_result,
    )

    records, jobs, ready = [], [], []
    for motif, outputs in items:
        record = {"input": str(motif)}
        try:
            primer = prepare_primer(
                codec,
                (read or {}).get(motif, motif),
                primer_seconds,
                tracks,
                max_tokens=default_max_primer_tokens(model),
                motif_end=motif_end,
            )
            refuse_program(primer, params.controls)
        except MusicrelError as exc:
            record.update(status="error", error={"code": exc.code, "message": str(exc)})
        except OSError as exc:
            record.update(status="error", error={"code": "unreadable", "message": exc.strerror or str(exc)})
        else:
            jobs.append((primer, params))
            ready.append((record, outputs))
            record["primer"] = {  # what the model read of the file, and the instrument it plays on
                "start_time": round(primer.start_time, 3),
                "end_time": round(primer.end_time, 3),
                "cropped": primer.cropped,
                "program": primer.program,
                "program_reason": primer.program_reason,
            }
            if primer.tracks is not None:  # the motif's tracks; a sample's new instruments come after them
                record["primer"]["tracks"] = primer.tracks.describe()
        records.append(record)
    if jobs:
        results = generate_batch(model, codec, jobs)
        for (record, outputs), (primer, _), result in zip(ready, jobs, results, strict=True):
            midis = render_result(codec, primer, result, params.include_primer)
            for pm, path in zip(midis, outputs, strict=True):
                write_midi(pm, path)
            if primer.tracks is not None:  # each sample's tracks as written (new instruments included)
                record["tracks"] = [primer.tracks.describe_file(pm) for pm in midis]
            record.update(
                status="ok",
                outputs=[str(p) for p in outputs],
                seed=result.seed,
                primer_tokens=result.primer_tokens,
                new_tokens=result.new_tokens,
                seconds=round(result.seconds, 3),
                timings={k: round(v, 4) for k, v in result.timings.items()},
            )
            if result.controls is not None:  # what was applied to this motif (the key detected, ...)
                record["controls"] = result.controls
            if result.warnings:  # controls that pull apart (a chord outside the key)
                record["warnings"] = result.warnings
            if novelty is not None:  # the generated notes alone: the motif may itself be a training piece
                record["novelty"] = [longest_copy(novelty, codec, tk) for tk in result.tokens]
    return records


def _lightning_predict(model, codec, todo, params, args, novelty) -> list[dict] | None:
    """Spread the motifs over devices with Lightning's predict loop (DDP when devices > 1)."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Motifs(Dataset):
        def __init__(self, items):
            self.items = items

        def __len__(self):
            return len(self.items)

        def __getitem__(self, i):
            return self.items[i]

    class Generator(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def predict_step(self, batch, batch_idx):
            return run_jobs(
                self.model, codec, batch, params, args.primer_seconds, args.tracks, novelty, args.motif_end
            )

    loader = DataLoader(Motifs(todo), batch_size=args.batch_size, collate_fn=list, shuffle=False)
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        logger=False,
        enable_progress_bar=not args.quiet,
        enable_model_summary=False,
    )
    batches = trainer.predict(Generator(), loader) or []
    records = [r for batch in batches for r in batch]
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gathered = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, records)
        records = [r for part in gathered for r in part]
    if not trainer.is_global_zero:
        return None
    # The distributed sampler may repeat a motif to even out the ranks: keep one record per input.
    return list({r["input"]: r for r in records}.values())


def _novelty_index(args):
    """--novelty's index, else the one shipped beside the checkpoint, else None (not reported)."""
    from musicrel.evaluation.novelty import INDEX_FILE, load_index

    if args.novelty is not None:
        return load_index(args.novelty)
    return load_index(args.checkpoint) if (Path(args.checkpoint) / INDEX_FILE).is_file() else None


def _route(codec, todo, tracks, controls) -> tuple[list, list, dict]:
    """(the motifs of `todo` that stay with --checkpoint, those that go to the instruments model
    (`wants_instruments`), each motif read: path -> PrettyMIDI, so its run does not parse it again); a file
    that cannot be read stays with --checkpoint, whose run reports it."""
    from musicrel.errors import MusicrelError
    from musicrel.midi.instruments import asked_instruments, wants_instruments

    rest, flat, read = [], [], {}
    for item in todo:
        try:
            read[item[0]] = codec.read(item[0])
        except (MusicrelError, OSError):
            rest.append(item)
            continue
        ensemble = wants_instruments(read[item[0]], tracks, asked_instruments(controls))
        (flat if ensemble else rest).append(item)
    return rest, flat, read


def _generate(args) -> int:
    from tqdm import tqdm

    from musicrel.generation.primer import PRIMER_SECONDS
    from musicrel.generation.sampling import SamplingParams
    from musicrel.model.checkpoint import load_codec, load_model
    from musicrel.model.quantize import held_weights

    # Options left out are not passed: their defaults live in SamplingParams (and PRIMER_SECONDS).
    options = params_options(args, "seconds", "shift_temperature", "max_new_tokens")
    params = SamplingParams(include_primer=args.include_primer, **options)
    if args.primer_seconds is None:
        args.primer_seconds = PRIMER_SECONDS
    root, out = Path(args.input), Path(args.out)
    motifs = find_midi_files(root)
    if not motifs:
        print(f"musicrel generate: no .mid/.midi files in {root}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    threads = torch_setup(args, rows=min(len(motifs), args.batch_size) * args.num_samples)
    if args.accelerator not in (None, "cpu"):
        args.weights = "float32"  # int8 is a CPU's; Lightning moves the model to the accelerator after this
    model = load_model(args.checkpoint, weights=args.weights)
    codec = load_codec(args.checkpoint)
    beside = instruments_model(args, codec)
    novelty = _novelty_index(args)
    out.mkdir(parents=True, exist_ok=True)

    records, todo = [], []
    for motif in motifs:
        outputs = output_paths(motif, root, out, args.num_samples)
        if all(p.is_file() for p in outputs):
            records.append({"input": str(motif), "outputs": [str(p) for p in outputs], "status": "exists"})
        else:
            todo.append((motif, outputs))

    if args.devices is not None or args.accelerator is not None:
        args.devices = args.devices or 1
        args.accelerator = args.accelerator or "cpu"
        done = _lightning_predict(model, codec, todo, params, args, novelty)
        if done is None:
            return 0  # a non-zero rank: rank 0 writes the summary
    else:
        done = []
        with tqdm(total=len(todo), unit="motif", disable=args.quiet, file=sys.stderr) as bar:
            for i in range(0, len(todo), args.batch_size):
                batch, read = todo[i : i + args.batch_size], None
                groups = [(model, codec, novelty, batch)]
                if beside is not None:  # what the --checkpoint model would flatten: the instruments model
                    rest, flat, read = _route(codec, batch, args.tracks, params.controls)
                    groups = [(model, codec, novelty, rest), (*beside, None, flat)]
                for m, c, index, items in groups:
                    if not items:
                        continue
                    part = run_jobs(
                        m, c, items, params, args.primer_seconds, args.tracks, index, args.motif_end, read
                    )
                    if beside is not None:  # which of the two wrote it
                        for r in part:
                            r["model"] = "instruments" if m is not model else "checkpoint"
                    done += part
                bar.update(len(batch))
    records += done

    for r in records:
        if r["status"] == "error":
            print(f"musicrel generate: skipped {r['input']}: [{r['error']['code']}] {r['error']['message']}",
                  file=sys.stderr)  # fmt: skip
    counts = {s: sum(r["status"] == s for r in records) for s in ("ok", "exists", "error")}
    summary = {
        "checkpoint": str(args.checkpoint),
        "instruments_checkpoint": None if beside is None else str(args.instruments_checkpoint),
        "weights": held_weights(model),  # what the model holds ("auto": the probe's choice)
        "input": str(root),
        "settings": {
            **dataclasses.asdict(params),
            "primer_seconds": args.primer_seconds,
            "motif_end": args.motif_end,
            "tracks": args.tracks,
            "batch_size": args.batch_size,
            "devices": args.devices,
            "accelerator": args.accelerator,
            "novelty_index": novelty and {"pieces": len(novelty.names), "notes": novelty.notes},
            "threads": threads,
        },
        "counts": counts,
        "seconds_total": round(time.perf_counter() - started, 3),
        "files": sorted(records, key=lambda r: r["input"]),
    }
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"{counts['ok']} motifs continued, {counts['exists']} already done, {counts['error']} skipped "
        f"({summary['seconds_total']} s); summary: {out / SUMMARY_FILE}"
    )
    return 0 if counts["ok"] + counts["exists"] > 0 else 2


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "generate",
        help="continue every motif of a MIDI file or folder",
        description="Continue every .mid/.midi motif of --input (recursive); writes <name>.sample<i>.mid and "
        "summary.json to --out. Outputs that already exist are skipped, so an interrupted run resumes.",
    )
    p.add_argument("--checkpoint", required=True, help="checkpoint folder (config.json + model.safetensors)")
    add_instruments_checkpoint_argument(p, f"the motifs {FLATTENED}")
    add_weights_argument(p)
    p.add_argument("--input", required=True, help="a MIDI file or a folder of them")
    p.add_argument("--out", required=True, help="output folder")
    # Sampling options default to SamplingParams' (left out: not passed), but for two samples per motif.
    add_sample_arguments(p, "continuations per motif (2)", 2, seed="default: random, saved in summary")
    p.add_argument("--seconds", type=float, default=None, help="length of each continuation in seconds")
    add_sampling_arguments(p, shift_temperature=True)
    p.add_argument("--max-new-tokens", type=int, default=None, help="cap on tokens per continuation")
    p.add_argument("--primer-seconds", type=float, default=None, help="seconds of the motif the model reads")
    p.add_argument(
        "--motif-end",
        type=float,
        default=None,
        help="where each motif ends, in seconds (default: its last note)",
    )
    p.add_argument("--include-primer", action="store_true", help="output = motif + continuation")
    p.add_argument(
        "--tracks", type=parse_tracks, default="merge", help="'merge' or instrument indices, e.g. 0,2"
    )
    p.add_argument("--batch-size", type=positive_int, default=4, help="motifs generated together")
    p.add_argument("--devices", type=positive_int, default=None, help="spread over N devices (Lightning)")
    p.add_argument("--accelerator", choices=["cpu", "gpu", "cuda", "mps", "auto"], default=None)
    p.add_argument(
        "--novelty",
        default=None,
        help="folder holding novelty.npz (a prepared data folder) to report what each sample copied from "
        "the training data (default: the checkpoint folder's, if it ships one)",
    )
    add_run_arguments(p)
    add_control_arguments(p)
    p.set_defaults(func=_generate)
