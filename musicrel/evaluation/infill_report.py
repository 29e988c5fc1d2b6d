"""The `evaluate-infills` report for people: `format_infill_report` (the console tables, one per source) and
`write_infill_report` (report.json and report.html, whose piano rolls mark the gap). The machinery is
evaluate-continuations': its table (`report.metrics_table`), the page, the classifier's section, the piano
roll and the audio of `report_html`."""

from __future__ import annotations

import html
import json
from pathlib import Path

from musicrel.evaluation.report import instrument_cases_lines, metrics_table, notes_lines
from musicrel.evaluation.report_html import (
    CUT_COLOR,
    ROLL_HEIGHT,
    ROLL_WIDTH,
    listen_html,
    piano_roll_svg,
    report_page,
)
from musicrel.evaluation.twosample import format_two_sample

GAP_SHADE = "#fde9c9"


def _ci(summary: dict, digits: int = 3) -> str:
    if summary.get("mean") is None:
        return "-"
    return f"{summary['mean']:.{digits}f} [{summary['low']:.{digits}f},{summary['high']:.{digits}f}]"


def format_infill_report(report: dict) -> str:
    """Per source: the true gap's NLL both ways, then metrics as rows and systems (and the truth) as
    columns, mean [95 % interval over pieces]; then the classifier and the speed."""
    lo, hi = report["gap_seconds"]
    lines = [
        f"{report['pieces']} pieces, {len(report['gaps'])} gaps of {lo:g}-{hi:g} s "
        f"({report['cuts']} cuts a piece) x {report['seeds']} seeds; "
        f"mean [{100 * report['bootstrap']['confidence']:g} % bootstrap interval over pieces]"
    ]
    lines += notes_lines(report)
    for source, section in report["sources"].items():
        nll = section["nll"]
        lines.append(f"{source} ({section['pieces']} pieces, {section['gaps']} gaps):")
        lines.append(
            f"  true gap's NLL (nats/token): with the future {_ci(nll['intervals']['with_future'])}, "
            f"past only {_ci(nll['intervals']['past_only'])}, "
            f"past only - with future {_ci(nll['difference'])}"
        )
        lines += metrics_table(report["metrics"], section["systems"], section["reference"], indent="  ")
        pooled = instrument_cases_lines(section["systems"], over="gap x seed x instrument")
        lines += ["  " + line for line in pooled]
    if "two_sample" in report:
        lines += format_two_sample(report["two_sample"])
        for source, section in report["two_sample"]["sections"].items():
            for base, gain in section.get("gain", {}).items():
                if gain["mean"] is not None:
                    lines.append(
                        f"  {source}: AUC({base}) - AUC(infill) {gain['mean']:.2f} "
                        f"[{gain['low']:.2f},{gain['high']:.2f}] over {gain['n']} compositions (> 0: the "
                        "infill is harder to tell from the truth)"
                    )
    for name, s in report["speed"].items():
        if s["events_per_second"] is not None:
            lines.append(
                f"speed, {name} (batch 1, CPU, {s['threads']} threads): "
                f"{s['events_per_second']:.0f} events/s, real-time factor {s['real_time_factor']:.2f} "
                f"({s['gap_seconds']:.1f} s of gap in {s['decode_seconds']:.1f} s)"
            )
    return "\n".join(lines)


def gap_roll_svg(ex: dict, notes: list[list], color: str) -> str:
    """The music around the gap (grey) and `notes` in the gap (colour), the gap shaded between red lines."""
    seconds = ex["end"] - ex["start"]
    before = max([-n[1] for n in ex["before"]] + [1.0])
    after = max([n[2] - seconds for n in ex["after"]] + [1.0])
    svg = piano_roll_svg(ex["before"] + ex["after"], notes, color, before, seconds + after)

    def x(t: float) -> float:
        return (t + before) / (before + seconds + after) * ROLL_WIDTH

    background = '<rect width="100%" height="100%" fill="#fafafa"/>'
    shade = (
        f'<rect class="gap" x="{x(0):.1f}" y="0" width="{x(seconds) - x(0):.1f}" height="{ROLL_HEIGHT}" '
        f'fill="{GAP_SHADE}"/>'
    )
    end_line = (
        f'<line x1="{x(seconds):.1f}" x2="{x(seconds):.1f}" y1="0" y2="{ROLL_HEIGHT}" stroke="{CUT_COLOR}"/>'
    )
    return svg.replace(background, background + shade, 1).replace("</svg>", end_line + "</svg>")


def _gap_line(ex, system, notes, color):
    """The music around the gap and `notes` in it: the roll, and the whole stretch to hear from its start."""
    music = ex["before"] + notes + ex["after"]
    t0 = min((n[1] for n in music), default=0.0)
    return system, gap_roll_svg(ex, notes, color), [[p, s - t0, e - t0, v] for p, s, e, v in music]


def write_infill_report(report: dict, out_dir, audio: bool = True) -> dict[str, Path]:
    """report.json and report.html (with audio/ unless `audio` is False, or no synthesizer) in `out_dir`
    (created); returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "report.json", "html": out_dir / "report.html"}
    paths["json"].write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
    lo, hi = report["gap_seconds"]
    about = (
        f"{report['pieces']} pieces, {len(report['gaps'])} gaps of {lo:g}-{hi:g} s x {report['seeds']} seeds."
    )
    systems = "".join(
        f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in report["systems"].items()
    )
    listen = [
        listen_html(
            report,
            out_dir,
            how="The shaded stretch between the red lines is the gap; grey is the music around it, kept.",
            systems="systems",
            heading=lambda ex: f"{Path(ex['file']).name}: {ex['start']:g}-{ex['end']:g} s",
            line=_gap_line,
            audio=audio,
            prefix="gap",
            preload="none",
        ),
        "<h2>Figures</h2>",
        f"<pre>{html.escape(format_infill_report(report))}</pre>",
    ]
    paths["html"].write_text(report_page("evaluate-infills", report, about, listen, f"<ul>{systems}</ul>"))
    return paths
