"""The flows the task commands share, each parameterised by its task:

- `run_files` (`musicrel infill`, `musicrel accompany`): the task's parameters from the flags, the model,
  then for each MIDI file of the input: skip it when its outputs exist, run the task with the file's seed,
  write its outputs, print one line (or its one-line error), and collect summary.json.
- `run_evaluation` (`musicrel evaluate-continuations`, `evaluate-infills`): the evaluation's options from the
  flags, its report printed and written.

Torch is imported inside them, so that `musicrel --help` stays fast."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from musicrel.cli.args import given, instruments_model, output_paths, params_options, torch_setup, write_midi
from musicrel.midi.files import find_midi_files

SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class FileTask:
    """What a per-file command does to one file, and what it reports.

    params: the library's parameters type (InfillParams, AccompanimentParams), made from the flags.
    run(model, codec, path, params, record) -> the result: `.midis` and `.notes` per sample, `.seed`,
    `.decode_seconds`, `.controls`, `.warnings` (`record`, the file's summary record, takes what the task
    learns before it runs). fields(result): what the record keeps of the result besides. done(done, total):
    the last line. check(model, codec): refuses a model that cannot do the task. record: what every file's
    record starts with (after its input and outputs). route(codec, path, params): whether the file goes to
    --instruments-checkpoint's model (a command that takes one), the codec --checkpoint's. files(result):
    each sample's file (bytes) where the result writes its own (an infill edits the input's bytes), else
    `.midis` are written."""

    params: type
    run: Callable
    fields: Callable[[object], dict]
    done: Callable[[int, int], str]
    check: Callable | None = None
    record: dict = dataclasses.field(default_factory=dict)
    route: Callable | None = None
    files: Callable | None = None


def run_files(args, task: FileTask) -> int:
    """`task` on every MIDI file of args.input (recursive), outputs under args.out. Exit status: 2 with no
    input file, 1 when every file failed, else 0 (a file that fails is in summary.json with its error)."""
    from musicrel.errors import MusicrelError
    from musicrel.generation.sampling import SEED_RANGE
    from musicrel.model.checkpoint import load_codec, load_model

    options = params_options(args)
    params = task.params(**options)  # a bad setting is every file's: one error, exit 2
    root, out = Path(args.input), Path(args.out)
    files = find_midi_files(root)
    if not files:
        print(f"musicrel {args.command}: no .mid/.midi file in {root}", file=sys.stderr)
        return 2
    torch_setup(args, rows=params.num_samples)
    model, codec = load_model(args.checkpoint, weights=args.weights), load_codec(args.checkpoint)
    if task.check is not None:
        task.check(model, codec)
    beside = instruments_model(args, codec, task.check) if task.route is not None else None
    records, failed = [], 0
    for i, path in enumerate(files):
        paths = output_paths(path, root, out, params.num_samples)
        record = {"input": str(path), "outputs": [str(p) for p in paths], **task.record}
        records.append(record)
        if all(p.is_file() for p in paths):
            record["skipped"] = "outputs exist"
            continue
        seed = None if params.seed is None else (params.seed + i) % SEED_RANGE
        try:
            file_params = task.params(**{**options, "seed": seed})
            chosen = (model, codec)
            if beside is not None:  # what --checkpoint would flatten: the instruments model
                chosen = beside if task.route(codec, path, file_params) else chosen
                record["model"] = "instruments" if chosen is beside else "checkpoint"
            result = task.run(*chosen, path, file_params, record)
        except MusicrelError as exc:
            record["error"] = {"code": exc.code, "message": str(exc)}
            failed += 1
            print(f"musicrel {args.command}: {path}: error [{exc.code}]: {exc}", file=sys.stderr)
            continue
        for midi, p in zip(result.midis if task.files is None else task.files(result), paths, strict=True):
            write_midi(midi, p)
        record.update(
            seed=result.seed,
            **task.fields(result),
            notes=[len(n) for n in result.notes],
            decode_seconds=round(result.decode_seconds, 3),
            controls=result.controls,
            warnings=result.warnings,
        )
        if not args.quiet:
            print(f"{path} -> {', '.join(map(str, paths))}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    (out / SUMMARY_FILE).write_text(json.dumps({"files": records}, indent=1))
    print(f"{task.done(len(files) - failed, len(files))}; summary: {out / SUMMARY_FILE}")
    return 1 if failed == len(files) else 0


def run_evaluation(args, load: Callable[[], tuple], rows: Callable[[object], int] = lambda options: 8) -> int:
    """An evaluation command. `load()` imports the evaluation and returns (its options type, a dataclass;
    `evaluate(checkpoint, input, options, progress)`; `format_report(report)`; `write_report(report, out)` ->
    the paths written). The options come from the flags named as their fields (those left out are not
    passed: their defaults live in the type); the threads are set for `rows(options)` decoding rows at once;
    the report is printed and, with --out, written."""
    options_type, evaluate, format_report, write_report = load()
    options = options_type(**given(args, *(f.name for f in dataclasses.fields(options_type))))
    torch_setup(args, rows(options))
    report = evaluate(args.checkpoint, args.input, options, progress=not args.quiet)
    print(format_report(report))
    if args.out:
        paths = write_report(report, args.out)
        print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
