"""The `evaluate-infills` report for people: `format_infill_report` (the console tables, one per source) and
`write_infill_report` (report.json and report.html, whose piano rolls mark the gap). The machinery is
evaluate-continuations': its table cells (`report.metric_cell`), the classifier's section and the piano roll
and audio of `report_html`."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from musicrel.evaluation.report import metric_cell
from musicrel.evaluation.report_html import (
    AUDIO_DIR,
    CUT_COLOR,
    ROLL_HEIGHT,
    ROLL_WIDTH,
    SAMPLE_RATE,
    STYLE,
    SYSTEM_COLORS,
    TRUTH_COLOR,
    AudioUnavailable,
    classifier_html,
    find_soundfont,
    piano_roll_svg,
    synthesize,
    write_wav,
)
from musicrel.evaluation.twosample import format_two_sample

ARROWS = {"higher": " ^", "lower": " v", "one": " ->1", "reference": " ~truth", "": ""}
GAP_SHADE = "#fde9c9"


def _ci(summary: dict, digits: int = 3) -> str:
    if summary.get("mean") is None:
        return "-"
    return f"{summary['mean']:.{digits}f} [{summary['low']:.{digits}f},{summary['high']:.{digits}f}]"


def _table(report: dict, section: dict) -> list[str]:
    systems = section["systems"]
    rows = [
        ["", *systems, "truth"],
        ["pieces", *(str(s["pieces"]) for s in systems.values()), str(section["pieces"])],
    ]
    for name, meta in report["metrics"].items():
        truth = section["reference"]["metrics"].get(name)
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
        "  "
        + " ".join(
            [row[0].ljust(widths[0])] + [c.rjust(w + 1) for c, w in zip(row[1:], widths[1:], strict=True)]
        )
        for row in rows
    ]
    table.insert(2, "  " + "-" * (len(table[1]) - 2))
    return table


def format_infill_report(report: dict) -> str:
    """Per source: the true gap's NLL both ways, then metrics as rows and systems (and the truth) as
    columns, mean [95 % interval over pieces]; then the classifier and the speed."""
    lo, hi = report["gap_seconds"]
    lines = [
        f"{report['pieces']} pieces, {len(report['gaps'])} gaps of {lo:g}-{hi:g} s "
        f"({report['cuts']} cuts a piece) x {report['seeds']} seeds; "
        f"mean [{100 * report['bootstrap']['confidence']:g} % bootstrap interval over pieces]"
    ]
    if report["skipped"]:
        lines.append(f"skipped: {report['skipped']}")
    for name, reason in report["left_out"].items():
        lines.append(f"left out: {name}: {reason}")
    for warning in report["warnings"]:
        lines.append(f"warning: {warning}")
    for source, section in report["sources"].items():
        nll = section["nll"]
        lines.append(f"{source} ({section['pieces']} pieces, {section['gaps']} gaps):")
        lines.append(
            f"  true gap's NLL (nats/token): with the future {_ci(nll['intervals']['with_future'])}, "
            f"past only {_ci(nll['intervals']['past_only'])}, "
            f"past only - with future {_ci(nll['difference'])}"
        )
        lines += _table(report, section)
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


def _listen_html(report: dict, out_dir: Path, audio: bool) -> str:
    try:
        soundfont = find_soundfont() if audio else None
        note = (
            f"Audio: General MIDI piano from {soundfont.name} (fluidsynth), {SAMPLE_RATE} Hz."
            if soundfont
            else "No audio (not asked for)."
        )
    except AudioUnavailable as exc:
        soundfont, note = None, f"No audio: {exc}"
    parts = [
        f'<p class="audio-note">{html.escape(note)} The shaded stretch between the red lines is the gap; '
        "grey is the music around it, kept.</p>"
    ]
    if soundfont is not None:
        (out_dir / AUDIO_DIR).mkdir(exist_ok=True)
    colors = dict(zip(report["systems"], SYSTEM_COLORS, strict=False))
    for k, ex in enumerate(report["examples"]):
        title = f"{Path(ex['file']).name}: {ex['start']:g}-{ex['end']:g} s"
        parts.append(f'<div class="example"><h3>{html.escape(title)}</h3>')
        lines = [("truth", ex["truth"], TRUTH_COLOR)]
        lines += [(name, notes, colors.get(name, "#1f77b4")) for name, notes in ex["systems"].items()]
        for label, notes, color in lines:
            audio = ""
            if soundfont is not None:
                name = f"gap{k}-{re.sub(r'[^a-z0-9-]', '_', label.lower())}.wav"
                music = ex["before"] + notes + ex["after"]
                t0 = min((n[1] for n in music), default=0.0)
                write_wav(
                    synthesize([[p, s - t0, e - t0, v] for p, s, e, v in music], soundfont),
                    out_dir / AUDIO_DIR / name,
                )
                audio = f'<audio controls preload="none" src="{AUDIO_DIR}/{name}"></audio>'
            parts.append(
                f'<div class="line" data-system="{html.escape(label)}"><div class="label">'
                f"{html.escape(label)}</div>{gap_roll_svg(ex, notes, color)}{audio}</div>"
            )
        parts.append("</div>")
    if not report["examples"]:
        parts.append("<p>No examples in this report.</p>")
    return "\n".join(parts)


def write_infill_report(report: dict, out_dir, audio: bool = True) -> dict[str, Path]:
    """report.json and report.html (with audio/ unless `audio` is False, or no synthesizer) in `out_dir`
    (created); returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "report.json", "html": out_dir / "report.html"}
    paths["json"].write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
    title = f"evaluate-infills: {report['input']}" + (
        f" ({report['source']})" if report.get("source") else ""
    )
    lo, hi = report["gap_seconds"]
    systems = "".join(
        f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in report["systems"].items()
    )
    body = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{html.escape(report['checkpoint'])}: {report['pieces']} pieces, {len(report['gaps'])} gaps of "
        f"{lo:g}-{hi:g} s x {report['seeds']} seeds.</p><ul>{systems}</ul>",
        "<h2>Would a listener notice?</h2>",
        classifier_html(report["two_sample"]) if "two_sample" in report else "<p>No classifier.</p>",
        "<h2>Listen</h2>",
        _listen_html(report, out_dir, audio),
        "<h2>Figures</h2>",
        f"<pre>{html.escape(format_infill_report(report))}</pre>",
    ]
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )
    paths["html"].write_text(page)
    return paths
