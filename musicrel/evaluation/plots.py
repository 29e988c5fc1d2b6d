"""Pictures of an `evaluate-continuations` report: every metric per system with its interval, and piano rolls
of a few continuations beside the truth.

Figures are built with matplotlib's object API (no pyplot): nothing global changes, so plotting never fights
another backend, a notebook or a thread.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

ARROWS = {
    "higher": "(higher is better)",
    "lower": "(lower is better)",
    "one": "(1 is right)",
    "reference": "(truth: black)",
    "": "",
}
TRUTH_COLOR = "black"
SWEEP_TITLES = {
    "score": "score (classifier AUC: lower is better; overlaps: higher)",
    "pc_overlap": "pitch-class overlap (higher is better)",
    "ioi_overlap": "IOI overlap (higher is better)",
    "density_ratio": "density ratio (grey: eligible band)",
    "one_pitch": "one pitch > half the notes (share of continuations)",
    "key_corr": "key correlation with the motif's key",
}
MOTIF_COLOR = "0.6"


def _colors(names) -> dict[str, str]:
    return {name: f"C{i}" for i, name in enumerate(names)}


def plot_metrics(report: dict, path) -> Path:
    """One panel per metric: each system's mean (dot) and 95 % interval (bar); the truth's value as a black
    dot and dashed line where the metric has one."""
    metrics = report["metrics"]
    systems = list(report["systems"])
    colors = _colors(systems)
    cols = 4
    rows = -(-len(metrics) // cols)
    fig = Figure(
        figsize=(4.2 * cols, 0.35 * (len(systems) + 1) * rows + 1.2 * rows + 0.6), layout="constrained"
    )
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (name, meta) in zip(axes, metrics.items(), strict=False):
        labels, y = [], 0
        for system in systems:
            s = report["systems"][system]["metrics"].get(name)
            labels.append(system)
            if s and s["mean"] is not None:
                err = [[s["mean"] - s["low"]], [s["high"] - s["mean"]]]
                ax.errorbar(s["mean"], y, xerr=err, fmt="o", color=colors[system], capsize=3)
            y += 1
        truth = report["reference"]["metrics"].get(name)
        if truth and truth["mean"] is not None:
            labels.append("truth")
            err = [[truth["mean"] - truth["low"]], [truth["high"] - truth["mean"]]]
            ax.errorbar(truth["mean"], y, xerr=err, fmt="s", color=TRUTH_COLOR, capsize=3)
            ax.axvline(truth["mean"], color=TRUTH_COLOR, linestyle="--", linewidth=0.8)
        if meta["better"] == "one":
            ax.axvline(1.0, color=TRUTH_COLOR, linestyle=":", linewidth=0.8)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylim(len(labels) - 0.5, -0.5)
        ax.set_title(f"{meta['label']} {ARROWS[meta['better']]}", fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(axis="x", alpha=0.3)
    for ax in axes[len(metrics) :]:
        ax.set_visible(False)
    fig.suptitle(
        f"{report['input']}: {report['pieces']} pieces x {report['seeds']} seeds, "
        f"{report['motif_seconds']:g} s motif -> {report['seconds']:g} s; "
        f"mean and {100 * report['bootstrap']['confidence']:g} % bootstrap interval over pieces",
        fontsize=10,
    )
    fig.savefig(path, dpi=100)
    return Path(path)


def _roll(ax, notes, color) -> None:
    """notes: [pitch, start, end, velocity] rows, drawn as bars, louder notes more opaque."""
    if notes:
        pitch, start, end, velocity = zip(*notes, strict=True)
        shades = [to_rgba(color, 0.35 + 0.65 * v / 127) for v in velocity]
        ax.barh(pitch, [e - s for s, e in zip(start, end, strict=True)], left=start, height=0.8, color=shades)


def _drum_lane(ax, hits, color, lane: float) -> None:
    """Drum hits ([pitch, start, end, velocity] rows) as diamonds on one lane at y = `lane`, louder more
    opaque: a drum's note number names a sound, not a pitch, so on the pitch axis its hits would read as
    stray low notes (the web page draws them so too)."""
    if hits:
        starts = [h[1] for h in hits]
        shades = [to_rgba(color, 0.35 + 0.65 * h[3] / 127) for h in hits]
        ax.scatter(starts, [lane] * len(hits), marker="D", s=14, c=shades, linewidths=0)


def plot_pianorolls(report: dict, path) -> Path:
    """A row per example piece: motif + truth on the left, motif + the system's first continuation on the
    right, the cut at time 0. A report of a model with instruments (examples with `drums`) draws the drum
    hits as diamonds on a lane below the lowest note."""
    examples = report["examples"]
    fig = Figure(figsize=(14, 2.6 * max(1, len(examples)) + 0.6), layout="constrained")
    if not examples:
        fig.text(0.5, 0.5, "no generated system in this report: nothing to draw", ha="center", va="center")
        fig.savefig(path, dpi=100)
        return Path(path)
    axes = fig.subplots(len(examples), 2, squeeze=False, sharex=True)
    for row, ex in zip(axes, examples, strict=True):
        pitches = [n[0] for part in ("motif", "truth", "continuation") for n in ex[part]] or [60]
        name = Path(ex["file"]).name
        drums = ex.get("drums")
        low = min(pitches) - (6 if drums is not None else 2)  # room for the drums' lane
        for ax, part, title in ((row[0], "truth", "truth"), (row[1], "continuation", ex["system"])):
            color = TRUTH_COLOR if part == "truth" else "C0"
            _roll(ax, ex["motif"], MOTIF_COLOR)
            _roll(ax, ex[part], color)
            if drums is not None:
                ax.axhline(low + 2.5, color="0.85", linewidth=0.8)
                _drum_lane(ax, drums["motif"], MOTIF_COLOR, low + 1)
                _drum_lane(ax, drums[part], color, low + 1)
                lane = ax.get_yaxis_transform()  # x in axes units: the name at the right end, off the hits
                ax.text(1.0, low + 1, "drums ", transform=lane, fontsize=7, ha="right", va="bottom", c="0.4")
            ax.axvline(0.0, color="C3", linewidth=1)
            ax.set_xlim(-report["motif_seconds"], report["seconds"])
            ax.set_ylim(low, max(pitches) + 2)
            ax.set_title(f"{name}: motif + {title}", fontsize=9)
            ax.set_ylabel("pitch", fontsize=8)
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.tick_params(labelsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("seconds from the cut", fontsize=8)
    fig.savefig(path, dpi=100)
    return Path(path)


def plot_sweep(sweep: dict, path) -> Path:
    """A panel per figure of a sampling sweep: mean and interval against temperature, a line per (top-p,
    top-k); the defaults circled, the density band shaded."""
    panels = ("score", "pc_overlap", "ioi_overlap", "density_ratio", "one_pitch", "key_corr")
    lines: dict[tuple, list[dict]] = {}
    for row in sweep["settings"]:
        s = row["setting"]
        lines.setdefault((s["top_p"], s["top_k"]), []).append(row)
    fig = Figure(figsize=(4.2 * 3, 3.2 * 2 + 0.6), layout="constrained")
    axes = fig.subplots(2, 3, squeeze=False).ravel()
    for ax, name in zip(axes, panels, strict=True):
        for i, ((top_p, top_k), rows) in enumerate(sorted(lines.items(), key=lambda kv: str(kv[0]))):
            rows = sorted(rows, key=lambda r: r["setting"]["temperature"])
            stats = [r["score"] if name == "score" else r["metrics"][name] for r in rows]
            x = [r["setting"]["temperature"] + 0.006 * i for r in rows]  # a hair apart: bars stay legible
            ok = [(xi, s) for xi, s in zip(x, stats, strict=True) if s["mean"] is not None]
            if not ok:
                continue
            xs, ss = zip(*ok, strict=True)
            err = [[s["mean"] - s["low"] for s in ss], [s["high"] - s["mean"] for s in ss]]
            tag = f"top-p {top_p:g}" + ("" if top_k is None else f", top-k {top_k}")
            ax.errorbar(xs, [s["mean"] for s in ss], yerr=err, fmt="o-", color=f"C{i}", capsize=2, label=tag)
            for xi, r, s in zip(x, rows, stats, strict=True):
                if r["is_default"] and s["mean"] is not None:
                    ax.plot(xi, s["mean"], "o", markersize=12, markerfacecolor="none", color=TRUTH_COLOR)
        if name == "density_ratio":
            ax.axhspan(*sweep["density_band"], color="0.9", zorder=0)
        ax.set_title(SWEEP_TITLES[name], fontsize=9)
        ax.set_xlabel("temperature", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"sampling sweep: {sweep['pieces']} pieces ({sweep['split']}) x {sweep['seeds']} seeds; circled: "
        f"the defaults; recommended {sweep['recommended']}",
        fontsize=10,
    )
    fig.savefig(path, dpi=100)
    return Path(path)
