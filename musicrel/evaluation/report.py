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


ARROWS = {"higher": " ^", "lower": " v", "one": " ->1", "reference": " ~truth", "": ""}


def notes_lines(report: dict) -> list[str]:
    """What a report's table stands on: the files skipped, what was left out and why, the warnings."""
    lines = [f"skipped: {report['skipped']}"] if report["skipped"] else []
    lines += [f"left out: {name}: {reason}" for name, reason in report["left_out"].items()]
    return lines + [f"warning: {warning}" for warning in report["warnings"]]


def metrics_table(metrics: dict, systems: dict, reference: dict, indent: str = "") -> list[str]:
    """Metrics as rows, systems (and the truth) as columns, each cell mean [interval] (`metric_cell`):
    `metrics` is a report's, `systems` {name: {pieces, metrics}}, `reference` the truth's {pieces,
    metrics}."""
    rows = [
        ["", *systems, "truth"],
        ["pieces", *(str(s["pieces"]) for s in systems.values()), str(reference["pieces"])],
    ]
    for name, meta in metrics.items():
        truth = reference["metrics"].get(name)
        rows.append(
            [meta["label"] + ARROWS[meta["better"]]]
            + [
                metric_cell(s["metrics"][name], name) if name in s["metrics"] else "-"
                for s in systems.values()
            ]
            + [metric_cell(truth, name) if truth else "-"]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    table = [
        indent
        + " ".join(
            [row[0].ljust(widths[0])] + [c.rjust(w + 1) for c, w in zip(row[1:], widths[1:], strict=True)]
        )
        for row in rows
    ]
    table.insert(2, indent + "-" * (len(table[1]) - len(indent)))
    return table


def instrument_cases_lines(systems: dict, over: str = "piece x seed x instrument") -> list[str]:
    """The continuity question pooled over its cases (a report with instruments; none for a piano one): each
    (piece, seed, instrument) of the motif's last 5 s that the truth plays, and the share kept playing
    (`over`: what a case is; evaluate-infills' are per gap)."""
    pooled = {n: s["instrument_cases"] for n, s in systems.items() if "instrument_cases" in s}
    if not pooled:
        return []
    cells = [
        f"{n} {c['kept']}/{c['cases']}" + (f" ({100 * c['share']:.0f}%)" if c["share"] is not None else "")
        for n, c in pooled.items()
    ]
    return [f"motif's instruments kept, over all cases ({over}): " + ", ".join(cells)]


def format_report(report: dict) -> str:
    """Metrics as rows, systems (and the truth) as columns: mean [95 % interval]."""
    head = (
        f"{report['pieces']} pieces x {report['seeds']} seeds, motif {report['motif_seconds']:g} s -> "
        f"continuation {report['seconds']:g} s; "
        f"mean [{100 * report['bootstrap']['confidence']:g} % bootstrap interval over pieces]"
    )
    lines = [head, *notes_lines(report)]
    lines += metrics_table(report["metrics"], report["systems"], report["reference"])
    lines += instrument_cases_lines(report["systems"])
    if "two_sample" in report:
        lines += format_two_sample(report["two_sample"])
    timing = ", ".join(f"{n} {s['seconds']:.0f} s" for n, s in report["systems"].items())
    lines.append(f"time: {timing}" + (f" ({report['threads']} torch threads)" if "threads" in report else ""))
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
