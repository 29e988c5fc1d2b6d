"""Lightning side of training: the LightningModule around MusicTransformer, the DataModule over a prepared
folder, and the LightningCLI that reads configs/*.yaml (+ command-line overrides) for `musicrel train`.

The YAML's `model:` section holds `config:` (a ModelConfig, read whole) and the optimiser settings; the
config's `vocab_size` and the codec settings are not written there: they come from the prepared data
(`data.data_dir`'s manifest) and are linked into the module, whose hyper-parameters (plain JSON-able types)
therefore hold everything `musicrel export` needs.
"""

from __future__ import annotations

import math
import time
import warnings
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LightningCLI
from torchmetrics import MeanMetric

from musicrel.data.prepared import crop_weights, load_manifest, load_split, source_ranges
from musicrel.model.config import ModelConfig
from musicrel.model.transformer import MusicTransformer
from training.data import STRETCH_FACTORS, CropDataset, ResumableLoader, ResumableSampler, WindowDataset


class MusicLM(L.LightningModule):
    """Next-event prediction with a MusicTransformer; loss and NLL in nats per token."""

    def __init__(
        self,
        config: ModelConfig,
        codec: dict | None = None,
        lr: float = 3e-4,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        warmup_steps: int = 200,
        decay_steps: int | None = None,
        min_lr_ratio: float = 0.1,
        label_smoothing: float = 0.0,
        compile: bool | None = None,
        init_from: str | None = None,
    ):
        """
        Args:
            config: The model (musicrel/model/config.py), the YAML's `model.config` section; its vocab_size
                is linked from the prepared data's codec (not set in the YAML).
            codec: Linked codec settings (CodecConfig.to_dict()) of the prepared data; saved for export.
            lr: Peak learning rate of AdamW, reached after `warmup_steps` of linear warm-up.
            decay_steps: Steps of the cosine decay to `min_lr_ratio * lr` (default: trainer.max_steps, else
                the estimated steps of the run).
            label_smoothing: Optimised loss only; the logged NLL is always the plain cross-entropy.
            compile: torch.compile the model; None = only on a GPU.
            init_from: A model folder (e.g. checkpoints/default) whose weights training starts from, so that
                what it learnt is extended rather than relearnt; its shape and codec must be this run's.
                A resumed run takes the weights of its Lightning checkpoint instead.
        """
        super().__init__()
        # A checkpoint's hyper-parameters hold plain types only (export reads it with weights_only=True), so
        # the config is kept there as its dict; load_from_checkpoint hands that dict back.
        self.cfg = config if isinstance(config, ModelConfig) else ModelConfig.from_dict(dict(config))
        self.save_hyperparameters(ignore=["config"])
        self.hparams["config"] = self.cfg.to_dict()
        self.model = MusicTransformer(self.cfg)
        if init_from:
            self.model.load_state_dict(_weights_from(init_from, self.cfg, codec))
        self.val_nll = MeanMetric()
        self.val_acc = MeanMetric()
        # one per validation loader of a multi-source folder (`setup`), logged as val_nll/<source>
        self.val_source_names: list[str] = []
        self.val_source_nll = torch.nn.ModuleList()
        self._last_step_time: float | None = None
        self.skipped_steps = 0  # steps whose loss or gradients were not finite (`on_before_optimizer_step`)

    def configure_model(self) -> None:
        want = self.hparams.compile
        if want or (want is None and torch.cuda.is_available()):
            self.model.compile()  # in place: state_dict keys stay those of the plain model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens)

    def _loss(self, batch, smoothing: float = 0.0):
        logits = self.model(batch["inputs"])  # (B, T, V)
        targets = batch["targets"]  # (B, T), -100 = padding
        flat_logits, flat_targets = logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1)
        nll = F.cross_entropy(flat_logits, flat_targets, ignore_index=-100)
        loss = nll
        if smoothing:
            loss = F.cross_entropy(flat_logits, flat_targets, ignore_index=-100, label_smoothing=smoothing)
        mask = flat_targets != -100
        n = mask.sum()
        acc = ((flat_logits.argmax(-1) == flat_targets) & mask).sum() / n.clamp(min=1)
        return loss, nll, acc, n

    def training_step(self, batch, batch_idx):
        loss, nll, acc, n = self._loss(batch, self.hparams.label_smoothing)
        now = time.perf_counter()
        bs = batch["inputs"].size(0)
        self.log("train/loss", loss, prog_bar=True, batch_size=bs)
        self.log("train/nll", nll, batch_size=bs)
        self.log("train/acc", acc, batch_size=bs)
        self.log("lr", self.lr_schedulers().get_last_lr()[0], prog_bar=True, batch_size=bs)
        if self._last_step_time is not None:
            # Wall time since the previous step: forward+backward+optimizer+data of one step.
            rate = float(n) * self.trainer.world_size / max(now - self._last_step_time, 1e-9)
            self.log("train/tokens_per_s", rate, prog_bar=True, batch_size=bs)
        self._last_step_time = now
        if not torch.isfinite(loss):  # Lightning skips the backward and the update of a None step
            self._skip()
            return None
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        """Skip an update whose gradients are not finite (AdamW leaves a parameter without a gradient as it
        is), rather than let one bad step turn every weight into NaN for the rest of the run, as happened on
        an H100 (bf16-mixed, skew attention through SDPA with a float mask, 9.5 M parameters at context
        1024: after 3,000 steps at lr 1e-3, 7,500 at 5e-4, 1,000 at 2.5e-4; docs/TRAINING.md). Costs one
        reduction and one host sync a step."""
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads and not torch.isfinite(torch.stack(torch._foreach_norm(grads)).sum()):
            optimizer.zero_grad(set_to_none=True)
            self._skip()

    def _skip(self) -> None:
        self.skipped_steps += 1
        self.log("train/skipped_steps", float(self.skipped_steps), reduce_fx="max")

    def on_train_epoch_start(self) -> None:
        self._last_step_time = None

    def setup(self, stage: str) -> None:
        self.val_source_names = list(getattr(self.trainer.datamodule, "val_sources", None) or [])
        self.val_source_nll = torch.nn.ModuleList(MeanMetric() for _ in self.val_source_names)

    def validation_step(self, batch, batch_idx, dataloader_idx: int = 0):
        _, nll, acc, n = self._loss(batch)
        self.val_nll.update(nll, weight=n)
        self.val_acc.update(acc, weight=n)
        if self.val_source_nll:
            self.val_source_nll[dataloader_idx].update(nll, weight=n)

    def on_validation_epoch_end(self) -> None:
        if self.val_nll.update_count == 0:
            return
        for name, metric in zip(self.val_source_names, self.val_source_nll, strict=True):
            if metric.update_count:
                self.log(f"val_nll/{name}", metric.compute())
            metric.reset()
        nll = self.val_nll.compute()
        self.log("val_nll", nll, prog_bar=True)  # MeanMetric.compute() already syncs ranks
        self.log("val_ppl", torch.exp(nll))
        self.log("val_acc", self.val_acc.compute())
        self.val_nll.reset()
        self.val_acc.reset()
        self._last_step_time = None  # validation time is not training throughput

    def configure_optimizers(self):
        hp = self.hparams
        decay, no_decay = [], []
        for p in self.model.parameters():
            if p.requires_grad:
                (decay if p.dim() >= 2 else no_decay).append(p)
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=hp.lr,
            betas=tuple(hp.betas),
            fused=None,
        )
        total = hp.decay_steps
        if total is None:
            total = (
                self.trainer.max_steps
                if self.trainer.max_steps > 0
                else self.trainer.estimated_stepping_batches
            )
        total = max(int(total), hp.warmup_steps + 1)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: lr_factor(step, hp.warmup_steps, total, hp.min_lr_ratio)
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _weights_from(folder: str, cfg: ModelConfig, codec: dict | None) -> dict:
    """The state dict of a model folder, refused (saying which settings differ) unless its shape and codec
    are `cfg`'s and `codec`'s. Dropout and query chunking do not change the weights and may differ, and so
    may the codec's reading policies (tracks, caps). A model without melody tokens can start one with them:
    its rows are kept and a MELODY_ON/OFF row starts as the NOTE_ON/OFF row of its pitch; likewise a model
    without infill markers can start one with them (each FUTURE/PAST/FILL row starts as the bos row), and a
    model without instruments one with them (`_instrument_rows`)."""
    from musicrel.errors import ConfigError
    from musicrel.midi.codec import CodecConfig, EventCodec
    from musicrel.model.checkpoint import load_model, read_config

    saved = read_config(folder)
    free = {"dropout", "query_chunk_size", "vocab_size"}
    ours = {k: v for k, v in cfg.to_dict().items() if k not in free}
    theirs = {k: v for k, v in saved["model"].items() if k not in free}
    differ = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
    if differ:
        diff = ", ".join(f"{k} {theirs.get(k)!r} there, {ours.get(k)!r} here" for k in differ)
        raise ConfigError(f"init_from {folder}: the model's shape differs ({diff})", code="shape_mismatch")
    state = load_model(folder).state_dict()
    old = EventCodec(CodecConfig.from_dict(saved["codec"])) if saved.get("codec") else None
    new = EventCodec(CodecConfig.from_dict(codec)) if codec is not None else old
    meaning = ("step_ms", "max_shift_steps", "velocity_bins", "pedal")
    if old is None or new is None:
        same = codec is None
    else:
        same = all(getattr(old.config, k) == getattr(new.config, k) for k in meaning)
        same &= old.config.melody == new.config.melody or not old.config.melody
        same &= old.config.infill == new.config.infill or not old.config.infill
        same &= old.config.instruments == new.config.instruments or not old.config.instruments
    if not same:
        raise ConfigError(
            f"init_from {folder}: the model was trained with other codec settings than the data's "
            f"({saved.get('codec')} vs {codec})",
            code="codec_mismatch",
        )
    if old is not None and new.vocab_size != old.vocab_size:
        source = np.arange(new.vocab_size)  # the old row each new row starts from
        source[new.pad_id : new.pad_id + 3] = [old.pad_id, old.bos_id, old.eos_id]
        if old.melody_on_offset is not None:
            source[new.melody_on_offset : new.melody_off_offset + 128] = np.arange(
                old.melody_on_offset, old.melody_off_offset + 128
            )
        elif new.melody_on_offset is not None:
            source[new.melody_on_offset : new.melody_on_offset + 128] = old.note_on_offset + np.arange(128)
            source[new.melody_off_offset : new.melody_off_offset + 128] = old.note_off_offset + np.arange(128)
        if old.fill_id is not None:
            source[new.future_id : new.fill_id + 1] = [old.future_id, old.past_id, old.fill_id]
        elif new.fill_id is not None:  # each marker starts a segment, as bos starts a piece
            source[new.future_id : new.fill_id + 1] = old.bos_id
        if new.instrument_offset is not None:  # old's rows, or placeholders `_instrument_rows` replaces
            count = new.num_instruments
            rows = slice(new.instrument_offset, new.instrument_offset + count)
            if old.instrument_offset is not None:  # each its own, the drums' included
                source[rows] = old.instrument_offset + np.arange(count)
            else:
                source[rows] = old.note_on_offset + np.arange(count) % 128
        index = torch.as_tensor(source)
        state = {
            k: v.index_select(0, index) if k in ("tok_emb.weight", "head.weight") else v
            for k, v in state.items()
        }
        if new.instrument_offset is not None and old.instrument_offset is None:
            state = _instrument_rows(state, new, cfg.tie_embeddings)
    if cfg.vocab_size != state["tok_emb.weight"].shape[0]:
        raise ConfigError(
            f"init_from {folder}: vocab_size {state['tok_emb.weight'].shape[0]} there, {cfg.vocab_size} here",
            code="shape_mismatch",
        )
    return state


# The spread of the new INSTRUMENT rows around their start, as a share of the note-on rows' own spread.
INSTRUMENT_ROW_NOISE = 0.1


def _instrument_rows(state: dict, codec, tied: bool) -> dict:
    """A piano model's vocabulary grown by INSTRUMENT tokens: each new row starts as the mean of the NOTE_ON
    rows plus a little noise. Why: an INSTRUMENT token stands where note events are and announces the notes
    after it, so the mean note-on row puts it in the part of the embedding space the layers already read as
    "a note is played here" (no new token may look like a time shift or a special to them); with the head
    tied, its logit starts near a typical note-on's rather than anywhere, and training only has to move it.
    The noise (INSTRUMENT_ROW_NOISE of the note-on rows' spread, a fixed generator, so a run is repeatable)
    makes the 129 rows differ, so the instruments can be told apart from the first step. The head row is the
    same tensor as the embedding's where they are tied."""
    emb = state["tok_emb.weight"].clone()
    notes = emb[codec.note_on_offset : codec.note_on_offset + 128]
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn(codec.num_instruments, emb.size(1), generator=gen, dtype=emb.dtype)
    rows = notes.mean(dim=0) + INSTRUMENT_ROW_NOISE * notes.std(dim=0) * noise
    emb[codec.instrument_offset : codec.instrument_offset + codec.num_instruments] = rows
    out = dict(state, **{"tok_emb.weight": emb})
    if "head.weight" in state:
        head = state["head.weight"]
        if tied:
            out["head.weight"] = emb
        else:  # an untied head: its own note-on rows' mean, the same noise scaled to them
            head = head.clone()
            hn = head[codec.note_on_offset : codec.note_on_offset + 128]
            head[codec.instrument_offset : codec.instrument_offset + codec.num_instruments] = (
                hn.mean(dim=0) + INSTRUMENT_ROW_NOISE * hn.std(dim=0) * noise
            )
            out["head.weight"] = head
    return out


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up to 1, then cosine decay to min_ratio at `total`, flat after."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class MusicDataModule(L.LightningDataModule):
    """A folder of `musicrel prepare`: random augmented crops for training, fixed windows for validation.

    The codec is the one the folder was prepared with (its manifest); `vocab_size` and `codec_config` are
    linked into the model.
    """

    def __init__(
        self,
        data_dir: str,
        batch_size: int = 8,
        seq_len: int = 1024,
        examples_per_epoch: int | None = None,
        val_windows: int | None = 256,
        num_workers: int = 0,
        seed: int = 0,
        augment: bool = True,
        transpose: int = 3,
        stretch: list[float] = list(STRETCH_FACTORS),  # noqa: B006 (jsonargparse reads the default)
        infill_rate: float = 0.0,
        infill_loss: str = "all",
        source_weights: dict[str, float] | None = None,
    ):
        """
        Args:
            data_dir: Output folder of `musicrel prepare`.
            seq_len: Tokens per example (linked from model.config.max_seq_len).
            examples_per_epoch: Random crops per epoch (default: train tokens / seq_len).
            val_windows: At most this many non-overlapping validation windows (None = the whole split).
            seed: Crop positions and augmentations are a function of (seed, epoch, index).
            transpose: Transpose by a uniform integer in [-transpose, transpose] semitones.
            stretch: Time-stretch factors drawn uniformly.
            infill_rate: The share of training crops made infill examples (training/data.py, docs/INFILL.md);
                > 0 adds the infill markers to the codec (and the model's vocabulary) without a re-prepare
                (a folder with instruments is read with its INSTRUMENT ids moved: `codec.id_map`).
            infill_loss: "all" (an infill example's future, past and gap tokens) or "gap" (its gap only).
            source_weights: Weights by source name replacing those the folder was prepared with (`prepare
                --weight`) for this run's crops: a mix of its own without a re-prepare.
        """
        super().__init__()
        self.save_hyperparameters()
        manifest = load_manifest(data_dir)
        self.codec_config: dict = manifest["codec"]
        self.vocab_size: int = int(manifest["vocab_size"])
        self.pad_id: int = int(manifest["pad_id"])
        self._ids = None  # the prepared ids as the model's codec spells them (None: the same)
        if infill_rate > 0 and not self.codec_config.get("infill"):
            # the markers come after eos: the vocabulary grows, and INSTRUMENT ids (after the markers) move
            from musicrel.midi.codec import CodecConfig, EventCodec, id_map

            prepared = EventCodec(CodecConfig.from_dict(self.codec_config))
            self.codec_config = {**self.codec_config, "infill": True}
            model = EventCodec(CodecConfig.from_dict(self.codec_config))
            self.vocab_size, self._ids = model.vocab_size, id_map(prepared, model)
        self.manifest = manifest
        self.weights = crop_weights(manifest, source_weights)  # checked here: a bad name fails at once
        self._codec = None

    def source_parts(self, split: str) -> list[tuple[int, int, float]] | None:
        """(start, end, weight) of each source in the split's stream (None: the stream is one part)."""
        ranges = source_ranges(self.manifest, split)
        return [(a, b, self.weights.get(name, 1.0)) for name, (a, b) in ranges.items()] or None

    @property
    def codec(self):
        if self._codec is None:
            from musicrel.midi.codec import CodecConfig, EventCodec

            self._codec = EventCodec(CodecConfig.from_dict(self.codec_config))
        return self._codec

    def _stream(self, split: str) -> np.ndarray:
        """A split's tokens with the model's ids (memory-mapped where they are the prepared ones)."""
        stream, _ = load_split(self.hparams.data_dir, split)
        return stream if self._ids is None else self._ids[stream].astype(stream.dtype)

    def train_dataloader(self):
        hp = self.hparams
        stream = self._stream("train")
        n = hp.examples_per_epoch or max(1, (stream.size - 1) // hp.seq_len)
        ds = CropDataset(
            stream,
            hp.seq_len,
            self.codec,
            n,
            seed=hp.seed,
            transpose=hp.transpose,
            stretch=tuple(hp.stretch),
            augment=hp.augment,
            sources=self.source_parts("train"),
            infill_rate=hp.infill_rate,
            infill_loss=hp.infill_loss,
        )
        trainer = self.trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        return ResumableLoader(
            ds,
            batch_size=hp.batch_size,
            sampler=ResumableSampler(n, num_replicas=world, rank=rank),
            drop_last=True,
            num_workers=hp.num_workers,
            persistent_workers=False,
        )

    @property
    def val_sources(self) -> list[str]:
        """The sources with validation tokens, one loader each (empty: one loader over the whole split)."""
        return list(source_ranges(self.manifest, "val"))

    def val_dataloader(self):
        hp = self.hparams
        stream = np.asarray(self._stream("val"))

        def loader(part, limit):
            ds = WindowDataset(part, hp.seq_len, self.pad_id, limit=limit)
            return torch.utils.data.DataLoader(ds, batch_size=hp.batch_size, num_workers=hp.num_workers)

        names = self.val_sources
        if not names:
            return loader(stream, hp.val_windows)
        # val_windows is shared out among the sources: the first windows of the stream would be one source's
        each = None if hp.val_windows is None else max(1, hp.val_windows // len(names))
        return [loader(stream[a:b], each) for a, b in source_ranges(self.manifest, "val").values()]


def default_precision(accelerator: str = "auto") -> str:
    """bf16 mixed precision where the hardware computes in bfloat16 (a GPU that has it; a CPU with AVX512-BF16
    or AMX), else full float32. A CPU without it emulates bfloat16, and slowly: on this project's 2-core AMD
    EPYC (Zen 1, AVX2) a step of 8 x 512 tokens (3 x 192, 2 threads) took 11.1 s in bf16 autocast against
    1.66 s in float32, where an earlier machine of the same kind took 0.55 s against 0.70
    (docs/log/training.md)."""
    if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "32-true"
    return "bf16-mixed" if cpu_has_bf16() else "32-true"


def cpu_has_bf16() -> bool:
    """Whether this CPU computes in bfloat16 natively (torch's own check of its instruction sets)."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


class MusicCLI(LightningCLI):
    """LightningCLI with the links between data and model, CSV + TensorBoard loggers by default, and the
    loss printed as it goes with the checkpoints' paths at the end (`TrainingProgress`)."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("model.config.max_seq_len", "data.seq_len")
        parser.link_arguments("data.vocab_size", "model.config.vocab_size", apply_on="instantiate")
        parser.link_arguments("data.codec_config", "model.codec", apply_on="instantiate")
        parser.add_argument(
            "--run_name", default="run", help="Logs go to <trainer.default_root_dir>/<run_name>/"
        )

    def instantiate_trainer(self, **kwargs):
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        trainer = config["trainer"]
        accelerator = str(trainer.get("accelerator") or "auto")
        if trainer.get("precision") is None:
            kwargs["precision"] = default_precision(accelerator)
        elif str(trainer["precision"]).startswith("bf16") and default_precision(accelerator) == "32-true":
            import sys

            print(
                f"musicrel train: precision {trainer['precision']} on hardware without native bfloat16 is "
                "emulated and several times slower than 32-true here (leave precision unset to choose)",
                file=sys.stderr,
            )
        if trainer.get("logger") in (None, True):  # unset: CSV + TensorBoard side by side in one run folder
            from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

            root = Path(trainer.get("default_root_dir") or "runs")
            csv = CSVLogger(root, name=config["run_name"])
            tb = TensorBoardLogger(
                root, name=config["run_name"], version=csv.version, default_hp_metric=False
            )
            kwargs["logger"] = [csv, tb]
        # The loss as it goes and, at the end, where the checkpoints went (training/progress.py).
        from training.progress import TrainingProgress

        given = trainer.get("callbacks")
        given = [] if given is None else list(given) if isinstance(given, list) else [given]
        kwargs["callbacks"] = [*given, TrainingProgress()]
        return super().instantiate_trainer(**kwargs)


def _choose_threads() -> None:
    """torch's threads for training (runtime.threads): OMP_NUM_THREADS if set, else the CPUs other processes
    leave free. On the shared 2-core machine a step of two threads took 3.5x as long as one whenever
    anything else ran (3.78 s vs 1.06 s, 8 x 512 tokens, bf16): a team waits at every barrier for the thread
    the scheduler parked."""
    import sys

    from musicrel.runtime.threads import TRAINING_ROWS, set_torch_threads

    print(f"musicrel train: {set_torch_threads(rows=TRAINING_ROWS)}", file=sys.stderr)


def run_cli(argv: list[str]) -> None:
    """`musicrel train ARGS` = LightningCLI `fit ARGS` (`--resume PATH` is `--ckpt_path PATH`)."""
    args = []
    it = iter(argv)
    for a in it:
        if a == "--resume":
            args += ["--ckpt_path", next(it, "")]
        elif a.startswith("--resume="):
            args.append("--ckpt_path=" + a.split("=", 1)[1])
        else:
            args.append(a)
    _choose_threads()
    # LightningCLI warns when given args while sys.argv is non-empty: here forwarding them is the point.
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
    MusicCLI(
        MusicLM,
        MusicDataModule,
        args=["fit", *args],
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"fit": {"description": "Train a Music Transformer (musicrel train)."}},
    )
