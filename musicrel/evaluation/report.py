"""The evaluation report for people: `format_report` (the console table) and `write_report` (report.json and
its pictures)."""

from __future__ import annotations

import json
from pathlib import Path

from musicrel.evaluation.plots import plot_metrics, plot_pianorolls
from musicrel.evaluation.report_html import write_html
from musicrel.evaluation.twosample import format_two_sample


def metric_cell(summary: dict, name: str) -> str:
    if summary["mean"] is None:
        return "-"
    if name in ("grammar_error", "one_pitch") or name.endswith(("_share", "repetition")):
        f = lambda x: f"{100 * x:.1f}%"  # noqa: E731
    elif name in ("range_diff", "restrikes", "polyphony_max"):
        f = lambda x: f"{x:.1f}"  # noqa: E731
    else:
        f = lambda x: f"{x:.2f}"  # noqa: E731
    return f"{f(summary['mean'])} [{f(summary['low'])},{f(summary['high'])}]"


def format_report(report: dict) -> str:
    """Metrics as rows, systems (and the truth) as columns: mean [95 % interval]."""
    head = (
        f"{report['pieces']} pieces x {report['seeds']} seeds, motif {report['motif_seconds']:g} s -> "
        f"continuation {report['seconds']:g} s; "
        f"mean [{100 * report['bootstrap']['confidence']:g} % bootstrap interval over pieces]"
    )
    lines = [head]
    if report["skipped"]:
        lines.append(f"skipped: {report['skipped']}")
    for name, reason in report["left_out"].items():
        lines.append(f"left out: {name}: {reason}")
    for warning in report["warnings"]:
        lines.append(f"warning: {warning}")
    arrows = {"higher": " ^", "lower": " v", "one": " ->1", "reference": " ~truth", "": ""}
    rows = [["", *report["systems"], "truth"]]
    rows.append(
        [
            "pieces",
            *(str(s["pieces"]) for s in report["systems"].values()),
            str(report["reference"]["pieces"]),
        ]
    )
    for name, meta in report["metrics"].items():
        truth = report["reference"]["metrics"].get(name)
        rows.append(
            [meta["label"] + arrows[meta["better"]]]
            + [
                metric_cell(s["metrics"][name], name) if name in s["metrics"] else "-"
                for s in report["systems"].values()
            ]
            + [metric_cell(truth, name) if truth else "-"]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    table = [
        " ".join(
            [row[0].ljust(widths[0])] + [c.rjust(w + 1) for c, w in zip(row[1:], widths[1:], strict=True)]
        )
        for row in rows
    ]
    table.insert(2, "-" * len(table[1]))
    lines += table
    if "two_sample" in report:
        lines += format_two_sample(report["two_sample"])
    timing = ", ".join(f"{n} {s['seconds']:.0f} s" for n, s in report["systems"].items())
    lines.append(f"time: {timing}")
    return "\n".join(lines)


def write_report(report: dict, out_dir) -> dict[str, Path]:
    """report.json, metrics.png, pianorolls.png and report.html (with audio/) in `out_dir` (created); returns
    their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / "report.json",
        "metrics": out_dir / "metrics.png",
        "pianorolls": out_dir / "pianorolls.png",
    }
    paths["json"].write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
    plot_metrics(report, paths["metrics"])
    plot_pianorolls(report, paths["pianorolls"])
    pictures = {k: paths[k] for k in ("metrics", "pianorolls")}
    paths["html"] = write_html(report, out_dir, format_report(report), pictures)
    return paths
