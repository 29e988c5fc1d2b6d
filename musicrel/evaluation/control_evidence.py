"""Do the controls hold? `evaluate_controls` continues held-out motifs under each control and measures what
the control promises (`musicrel evaluate-controls` prints it; the tests run it on a tiny model).

Every control is measured on the notes the continuation strikes (rendered as a user gets them: `render`
leaves the motif's notes out, a chord struck a hair before the cut included), beside the same figure without
any control, so a target met by the model alone shows as such:
- key "only" / "prefer" (the key detected from the motif): share of new notes in the scale (100 % / >= 90 %);
- a I-V-vi-IV progression in that key (i-VI-III-VII in minor), 2 s a chord, "prefer": share of note onsets
  that are tones of the chord sounding then (>= 80 %);
- density 3 and 8 notes/s: notes per second over the continuation, the mean over samples within 20 %;
- range 48-72 with at most 3 notes at once: share of new notes inside (100 %) and the most sounding at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from musicrel.evaluation.metrics import polyphony
from musicrel.generation.controls import Controls, parse_chord, scale_pitch_classes
from musicrel.generation.keys import PITCH_NAMES, find_key, key_label

DENSITY_TOLERANCE = 0.2
CHORD_SECONDS = 2.0
RANGE = (48, 72)
POLYPHONY = 3


@dataclass(frozen=True)
class Check:
    name: str
    target: str
    measured: float
    baseline: float  # the same figure with no control
    ok: bool
    spread: tuple[float, float] = (math.nan, math.nan)  # lowest and highest per-sample value


def progression(key: tuple[int, str]) -> str:
    """I-V-vi-IV in a major key, i-VI-III-VII in a minor one, CHORD_SECONDS each, as chord symbols."""
    tonic, mode = key
    steps = (
        ((0, ""), (7, ""), (9, "m"), (5, "")) if mode == "major" else ((0, "m"), (8, ""), (3, ""), (10, ""))
    )
    return " ".join(f"{PITCH_NAMES[(tonic + s) % 12]}{q}:{CHORD_SECONDS:g}" for s, q in steps)


def _conditions(primer) -> dict[str, Controls | None]:
    key = find_key(primer.motif_notes) or (0, "major")
    label = key_label(key)
    return {
        "none": None,
        "key only": Controls(key=label, key_strength="only"),
        "key prefer": Controls(key=label, key_strength="prefer"),
        "chords": Controls(chords=progression(key)),
        "density 3": Controls(density=3.0),
        "density 8": Controls(density=8.0),
        "range": Controls(low_note=RANGE[0], high_note=RANGE[1], max_polyphony=POLYPHONY),
    }


def evaluate_controls(
    model, codec, primers, seconds: float = 20.0, samples: int = 2, seed: int = 0, batch_size: int = 4
) -> list[Check]:
    """Continue each primer under every condition `samples` times (one batch per `batch_size` primers) and
    return one Check per control target."""
    from musicrel.generation.decode_batch import generate_batch
    from musicrel.generation.primer import render_result
    from musicrel.generation.sampling import SamplingParams

    per: dict[str, list] = {}  # condition -> [(controls applied, key, notes per sample)]
    for start in range(0, len(primers), batch_size):
        chunk = primers[start : start + batch_size]
        jobs, names = [], []
        for p, primer in enumerate(chunk):
            for name, controls in _conditions(primer).items():
                params = SamplingParams(
                    seconds=seconds, seed=seed + start + p, num_samples=samples, controls=controls
                )
                jobs.append((primer, params))
                names.append((name, primer))
        for (name, primer), result in zip(names, generate_batch(model, codec, jobs), strict=True):
            key = find_key(primer.motif_notes) or (0, "major")
            rendered = render_result(codec, primer, result)
            notes = [[n for i in pm.instruments for n in i.notes] for pm in rendered]
            per.setdefault(name, []).extend((key, n) for n in notes)

    def figure(name: str, fn) -> list[float]:
        return [v for key, notes in per[name] if not math.isnan(v := fn(key, notes))]

    def mean(values) -> float:
        return float(np.mean(values)) if values else math.nan

    def spread(values) -> tuple[float, float]:
        return (float(min(values)), float(max(values))) if values else (math.nan, math.nan)

    scale = lambda key, notes: in_scale_share(notes, key)  # noqa: E731
    chords = lambda key, notes: chord_tone_share(notes, _chord_list(progression(key)))  # noqa: E731
    density = lambda key, notes: len(notes) / seconds  # noqa: E731
    inside = lambda key, notes: in_range_share(notes, *RANGE)  # noqa: E731
    most = lambda key, notes: float(polyphony(notes)[1])  # noqa: E731
    checks = []
    # "only" is a mask: every sample must hold it, not their mean
    v = figure("key only", scale)
    checks.append(
        Check("key only: in scale", "100 %", mean(v), mean(figure("none", scale)), min(v) == 1, spread(v))
    )
    v = figure("key prefer", scale)
    checks.append(
        Check(
            "key prefer: in scale", ">= 90 %", mean(v), mean(figure("none", scale)), mean(v) >= 0.9, spread(v)
        )
    )
    v = figure("chords", chords)
    checks.append(
        Check(
            "chords: chord-tone onsets",
            ">= 80 %",
            mean(v),
            mean(figure("none", chords)),
            mean(v) >= 0.8,
            spread(v),
        )
    )
    for rate in (3, 8):
        v = figure(f"density {rate}", density)
        ok = abs(mean(v) / rate - 1) <= DENSITY_TOLERANCE
        checks.append(
            Check(
                f"density {rate}: notes/s",
                f"{rate} +- 20 %",
                mean(v),
                mean(figure("none", density)),
                ok,
                spread(v),
            )
        )
    v = figure("range", inside)
    checks.append(
        Check(
            f"range {RANGE[0]}-{RANGE[1]}: inside",
            "100 %",
            mean(v),
            mean(figure("none", inside)),
            min(v) == 1,
            spread(v),
        )
    )
    v = figure("range", most)
    checks.append(
        Check(
            "range: most notes at once",
            f"<= {POLYPHONY}",
            max(v, default=math.nan),
            mean(figure("none", most)),
            max(v, default=0) <= POLYPHONY,
            spread(v),
        )
    )
    return checks


def _chord_list(text: str) -> list[dict]:
    return [{"chord": item.split(":")[0], "seconds": float(item.split(":")[1])} for item in text.split()]


def format_checks(checks: list[Check]) -> str:
    def cell(name: str, x: float) -> str:
        if math.isnan(x):
            return "-"
        return f"{x:.2f}" if "notes/s" in name or "at once" in name else f"{100 * x:.1f} %"

    rows = [("control", "target", "measured", "per-sample range", "no control", "")]
    for c in checks:
        low, high = (cell(c.name, x) for x in c.spread)
        rows.append(
            (c.name, c.target, cell(c.name, c.measured), f"{low} .. {high}", cell(c.name, c.baseline),
             "ok" if c.ok else "MISSED")
        )  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


# The figures that show a control held (notes are the continuation's, from time 0)


def in_scale_share(notes, key: tuple[int, str]) -> float:
    """Share of notes whose pitch class is in `key`'s scale (NaN without notes)."""
    if not notes:
        return math.nan
    scale = scale_pitch_classes(key)
    return float(np.mean([n.pitch % 12 in scale for n in notes]))


def chord_at(chords: list[dict], t: float) -> int:
    """Index of the chord sounding at `t` seconds into the continuation (the progression repeats); `chords` as
    `RowControls.applied["chords"]`."""
    ends = np.cumsum([c["seconds"] for c in chords])
    return int(np.searchsorted(ends, math.fmod(t, ends[-1]) + 1e-9, side="right") % len(chords))


def chord_tone_share(notes, chords: list[dict]) -> float:
    """Share of note onsets whose pitch class belongs to the chord sounding at the onset."""
    if not notes:
        return math.nan
    tones = [parse_chord(c["chord"]) for c in chords]
    return float(np.mean([n.pitch % 12 in tones[chord_at(chords, n.start)] for n in notes]))


def in_range_share(notes, low: int, high: int) -> float:
    if not notes:
        return math.nan
    return float(np.mean([low <= n.pitch <= high for n in notes]))
