"""What `musicrel train` prints as it goes: the training loss every `log_every_n_steps` steps, the validation
NLL after each validation, and at the end where the checkpoints went (with the command that exports one).

Wired in by `training.module.MusicCLI` for every run, whatever the config's callbacks; it writes through the
progress bar when one is shown (so the bar is not torn) and only on the first process of a multi-GPU run.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import TextIO

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint


def _value(x) -> float | None:
    """A float from a tensor, a number or a {"loss": tensor} step output; None when there is none."""
    if isinstance(x, dict):
        x = x.get("loss")
    if x is None:
        return None
    try:
        return float(x.detach().float().item() if hasattr(x, "detach") else x)
    except (TypeError, ValueError, RuntimeError):
        return None


def _shown(path: str | Path) -> str:
    """A checkpoint path as the user can type it: relative to the working folder when inside it."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


class TrainingProgress(Callback):
    """Prints `step N/M  loss X` lines, `val_nll` after validations, and the checkpoints' paths at the end."""

    def __init__(self, every_n_steps: int | None = None, stream: TextIO | None = None):
        self.every_n_steps = every_n_steps
        self.stream = stream
        self._start: float | None = None
        self._done = False

    def _print(self, trainer: L.Trainer, line: str) -> None:
        if not trainer.is_global_zero:
            return
        bar = trainer.progress_bar_callback
        if bar is not None and self.stream is None and hasattr(bar, "print"):
            bar.print(line)
        else:
            print(line, file=self.stream or sys.stdout, flush=True)

    def _elapsed(self) -> str:
        return f"{time.perf_counter() - (self._start or time.perf_counter()):.0f} s"

    def on_train_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()
        self._done = False
        limit = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        total = f"{limit} steps" if limit else "no step limit"
        logs = _shown(trainer.log_dir) if trainer.log_dir else "none"
        self._print(trainer, f"training from step {trainer.global_step} ({total}); logs: {logs}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        every = self.every_n_steps or max(1, trainer.log_every_n_steps)
        at_end = trainer.max_steps and trainer.max_steps > 0 and step >= trainer.max_steps
        if step % every and not at_end:
            return
        loss = _value(outputs)
        if loss is None:
            loss = _value(trainer.callback_metrics.get("train/loss"))
        total = f"/{trainer.max_steps}" if trainer.max_steps and trainer.max_steps > 0 else ""
        shown = "n/a" if loss is None or not math.isfinite(loss) else f"{loss:.4f}"
        self._print(trainer, f"step {step}{total}  loss {shown}  ({self._elapsed()})")

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        nll = _value(trainer.callback_metrics.get("val_nll"))
        if nll is not None:
            self._print(trainer, f"step {trainer.global_step}  val_nll {nll:.4f}  ({self._elapsed()})")

    def _report(self, trainer: L.Trainer) -> None:
        if self._done:
            return
        self._done = True
        last = best = None
        best_score = monitor = None
        for cb in trainer.checkpoint_callbacks:
            if not isinstance(cb, ModelCheckpoint):
                continue
            if cb.last_model_path and last is None:
                last = cb.last_model_path
            if cb.monitor and cb.best_model_path and best is None:
                best, best_score, monitor = cb.best_model_path, _value(cb.best_model_score), cb.monitor
        if last is None and best is None:
            self._print(trainer, f"done at step {trainer.global_step} ({self._elapsed()}); no checkpoint")
            return
        self._print(trainer, f"done at step {trainer.global_step} ({self._elapsed()}); checkpoints:")
        if last:
            self._print(trainer, f"  last: {_shown(last)}")
        if best:
            score = "" if best_score is None else f" ({monitor} {best_score:.4f})"
            self._print(trainer, f"  best: {_shown(best)}{score}")
        self._print(trainer, f"export one: musicrel export {_shown(last or best)} --out checkpoints/NAME")

    def on_fit_end(self, trainer, pl_module) -> None:
        self._report(trainer)

    def on_exception(self, trainer, pl_module, exception) -> None:
        if isinstance(exception, KeyboardInterrupt):
            self._report(trainer)
