"""report.html: an `evaluate-continuations` report to read, look at and listen to, offline.

One page beside report.json: the table, the real-vs-generated classifier per source, the plots, and for the
example pieces motif + truth beside motif + each system, each as a piano roll (inline SVG) and as audio. The
audio is rendered with a General MIDI soundfont through pretty_midi's `fluidsynth()` (pyfluidsynth; Debian's
`fluidsynth` and `timgm6mb-soundfont`, which `make test` installs) into WAV files under `audio/`, referenced
relatively: the folder opens from disk with no server and no network. Without the synthesizer or a
soundfont the page still has everything else and says why it has no audio.
"""

from __future__ import annotations

import html
import os
import re
import wave
from pathlib import Path

import numpy as np
import pretty_midi

from musicrel.errors import MusicrelError
from musicrel.evaluation.twosample import format_grouping

# Debian's General MIDI soundfonts, smallest first (timgm6mb: 6 MB, what `make` installs).
SOUNDFONTS = (
    "/usr/share/sounds/sf2/TimGM6mb.sf2",
    "/usr/share/sounds/sf2/default-GM.sf2",
    "/usr/share/sounds/sf2/FluidR3_GM.sf2",
)
SAMPLE_RATE = 16000  # Hz: plenty for a piano sketch, and 20 s of mono 16-bit is 640 kB
AUDIO_DIR = "audio"
ROLL_WIDTH, ROLL_HEIGHT = 640, 130
DRUM_LANE = 16  # px at the foot of a roll for the drum hits (a report of a model with instruments)
MOTIF_COLOR, TRUTH_COLOR, CUT_COLOR = "#999", "#111", "#d62728"
SYSTEM_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")


class AudioUnavailable(MusicrelError):
    """No synthesizer (pyfluidsynth / libfluidsynth) or no General MIDI soundfont to render audio with."""

    code = "audio_unavailable"


def find_soundfont() -> Path:
    """MUSICREL_SOUNDFONT if set, else the first Debian GM soundfont present."""
    named = os.environ.get("MUSICREL_SOUNDFONT")
    for candidate in [named] if named else SOUNDFONTS:
        if Path(candidate).is_file():
            return Path(candidate)
    raise AudioUnavailable(
        f"no General MIDI soundfont at {named or ', '.join(SOUNDFONTS)}: "
        "apt-get install timgm6mb-soundfont (make test does), or set MUSICREL_SOUNDFONT"
    )


def synthesize(notes: list[list], soundfont: Path, program: int = 0) -> np.ndarray:
    """int16 mono samples at SAMPLE_RATE of [pitch, start, end, velocity] rows (times >= 0)."""
    try:
        import fluidsynth  # noqa: F401  (pretty_midi imports it lazily and hides why it failed)
    except (ImportError, OSError) as exc:
        raise AudioUnavailable(f"pyfluidsynth unusable ({exc}): pip install pyfluidsynth") from exc
    pm = pretty_midi.PrettyMIDI()
    inst = pretty_midi.Instrument(program=program)
    inst.notes = [pretty_midi.Note(int(v), int(p), float(s), float(e)) for p, s, e, v in notes]
    pm.instruments.append(inst)
    audio = pm.fluidsynth(fs=SAMPLE_RATE, synthesizer=str(soundfont))
    return (np.clip(audio, -1.0, 1.0) * 32767 * 0.9).astype(np.int16)


def write_wav(samples: np.ndarray, path: Path) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(samples.tobytes())


def piano_roll_svg(
    motif: list[list],
    continuation: list[list],
    color: str,
    before: float,
    after: float,
    drums: tuple[list[list], list[list]] | None = None,
) -> str:
    """Motif (grey, negative times) and continuation (colour, from the cut at 0) as an inline SVG. `drums`:
    the motif's and the continuation's drum hits (rows as the notes'), drawn as diamonds on a lane of their
    own at the foot, as the web page draws them: a drum's note number names a sound, not a pitch, so on the
    pitch axis its hits would read as stray low notes. None: no lane (a piano model's roll, as before)."""
    pitches = [n[0] for n in motif + continuation] or [60]
    low, high = min(pitches) - 1, max(pitches) + 1
    height = ROLL_HEIGHT if drums is None else ROLL_HEIGHT - DRUM_LANE
    row = height / (high - low + 1)

    def x(t: float) -> float:
        return (t + before) / (before + after) * ROLL_WIDTH

    rects = []
    for notes, fill in ((motif, MOTIF_COLOR), (continuation, color)):
        for p, s, e, v in notes:
            rects.append(
                f'<rect x="{x(s):.1f}" y="{(high - p) * row:.1f}" width="{max(x(e) - x(s), 1.0):.1f}" '
                f'height="{max(row - 0.5, 1.0):.1f}" fill="{fill}" '
                f'fill-opacity="{0.35 + 0.65 * v / 127:.2f}"/>'
            )
    if drums is not None:
        rects.append(_drum_lane(drums, color, x))
    return (
        f'<svg class="roll" width="{ROLL_WIDTH}" height="{ROLL_HEIGHT}" '
        f'viewBox="0 0 {ROLL_WIDTH} {ROLL_HEIGHT}" '
        f'xmlns="http://www.w3.org/2000/svg"><rect width="100%" height="100%" fill="#fafafa"/>'
        + "".join(rects)
        + f'<line x1="{x(0):.1f}" x2="{x(0):.1f}" y1="0" y2="{ROLL_HEIGHT}" stroke="{CUT_COLOR}"/></svg>'
    )


def _drum_lane(drums: tuple[list[list], list[list]], color: str, x) -> str:
    """The drums' lane of a roll: a rule, its name, and a diamond per hit (louder more opaque)."""
    top, r = ROLL_HEIGHT - DRUM_LANE, DRUM_LANE / 2 - 2
    mid = top + DRUM_LANE / 2
    out = [
        f'<line class="drum-lane" x1="0" x2="{ROLL_WIDTH}" y1="{top:.1f}" y2="{top:.1f}" stroke="#ddd"/>',
        f'<text x="{ROLL_WIDTH - 2}" y="{top + 8:.1f}" font-size="8" fill="#777" '
        'text-anchor="end">drums</text>',
    ]
    for hits, fill in zip(drums, (MOTIF_COLOR, color), strict=True):
        for _, s, _, v in hits:
            c = x(s)
            corners = ((c, mid - r), (c + r, mid), (c, mid + r), (c - r, mid))
            points = " ".join(f"{px:.1f},{py:.1f}" for px, py in corners)
            out.append(
                f'<polygon class="drum" points="{points}" fill="{fill}" '
                f'fill-opacity="{0.35 + 0.65 * v / 127:.2f}"/>'
            )
    return "".join(out)


def _pct(ci: dict) -> str:
    return f"{100 * ci['mean']:.0f} % [{100 * ci['low']:.0f}, {100 * ci['high']:.0f}]"


def classifier_html(result: dict) -> str:
    parts = [
        "<p>A classifier (" + html.escape(result["classifier"]) + ") is asked to tell each system's "
        "continuations from the true continuations of the same motifs, on features a musician would name. "
        "Balanced accuracy 50 % (AUC 0.5) means it cannot: indistinguishable. Intervals: "
        f"{100 * result['confidence']:g} % bootstrap over compositions. Given away by: the held-out AUC of a "
        "classifier that sees one feature family alone.</p>"
    ]
    if "grouping" in result:
        parts.append(f"<p>{html.escape(format_grouping(result['grouping']))}.</p>")
    for source, section in result["sections"].items():
        parts.append(f"<h3>{html.escape(source)} ({section['pieces']} pieces)</h3>")
        rows = [
            "<tr><th>system</th><th>pieces (compositions)</th><th>accuracy</th><th>AUC</th>"
            "<th>given away by</th><th>top features (system vs truth)</th></tr>"
        ]
        for name, r in section["systems"].items():
            away = ", ".join(f"{g['family']} ({g['auc_alone']:.2f})" for g in r["give_away"][:3])
            top = "<br>".join(
                html.escape(f"{f['name']}: {f['system']:.3g} vs {f['truth']:.3g}")
                for f in r["top_features"][:3]
            )
            auc = r["auc"]
            rows.append(
                f'<tr class="classifier" data-system="{html.escape(name)}"><td>{html.escape(name)}</td>'
                f"<td>{r['pieces']} ({r['compositions']})</td><td>{_pct(r['accuracy'])}</td>"
                f"<td>{auc['mean']:.2f} [{auc['low']:.2f}, {auc['high']:.2f}]</td>"
                f"<td>{html.escape(away)}</td><td>{top}</td></tr>"
            )
        for name, reason in section["left_out"].items():
            rows.append(
                f"<tr><td>{html.escape(name)}</td><td colspan=5>left out: {html.escape(reason)}</td></tr>"
            )
        parts.append("<table>" + "".join(rows) + "</table>")
    return "\n".join(parts)


def audio_soundfont(audio: bool = True) -> tuple[Path | None, str]:
    """(the soundfont to render a page's audio with, else None; the page's note on its audio or why it has
    none). `audio` False: none asked for."""
    if not audio:
        return None, "No audio (not asked for)."
    try:
        soundfont = find_soundfont()
    except AudioUnavailable as exc:
        return None, f"No audio: {exc}"
    return soundfont, f"Audio: General MIDI piano from {soundfont.name} (fluidsynth), {SAMPLE_RATE} Hz."


def listen_html(
    report: dict,
    out_dir: Path,
    *,
    how: str,
    systems: str,
    heading,
    line,
    audio: bool = True,
    prefix: str = "ex",
    preload: str = "auto",
) -> str:
    """A report's examples to hear: a note on the audio and `how` to read the rolls, then per example
    (`heading(ex)`) the truth and each of its `systems` (`ex[systems]`: {system: notes}) a line each: a label,
    a piano roll and, with a soundfont, an audio player. `line(ex, system, notes, color)` -> (the label, the
    roll's SVG, the notes to hear: [pitch, start, end, velocity] rows from 0). `audio` False: no audio;
    `prefix`: of the WAV files' names; `preload`: the players'."""
    soundfont, note = audio_soundfont(audio)
    parts = [f'<p class="audio-note">{html.escape(note)} {html.escape(how)}</p>']
    if soundfont is not None:
        (out_dir / AUDIO_DIR).mkdir(exist_ok=True)
    colors = dict(zip(report["systems"], SYSTEM_COLORS, strict=False))
    for k, ex in enumerate(report["examples"]):
        parts.append(f'<div class="example"><h3>{html.escape(heading(ex))}</h3>')
        lines = [("truth", ex["truth"], TRUTH_COLOR)]
        lines += [(name, notes, colors.get(name, "#1f77b4")) for name, notes in ex[systems].items()]
        for system, notes, color in lines:
            label, svg, music = line(ex, system, notes, color)
            cell = ""
            if soundfont is not None:
                name = f"{prefix}{k}-{re.sub(r'[^a-z0-9-]', '_', system.lower())}.wav"
                write_wav(synthesize(music, soundfont), out_dir / AUDIO_DIR / name)
                cell = f'<audio controls preload="{preload}" src="{AUDIO_DIR}/{name}"></audio>'
            parts.append(
                f'<div class="line" data-system="{html.escape(system)}"><div class="label">'
                f"{html.escape(label)}</div>{svg}{cell}</div>"
            )
        parts.append("</div>")
    if not report["examples"]:
        parts.append("<p>No examples in this report.</p>")
    return "\n".join(parts)


def _continuation_line(report: dict):
    """Motif + truth, then motif + each system: the motif's times run from -before to 0, heard from its
    start."""
    before, after = report["motif_seconds"], report["seconds"]

    def line(ex, system, notes, color):
        label = "motif + " + system + (" (the 10 s after the truth)" if system == "real-music" else "")
        moved = [[p, s + before, e + before, v] for p, s, e, v in ex["motif"] + notes]
        drums = ex.get("drums")  # a model with instruments: the hits, drawn on their own lane
        if drums is not None:
            hits = drums["truth"] if system == "truth" else drums["continuations"].get(system, [])
            drums = (drums["motif"], hits)
        return label, piano_roll_svg(ex["motif"], notes, color, before, after, drums), moved

    return line


STYLE = """
body { font-family: sans-serif; margin: 1.5em; max-width: 1400px; }
pre { font-size: 12px; overflow-x: auto; background: #f6f6f6; padding: 0.5em; }
table { border-collapse: collapse; font-size: 13px; } td, th { border: 1px solid #ccc; padding: 3px 6px; }
img { max-width: 100%; } .line { display: flex; align-items: center; gap: 1em; margin: 4px 0; }
.label { width: 16em; font-size: 13px; } .example { margin-bottom: 1.5em; }
"""


def write_html(report: dict, out_dir, table: str, pictures: dict[str, Path]) -> Path:
    """report.html (and its audio/ folder) in out_dir: `table` (the console table), the classifier, the
    `pictures` (name -> path beside it) and the examples to hear."""
    out_dir = Path(out_dir)
    about = (
        f"{report['pieces']} pieces x {report['seeds']} seeds, motif {report['motif_seconds']:g} s, "
        f"continuation {report['seconds']:g} s."
    )
    examples = listen_html(
        report,
        out_dir,
        how="The red line is the cut; grey is the motif.",
        systems="continuations",
        heading=lambda ex: Path(ex["file"]).name,
        line=_continuation_line(report),
    )
    body = [
        examples,
        "<h2>Metrics</h2>",
        f"<pre>{html.escape(table)}</pre>",
        *(f'<img alt="{html.escape(n)}" src="{html.escape(p.name)}">' for n, p in pictures.items()),
    ]
    path = out_dir / "report.html"
    path.write_text(report_page("evaluate-continuations", report, about, body))
    return path


def report_page(command: str, report: dict, about: str, listen: list[str], more: str = "") -> str:
    """An evaluation's report.html: its title (`command`, the input, the source), what was run (the
    checkpoint: `about`, then the HTML `more`), the classifier's section, then `listen` (the examples, the
    figures), as one page."""
    title = f"{command}: {report['input']}" + (f" ({report['source']})" if report.get("source") else "")
    body = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{html.escape(report['checkpoint'])}: {html.escape(about)}</p>{more}",
        "<h2>Would a listener notice?</h2>",
        classifier_html(report["two_sample"]) if "two_sample" in report else "<p>No classifier.</p>",
        "<h2>Listen</h2>",
        *listen,
    ]
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )
