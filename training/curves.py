"""`musicrel curves`: validation NLL against training time for several runs, per source, side by side.

Runs that shared a machine with other work ran slower than they would alone, and by different amounts; so
time is each run's steps times its seconds per step measured alone (`musicrel bench train`), given with the
run: `LABEL=RUN_DIR:SECONDS_PER_STEP`. RUN_DIR is a Lightning version folder (its
metrics.csv); a run resumed into a new version folder is given as several folders joined by `+`.
"""

from __future__ import annotations

import csv
from pathlib import Path

from musicrel.errors import ConfigError


def parse_run(spec: str) -> tuple[str, list[Path], float]:
    """`LABEL=DIR[+DIR...]:SECONDS_PER_STEP` -> (label, folders, seconds per step)."""
    label, sep, rest = spec.partition("=")
    dirs, sep2, pace = rest.rpartition(":")
    try:
        seconds = float(pace)
    except ValueError:
        seconds = -1.0
    if not (sep and sep2 and label and dirs) or not seconds > 0:
        raise ConfigError(f"a run is LABEL=RUN_DIR:SECONDS_PER_STEP, got {spec!r}", code="bad_run")
    folders = [Path(d) for d in dirs.split("+")]
    for f in folders:
        if not (f / "metrics.csv").is_file():
            raise ConfigError(f"{f} has no metrics.csv (a Lightning version folder?)", code="bad_run")
    return label, folders, seconds


def validation_curve(folders: list[Path]) -> dict[str, list[tuple[int, float]]]:
    """metric -> [(step, value)] of every val_nll column (pooled and per source), later folders winning."""
    out: dict[str, dict[int, float]] = {}
    for folder in folders:
        with open(folder / "metrics.csv") as f:
            for row in csv.DictReader(f):
                for key, value in row.items():
                    if key and key.startswith("val_nll") and value:
                        out.setdefault(key, {})[int(row["step"])] = float(value)
    return {k: sorted(v.items()) for k, v in out.items()}


def at_time(curve: list[tuple[int, float]], seconds_per_step: float, seconds: float) -> float | None:
    """The last validation at or before `seconds` of training (None if none was)."""
    done = [v for step, v in curve if step * seconds_per_step <= seconds * (1 + 1e-9)]
    return done[-1] if done else None


def curves(specs: list[str], out: Path | None = None) -> str:
    """The table (markdown: each run's NLL per source at the time the shortest run ended, and at its own end)
    and, with `out`, the plot: one panel per metric, a line per run."""
    runs = [(label, validation_curve(folders), pace) for label, folders, pace in map(parse_run, specs)]
    metrics = sorted({m for _, c, _ in runs for m in c}, key=lambda m: (m != "val_nll", m))
    if not metrics:
        raise ConfigError("no validation NLL in the runs given", code="bad_run")
    ends = {label: max(step for c in curve.values() for step, _ in c) * pace for label, curve, pace in runs}
    common = min(ends.values())
    names = [m.removeprefix("val_nll/") if m != "val_nll" else "all" for m in metrics]
    lines = [
        f"| run | minutes | {' | '.join(names)} |",
        "|---|---|" + "---|" * len(names),
    ]
    for label, curve, pace in runs:
        for t in sorted({common, ends[label]}) if ends[label] > common * 1.01 else [common]:
            cells = [at_time(curve.get(m, []), pace, t) for m in metrics]
            shown = " | ".join("" if c is None else f"{c:.3f}" for c in cells)
            lines.append(f"| {label} | {t / 60:.0f} | {shown} |")
    if out is not None:
        _plot(runs, metrics, names, Path(out))
    return "\n".join(lines)


def _plot(runs, metrics, names, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(metrics))
    rows = -(-len(metrics) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, metric, name in zip(axes.flat, metrics, names, strict=False):
        for label, curve, pace in runs:
            points = curve.get(metric, [])
            if points:
                ax.plot([s * pace / 60 for s, _ in points], [v for _, v in points], label=label, lw=1.4)
        ax.set_title(f"{name}: validation NLL")
        ax.set_xlabel("training minutes (one thread, alone)")
        ax.set_ylabel("nats / token")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
