"""`musicrel finetune`: go on training a model folder on your own MIDI files, and export the result.

The files are prepared with the base model's own codec into WORK/data, split by file hash (80 % train, 10 %
val for early stopping, 10 % test for the before/after figures; at least one file each). Training starts from
the base weights with a low learning rate and augmentation on, validates every `val_every` steps and stops
when the validation NLL has not improved for `patience` validations (or at `max_steps`); the best validation
step is exported. The folder's MODEL_CARD.md records the base (its weights' sha256), the data (files, tokens,
a hash of the files' contents), the command, and the held-out NLL before and after.

With `instruments=True` (`--instruments`) the files are prepared with the base's codec plus INSTRUMENT tokens
(docs/INSTRUMENTS.md: every track's program, drums kept) and the base's vocabulary grows by their rows
(training/module.py `_instrument_rows`); the "before" figures are then the grown model's, untrained.

Lightning runs it (`accelerator`, `devices`, `precision` as in `musicrel train`), checkpoints every validation
into WORK and resumes from WORK's last checkpoint with `resume=True`. `FinetuneRun` holds what a run reads,
writes and runs on; `FinetuneConfig` how the model trains.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from musicrel.data.prepared import MANIFEST, load_manifest
from musicrel.errors import ConfigError, is_int
from musicrel.midi.codec import CodecConfig, EventCodec
from musicrel.model.checkpoint import load_codec, load_model, read_config, save_model, weights_sha256
from musicrel.model.config import ModelConfig
from training.evaluate import evaluate
from training.export import export_checkpoint
from training.module import MusicDataModule, MusicLM, default_precision
from training.prepare import prepare

SPLIT_PERCENT = (80, 10, 10)  # a few dozen files: enough held out to stop early and to measure on
MIN_FILES = 3  # one per split


@dataclass(frozen=True)
class FinetuneConfig:
    """How a fine-tuning run trains; defaults suit a few dozen files on a CPU (minutes)."""

    lr: float = 1e-4  # a tenth of the base recipe's: move the weights, do not forget the corpus
    warmup_steps: int = 10
    max_steps: int = 300
    val_every: int = 20  # training steps between validations
    patience: int = 3  # validations without improvement before stopping
    batch_size: int = 8
    weight_decay: float = 0.01
    min_lr_ratio: float = 0.1
    augment: bool = True
    transpose: int = 3
    seed: int = 1234
    # windows per validation and per before/after figure (None: all): a big corpus' 4.5 M held-out tokens
    # took 10 min a check
    val_windows: int | None = 256

    def __post_init__(self):
        for name in ("warmup_steps", "max_steps", "val_every", "patience", "batch_size"):
            value = getattr(self, name)
            low = 0 if name == "warmup_steps" else 1
            if not is_int(value) or value < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.val_windows is not None and (isinstance(self.val_windows, bool) or not self.val_windows >= 1):
            raise ConfigError(f"val_windows must be an integer >= 1 or None, got {self.val_windows!r}")
        if not (isinstance(self.lr, (int, float)) and 0 < self.lr < 1):
            raise ConfigError(f"lr must be in (0, 1), got {self.lr!r}")
        if not 0 <= self.transpose <= 12:
            raise ConfigError(f"transpose must be in 0..12 semitones, got {self.transpose!r}")


def prepare_with_base_codec(sources, work: Path, codec, progress: bool = True) -> dict:
    """Prepare `sources` (MIDI files/folders, or one folder of `musicrel prepare`) for fine-tuning `codec`'s
    model; refuses data the base cannot read or too little of it."""
    sources = [Path(s) for s in sources]
    if len(sources) == 1 and (sources[0] / MANIFEST).is_file():
        data = sources[0]
        manifest = load_manifest(data)
        if CodecConfig.from_dict(manifest["codec"]) != codec.config:  # fields added since: their defaults
            raise ConfigError(
                f"{data} was prepared with other codec settings than the base model's "
                f"({manifest['codec']} vs {codec.config.to_dict()}); give the MIDI files instead",
                code="codec_mismatch",
            )
    else:
        data = work / "data"
        manifest = prepare(
            sources, data, codec=codec, workers=1, progress=progress, split_percent=SPLIT_PERCENT
        )
    encoded = manifest["counts"]["encoded"]
    if encoded < MIN_FILES:
        why = f" (skipped: {manifest['skipped_by_code']})" if manifest["skipped_by_code"] else ""
        raise ConfigError(
            f"fine-tuning needs at least {MIN_FILES} MIDI files that encode (train, val, test); "
            f"{manifest['counts']['found']} found, {encoded} usable{why}",
            code="too_few_files",
        )
    return {"dir": data, "manifest": manifest}


def data_summary(manifest: dict) -> dict:
    """Files and tokens per split, and one hash of every file's content (sorted), for the card."""
    shas = sorted(f["sha256"] for split in manifest["splits"].values() for f in split["files"])
    return {
        "files": {s: info["pieces"] for s, info in manifest["splits"].items()},
        "tokens": {s: info["event_tokens"] for s, info in manifest["splits"].items()},
        "skipped": manifest["counts"]["skipped"],
        "sha256": hashlib.sha256("\n".join(shas).encode()).hexdigest(),
    }


def build_module(base, codec, fc: FinetuneConfig) -> MusicLM:
    """A MusicLM with the base model's configuration and weights and the fine-tuning schedule; a codec with
    more tokens than the base's (instruments) grows its vocabulary as `model.init_from` does."""
    config = read_config(base)["model"]
    grows = codec.vocab_size != config["vocab_size"]
    lm = MusicLM(
        ModelConfig.from_dict({**config, "vocab_size": codec.vocab_size}),
        codec=codec.config.to_dict(),
        lr=fc.lr,
        weight_decay=fc.weight_decay,
        warmup_steps=fc.warmup_steps,
        decay_steps=fc.max_steps,
        min_lr_ratio=fc.min_lr_ratio,
        init_from=str(base) if grows else None,
    )
    if not grows:
        lm.model.load_state_dict(load_model(base).state_dict())
    return lm


def with_instruments(codec) -> EventCodec:
    """The base's codec with INSTRUMENT tokens (the same codec when it has them)."""
    if codec.config.instruments:
        return codec
    return EventCodec(CodecConfig.from_dict({**codec.config.to_dict(), "instruments": True}))


class _Estimate(Callback):
    """One line after the first validation: the measured pace and the longest the run can still take."""

    def __init__(self):
        self.start = None
        self.said = False

    def on_train_start(self, trainer, pl_module):
        self.start, self.first_step = time.perf_counter(), trainer.global_step

    def on_validation_end(self, trainer, pl_module):
        steps = trainer.global_step - self.first_step
        if self.said or steps <= 0 or trainer.sanity_checking:
            return
        per_step = (time.perf_counter() - self.start) / steps
        left = max(0, trainer.max_steps - trainer.global_step) * per_step
        print(
            f"finetune: {per_step:.2f} s a step (validation included); at most {left / 60:.1f} min more "
            f"for {trainer.max_steps} steps, less if the validation NLL stops improving",
            file=sys.stderr,
        )
        self.said = True


@dataclass(frozen=True)
class FinetuneRun:
    """What one fine-tuning run reads and writes, and how Lightning runs it (as in `musicrel train`)."""

    base: Path  # the model folder to start from
    sources: tuple  # MIDI files or folders, or one folder of `musicrel prepare`
    out: Path  # the model folder to write
    work: Path | None = None  # prepared data, logs, checkpoints (None: OUT.work)
    accelerator: str = "auto"
    devices: str | int = "auto"
    precision: str | None = None  # None: default_precision()
    max_time: str | None = None  # DD:HH:MM:SS
    resume: bool = False  # from WORK's last checkpoint
    progress: bool = True
    command: str | None = None  # for the card (None: this process' own command line)
    instruments: bool = False  # prepare with INSTRUMENT tokens and grow the base's vocabulary by them

    def __post_init__(self):
        if isinstance(self.sources, (str, Path)) or not self.sources:
            raise ConfigError(
                f"sources must be a non-empty list of paths, got {self.sources!r}", code="bad_sources"
            )
        set_ = object.__setattr__  # frozen: normalise once, here
        set_(self, "base", Path(self.base))
        set_(self, "out", Path(self.out))
        set_(self, "sources", tuple(self.sources))
        set_(
            self,
            "work",
            Path(self.work) if self.work is not None else self.out.with_name(self.out.name + ".work"),
        )


def finetune(run: FinetuneRun, config: FinetuneConfig | None = None) -> dict:
    """Fine-tune the model folder `run.base` on `run.sources`; export the best validation step to `run.out`.
    Returns the summary written into the card (and `out`/finetune.json)."""
    fc = config or FinetuneConfig()
    base, out, work, sources = run.base, run.out, run.work, run.sources
    codec = load_codec(base)  # also checks that base is a model folder
    if run.instruments:
        codec = with_instruments(codec)
    last = work / "checkpoints" / "last.ckpt"
    if run.resume and not last.is_file():
        raise ConfigError(f"nothing to resume: no {last}", code="nothing_to_resume")
    base_sha = weights_sha256(base)
    prepared = prepare_with_base_codec(sources, work, codec, progress=run.progress)
    data = prepared["dir"]

    lm = build_module(base, codec, fc)
    dm = MusicDataModule(
        str(data),
        batch_size=fc.batch_size,
        seq_len=lm.cfg.max_seq_len,
        examples_per_epoch=fc.val_every * fc.batch_size,  # one "epoch" = the steps between validations
        val_windows=fc.val_windows,
        seed=fc.seed,
        augment=fc.augment,
        transpose=fc.transpose,
    )
    best = ModelCheckpoint(
        dirpath=work / "checkpoints",
        monitor="val_nll",
        mode="min",
        save_top_k=1,
        save_last=True,
        filename="best-{step}",
    )
    # strict=False: a run resumed from the checkpoint written at a validation ends that "epoch" with no batch
    # left, and so with no val_nll to check (Lightning would raise).
    trainer = L.Trainer(
        max_steps=fc.max_steps,
        max_epochs=-1,
        max_time=run.max_time,
        accelerator=run.accelerator,
        devices=run.devices,
        precision=run.precision or default_precision(run.accelerator),
        gradient_clip_val=1.0,
        num_sanity_val_steps=0,
        callbacks=[
            best,
            EarlyStopping("val_nll", mode="min", patience=fc.patience, strict=False),
            _Estimate(),
        ],
        logger=CSVLogger(work, name="logs"),
        default_root_dir=work,
        enable_progress_bar=run.progress,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    scored = base
    if lm.cfg.vocab_size != read_config(base)["model"]["vocab_size"]:  # the grown model, as it starts
        scored = save_model(lm.model, work / "grown", codec=codec)
    before = {s: evaluate(scored, data, split=s, max_windows=fc.val_windows)["nll"] for s in ("val", "test")}
    start = time.perf_counter()
    L.seed_everything(fc.seed, verbose=False)
    trainer.fit(lm, datamodule=dm, ckpt_path=str(last) if run.resume else None)
    seconds = time.perf_counter() - start
    chosen = best.best_model_path or str(last)

    export_checkpoint(chosen, out)
    after = {s: evaluate(out, data, split=s, max_windows=fc.val_windows)["nll"] for s in ("val", "test")}
    summary = {
        "base": {"path": str(base), "weights_sha256": base_sha, "grown": scored != base},
        "data": {"sources": [str(s) for s in sources], **data_summary(prepared["manifest"])},
        "config": asdict(fc),
        "steps": int(trainer.global_step),
        "best_checkpoint": Path(chosen).name,
        "stopped_early": bool(trainer.global_step < fc.max_steps and trainer.should_stop),
        "seconds": round(seconds, 1),
        "device": str(trainer.strategy.root_device),
        "nll_before": before,
        "nll_after": after,
        "command": run.command or "musicrel finetune " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
    }
    (out / "finetune.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "MODEL_CARD.md").write_text(model_card(summary, lm))
    return summary


def model_card(s: dict, lm: MusicLM) -> str:
    cfg, c, d = lm.cfg, s["config"], s["data"]
    rows = "\n".join(
        f"| {split} ({d['files'][split]} files, {d['tokens'][split]:,} tokens) "
        f"| {s['nll_before'][split]:.4f} | {s['nll_after'][split]:.4f} "
        f"| {100 * (s['nll_after'][split] / s['nll_before'][split] - 1):+.1f} % |"
        for split in ("val", "test")
    )
    arch = f"{cfg.attention}, {cfg.n_layers} x {cfg.d_model}, {cfg.n_heads} heads, context {cfg.max_seq_len}"
    stop = "stopped early" if s["stopped_early"] else "ran to the cap"
    grown = (
        " with INSTRUMENT tokens (its vocabulary grown; 'base' below: the grown model)"
        if s["base"].get("grown")
        else ""
    )
    return f"""# musicrel model, fine-tuned

Fine-tuned from `{s["base"]["path"]}` (weights sha256 `{s["base"]["weights_sha256"]}`) with

    {s["command"]}

- architecture: {arch} ({lm.model.num_parameters():,} parameters), the base's codec{grown}
- data: {d["files"]["train"]} training files ({d["tokens"]["train"]:,} tokens), {d["skipped"]} skipped;
  content hash `{d["sha256"]}`
- training: {s["steps"]} steps of {c["batch_size"]} x {cfg.max_seq_len} tokens, lr {c["lr"]:g},
  augmentation {"on" if c["augment"] else "off"}, {stop}; exported `{s["best_checkpoint"]}`;
  {s["seconds"]:.0f} s on {s["device"]}

Held-out NLL (nats/token) on the files kept out of fine-tuning (split by file hash):

| split | base | fine-tuned | change |
|---|---|---|---|
{rows}

finetune.json beside this card holds the same figures.
"""
