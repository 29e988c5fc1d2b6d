"""`musicrel evaluate-accompaniments`: accompaniments of held-out POP909 melodies set against the song's own
PIANO track, with baselines in the same run.

Each song gives one excerpt: `seconds` of its MELODY track from the first downbeat at or before the melody's
first note, moved to time 0; every system accompanies that melody and is scored against the annotations of
the same stretch (`chord_midi.txt`, `beat_midi.txt`, which every POP909 song folder holds):

- harmony: of the accompaniment notes sounding at a downbeat (struck up to ONSET_SLACK after it counts:
  players are not on the grid), the share whose pitch class is in the annotated chord (its bass included);
  downbeats annotated "N" (no chord) are skipped;
- clashes: of the accompaniment notes sounding at a beat while a melody note sounds, the share a semitone
  (or a major seventh / minor ninth: pitch classes 1 apart) from that melody note;
- texture: IOI, duration and polyphony, notes per second; IOI and duration histograms overlap with the real
  accompaniment's (musicrel.evaluation.metrics).

Systems: `model` (the accompaniment model), `chords` (the same model told the song's annotated chords through
the chords control: what the melody alone cannot tell it), `real` (the PIANO track: the ceiling), `rule`
(block chords on each beat from the melody's pitch classes in that bar), `continuation` (a continuation model
writing piano music from nothing, ignoring the melody). Figures are means over songs (each song's seeds
averaged first) with 95 % bootstrap intervals over songs.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pretty_midi

from musicrel.errors import ConfigError
from musicrel.evaluation.metrics import (
    bootstrap_interval,
    duration_histogram,
    histogram_overlap,
    ioi_histogram,
    note_density,
    polyphony,
)
from musicrel.generation.controls import MAX_CHORDS, ControlError, Controls, parse_chord
from musicrel.model.weights import DEFAULT_DECODE_WEIGHTS

ONSET_SLACK = 0.05  # seconds: a note struck this soon after a beat sounds "at" it
SYSTEMS = ("model", "chords", "real", "rule", "continuation")
# The `chords` system's pull toward the told chord's tones, in nats: on the 41 test songs (2026-11-25) the
# control's default ("prefer", 3) gave harmony 0.690, 5 gave 0.722 with clashes and density unchanged.
TOLD_CHORD_STRENGTH = 5.0
# mir_eval qualities (chord_midi.txt) -> the chords control's; others sound as their root's major triad
QUALITIES = {
    "maj": "", "min": "m", "7": "7", "maj7": "maj7", "min7": "m7", "dim": "dim", "dim7": "dim7",
    "hdim7": "m7b5", "aug": "aug", "sus2": "sus2", "sus4": "sus4", "maj6": "6", "min6": "m6",
}  # fmt: skip
RULE_OCTAVE = 48  # the rule's chords sit in C3..B3
RULE_VELOCITY = 64
MELODY_PROGRAM_NAME = "MELODY"


@dataclass
class Song:
    name: str
    melody: list  # pretty_midi.Note, excerpt time
    real: list  # the PIANO track's notes in the excerpt
    beats: np.ndarray  # beat times in the excerpt
    downbeats: np.ndarray
    chords: list  # (start, end, frozenset of pitch classes or None for "N")
    seconds: float
    chord_labels: tuple = ()  # chord_midi.txt's label of each of `chords` ("G:min", "N")


def _chord_pcs(label: str) -> frozenset[int] | None:
    import mir_eval.chord

    root, bitmap, bass = mir_eval.chord.encode(label)
    if root < 0:
        return None
    pcs = {(root + i) % 12 for i in np.flatnonzero(bitmap)}
    return frozenset(pcs | {(root + bass) % 12})


def _excerpt(notes, start: float, end: float) -> list:
    """Notes struck in [start, end), moved to start at 0 and cut at `end`."""
    return [
        pretty_midi.Note(n.velocity, n.pitch, n.start - start, min(n.end, end) - start)
        for n in notes
        if start <= n.start < end
    ]


def load_song(folder: Path, seconds: float) -> Song:
    """One POP909 song folder (NNN/NNN.mid, beat_midi.txt, chord_midi.txt) as an excerpt."""
    from musicrel.midi.codec import EventCodec

    midi = folder / f"{folder.name}.mid"
    pm = EventCodec().read(midi)
    by_name = {inst.name.upper(): inst for inst in pm.instruments}
    if "MELODY" not in by_name or "PIANO" not in by_name:
        raise ConfigError(f"{midi}: a POP909 song has MELODY and PIANO tracks", code="not_pop909")
    beat_rows = np.loadtxt(folder / "beat_midi.txt", ndmin=2)
    beats, down = beat_rows[:, 0], beat_rows[:, 0][beat_rows[:, 2] > 0]
    melody = sorted(by_name["MELODY"].notes, key=lambda n: n.start)
    first = melody[0].start
    before = down[down <= first + ONSET_SLACK]
    start = float(before[-1]) if len(before) else max(0.0, first)
    end = start + seconds
    chords, labels = [], []
    for line in (folder / "chord_midi.txt").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and float(parts[1]) > start and float(parts[0]) < end:
            chords.append((float(parts[0]) - start, float(parts[1]) - start, _chord_pcs(parts[2])))
            labels.append(parts[2])
    return Song(
        name=folder.name,
        melody=_excerpt(melody, start, end),
        real=_excerpt(by_name["PIANO"].notes, start, end),
        beats=beats[(beats >= start) & (beats < end)] - start,
        downbeats=down[(down >= start) & (down < end)] - start,
        chords=chords,
        seconds=seconds,
        chord_labels=tuple(labels),
    )


def held_out_songs(data_dir, split: str = "test") -> list[Path]:
    """The song folders of a split of a prepared accompaniment folder (`musicrel prepare ... --melody`)."""
    from musicrel.data.prepared import load_manifest

    manifest = load_manifest(data_dir)
    if not manifest["codec"].get("melody"):
        raise ConfigError(f"{data_dir} was not prepared with --melody", code="not_accompaniment_data")
    return sorted({Path(f["path"]).parent for f in manifest["splits"][split]["files"]})


# ---------------------------------------------------------------- the figures
def _sounding(notes, t: float) -> list:
    return [n for n in notes if n.start <= t + ONSET_SLACK and n.end > t]


def harmony(notes, song: Song) -> tuple[int, int]:
    """(in the chord, all) accompaniment notes sounding at the annotated downbeats."""
    hit = total = 0
    for d in song.downbeats:
        chord = next((pcs for a, b, pcs in song.chords if a <= d < b), None)
        if chord is None:
            continue
        for n in _sounding(notes, d):
            total += 1
            hit += n.pitch % 12 in chord
    return hit, total


def clashes(notes, song: Song) -> tuple[int, int]:
    """(a semitone from the melody, all) accompaniment notes sounding at beats where a melody note sounds."""
    bad = total = 0
    for b in song.beats:
        tune = [m for m in song.melody if m.start <= b + ONSET_SLACK and m.end > b]
        if not tune:
            continue
        top = tune[-1].pitch % 12
        for n in _sounding(notes, b):
            total += 1
            bad += (n.pitch - top) % 12 in (1, 11)
    return bad, total


def chord_symbol(label: str) -> str:
    """A chord_midi.txt label (mir_eval: "G:min7/b3") as the chords control spells it ("Gm7"); a quality the
    control lacks becomes its root's major triad, the bass is dropped."""
    root, _, quality = label.partition(":")
    symbol = root + QUALITIES.get(quality.split("/")[0].split("(")[0], "")
    try:
        parse_chord(symbol)
    except ControlError:
        return root
    return symbol


def told_chords(song: Song) -> str | None:
    """The excerpt's annotated chords as the chords control's text, in seconds from its start ("Gm:3.08
    F:3.08 ..."); a stretch marked "N" keeps the chord before it (the first chord when it opens the excerpt).
    None when no chord is annotated. At most MAX_CHORDS chords (the control repeats its list: a longer
    excerpt would wrap around)."""
    named = [lab for lab in song.chord_labels if lab != "N"]
    if not named:
        return None
    out, last = [], named[0]
    for (a, b, _), label in zip(song.chords, song.chord_labels, strict=True):
        seconds = min(b, song.seconds) - max(a, 0.0)
        last = label if label != "N" else last
        if seconds >= 0.01:
            out.append(f"{chord_symbol(last)}:{seconds:.3f}")
    return " ".join(out[:MAX_CHORDS]) or None


def rule_accompaniment(song: Song) -> list:
    """Block chords on each beat: the (up to three) pitch classes the melody holds longest in that bar,
    voiced upward from RULE_OCTAVE."""
    bars = list(song.downbeats) + [song.seconds]
    out = []
    for a, b in zip(bars[:-1], bars[1:], strict=True):
        weight = np.zeros(12)
        for m in song.melody:
            weight[m.pitch % 12] += max(0.0, min(m.end, b) - max(m.start, a))
        pcs = [int(p) for p in np.argsort(-weight, kind="stable")[:3] if weight[p] > 0]
        beats = [t for t in song.beats if a <= t < b]
        for i, t in enumerate(beats):
            end = beats[i + 1] if i + 1 < len(beats) else b
            out += [pretty_midi.Note(RULE_VELOCITY, RULE_OCTAVE + pc, float(t), float(end)) for pc in pcs]
    return out


def describe(notes, song: Song) -> dict[str, float]:
    hit, total = harmony(notes, song)
    bad, at_beats = clashes(notes, song)
    mean_poly, _ = polyphony(notes)
    real_ioi, real_dur = ioi_histogram(song.real), duration_histogram(song.real)
    return {
        "harmony": hit / total if total else math.nan,
        "clashes": bad / at_beats if at_beats else math.nan,
        "notes/s": note_density(notes, song.seconds),
        "polyphony": mean_poly,
        "IOI overlap": histogram_overlap(ioi_histogram(notes), real_ioi) if notes else 0.0,
        "duration overlap": histogram_overlap(duration_histogram(notes), real_dur) if notes else 0.0,
    }


METRICS = ("harmony", "clashes", "notes/s", "polyphony", "IOI overlap", "duration overlap")


# ---------------------------------------------------------------- the run
def _continuations(model, codec, seconds: float, seeds: list[int]) -> list[list]:
    """Piano music from nothing (bos), one per seed: the continuation model, deaf to the melody."""
    import torch

    from musicrel.generation.decode import collect_rows, generate
    from musicrel.generation.grammar import MAX_HOLD_SECONDS, Grammar
    from musicrel.generation.sampling import TOKENS_PER_SECOND_CAP, SamplingParams, row_seed

    B, step_ms = len(seeds), codec.config.step_ms
    limit = math.ceil(seconds * 1000.0 / step_ms)
    prompts = [np.array([codec.bos_id])] * B
    grammar = Grammar(codec, prompts, [limit] * B, [round(MAX_HOLD_SECONDS * 1000.0 / step_ms)] * B)
    gens = [torch.Generator().manual_seed(row_seed(s, 0)) for s in seeds]
    prompt = torch.full((B, 1), codec.bos_id, dtype=torch.long)
    defaults = SamplingParams()  # the continuation model as the service runs it
    it = generate(
        model,
        prompt,
        int(seconds * TOKENS_PER_SECOND_CAP) + 64,
        temperature=defaults.temperature,
        top_k=defaults.top_k,
        top_p=defaults.top_p,
        generators=gens,
        grammar=grammar,
    )
    out = collect_rows(it, B, lambda: grammar.elapsed < grammar.limit)
    return [codec.decode_notes(o) for o in out]


@dataclass(frozen=True)
class AccompanimentEvaluationOptions:
    """What `evaluate_accompaniments` runs (the defaults of `musicrel evaluate-accompaniments`): the songs of
    `split` (at most `limit`), an excerpt of `seconds` each, `seeds` samples per song and system, `systems`
    (the `continuation` one needs its model folder), the models' `weights` while they decode."""

    split: str = "test"
    seeds: int = 3
    seconds: float = 30.0
    systems: tuple[str, ...] = SYSTEMS
    continuation: str | None = None
    limit: int | None = None
    weights: str = DEFAULT_DECODE_WEIGHTS


_DEFAULTS = AccompanimentEvaluationOptions()


def evaluate_accompaniments(
    checkpoint,
    data_dir,
    *,
    split: str = _DEFAULTS.split,
    seeds: int = _DEFAULTS.seeds,
    seconds: float = _DEFAULTS.seconds,
    systems: tuple[str, ...] = _DEFAULTS.systems,
    continuation: str | None = _DEFAULTS.continuation,
    limit: int | None = _DEFAULTS.limit,
    progress=None,
    weights: str = _DEFAULTS.weights,
) -> dict:
    """The report (see the module docstring) as a dict: per system, per metric, mean and interval. `weights`:
    how the models hold their weights while they decode (DECODE_WEIGHTS)."""
    from musicrel.generation.accompaniment import AccompanimentParams, accompany_notes
    from musicrel.model.checkpoint import check_decode_weights, load_codec, load_model

    check_decode_weights(weights)
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        raise ConfigError(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}", code="bad_systems")
    if "continuation" in systems and not continuation:
        raise ConfigError("the continuation system needs --continuation MODEL_FOLDER", code="bad_systems")
    folders = held_out_songs(data_dir, split)[:limit]
    songs = [load_song(f, seconds) for f in folders]
    songs = [s for s in songs if s.melody and s.real]
    needs_model = {"model", "chords"} & set(systems)
    model = load_model(checkpoint, weights=weights) if needs_model else None
    codec = load_codec(checkpoint) if needs_model else None
    cont_model = load_model(continuation, weights=weights) if "continuation" in systems else None
    cont_codec = load_codec(continuation) if "continuation" in systems else None
    per_song: dict[str, list[dict]] = {s: [] for s in systems}
    timing = {s: 0.0 for s in systems}
    for k, song in enumerate(songs):
        for system in systems:
            t0 = time.perf_counter()
            if system == "real":
                samples = [song.real]
            elif system == "rule":
                samples = [rule_accompaniment(song)]
            elif system in ("model", "chords"):
                told = told_chords(song) if system == "chords" else None
                controls = None if told is None else Controls(chords=told, chord_strength=TOLD_CHORD_STRENGTH)
                params = AccompanimentParams(seed=k, num_samples=seeds, controls=controls)
                tokens, *_ = accompany_notes(model, codec, song.melody, params)
                samples = [codec.decode_notes(t) for t in tokens]
            else:
                samples = _continuations(
                    cont_model, cont_codec, seconds, [k * 1000 + i for i in range(seeds)]
                )
            timing[system] += time.perf_counter() - t0
            rows = [describe(n, song) for n in samples]
            per_song[system].append({m: _mean([r[m] for r in rows]) for m in METRICS})
        if progress:
            progress(k + 1, len(songs))
    report = {
        "songs": len(songs),
        "seeds": seeds,
        "seconds": seconds,
        "split": split,
        "weights": weights,
        "systems": list(systems),
        "song_names": [s.name for s in songs],
        "metrics": {},
        "timing_seconds": {s: round(t, 1) for s, t in timing.items()},
    }
    for system in systems:
        report["metrics"][system] = {}
        for m in METRICS:
            report["metrics"][system][m] = bootstrap_interval([row[m] for row in per_song[system]])
    return report


def _mean(values) -> float:
    x = [v for v in values if math.isfinite(v)]
    return float(np.mean(x)) if x else math.nan


def format_report(report: dict) -> str:
    systems = report["systems"]
    lines = [
        f"{report['songs']} held-out POP909 songs ({report['split']}), {report['seconds']:g} s each, "
        f"{report['seeds']} seeds; mean [95 % bootstrap interval over songs]",
        f"{'':<18}" + "".join(f"{s:>22}" for s in systems),
    ]
    for m in METRICS:
        cells = []
        for s in systems:
            v = report["metrics"][s][m]
            fmt = "{:.2f}" if m not in ("harmony", "clashes") else "{:.3f}"
            cells.append(
                "-"
                if v["mean"] is None
                else f"{fmt.format(v['mean'])} [{fmt.format(v['low'])},{fmt.format(v['high'])}]"
            )
        lines.append(f"{m:<18}" + "".join(f"{c:>22}" for c in cells))
    lines.append("time: " + ", ".join(f"{s} {t:.0f} s" for s, t in report["timing_seconds"].items()))
    return "\n".join(lines)


def write_report(report: dict, out) -> dict[str, Path]:
    """report.json and report.txt (the console table) in `out` (created); returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "report.json", "txt": out / "report.txt"}
    paths["json"].write_text(json.dumps(report, indent=1))
    paths["txt"].write_text(format_report(report) + "\n")
    return paths
