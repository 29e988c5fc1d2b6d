"""The instruments of a piece and of a continuation, for a model whose codec has them
(`CodecConfig.instruments`): a piece as `Parts` ({instrument: its notes}; General MIDI programs 0..127 and
DRUMS), the figures the report adds per instrument (`continuity`: do the motif's instruments go on playing;
`drum_groove`: do the drums keep the truth's rhythm) and the classifier's `instruments` feature family
(`feature_names`, `features`).

The evaluation's other figures read the pitched notes of every instrument merged (`pitched`): a drum's "pitch"
is a sound (38 a snare, 42 a closed hi-hat), not a pitch class or a register, so the drums are scored here
only. A codec without instruments has no parts: its report is the piano's.
"""

from __future__ import annotations

import math

import numpy as np
import pretty_midi

from musicrel.evaluation.metrics import (
    IOI_EDGES,
    METRICS,
    histogram,
    histogram_overlap,
    inter_onset_intervals,
)
from musicrel.midi.instruments import DRUMS, instrument_of

Parts = dict[int, list]  # instrument (program 0..127, DRUMS) -> its notes (pretty_midi.Note)

# The continuity question: an instrument sounding in the motif's last TAIL_SECONDS should play in
# the continuation's first HEAD_SECONDS wherever the truth has it play there.
TAIL_SECONDS = 5.0
HEAD_SECONDS = 10.0
# General MIDI's 16 instrument classes of 8 programs (pretty_midi's names): the classifier's columns per
# class, since one column per program (128) would be empty in nearly every piece.
CLASSES = tuple(pretty_midi.program_to_instrument_class(8 * k) for k in range(16))
KEY_EDGES = np.arange(129)  # one bin per MIDI key (drum sounds, for `drum_kit`)
MISSING_PITCH = math.nan  # a class that does not play has no register (twosample reads NaN as "no value")


def parts_of(notes, instruments) -> Parts:
    """{instrument: its notes} of parallel lists, instruments ascending (drums last)."""
    parts: Parts = {i: [] for i in sorted(set(instruments))}
    for note, i in zip(notes, instruments, strict=True):
        parts[int(i)].append(note)
    return parts


def midi_parts(pm) -> Parts:
    """{instrument: its notes} of a PrettyMIDI's tracks (`instrument_of`: tracks of one instrument merged, as
    the codec merges them), each instrument's notes by (start, pitch)."""
    parts: Parts = {}
    for inst in pm.instruments:
        if inst.notes:
            parts.setdefault(instrument_of(inst.program, inst.is_drum), []).extend(inst.notes)
    return {i: sorted(parts[i], key=lambda n: (n.start, n.pitch)) for i in sorted(parts)}


def pitched(parts: Parts) -> list:
    """Every instrument's notes but the drums', merged, by (start, pitch): what the pitch figures read."""
    return sorted((n for i, ns in parts.items() if i != DRUMS for n in ns), key=lambda n: (n.start, n.pitch))


def window_parts(parts: Parts, start: float, end: float) -> Parts:
    """The notes that start in [start, end), as they are (times unchanged); instruments with none left out."""
    out = {i: [n for n in ns if start <= n.start < end] for i, ns in parts.items()}
    return {i: ns for i, ns in out.items() if ns}


def playing(parts: Parts, start: float, end: float) -> set[int]:
    """The instruments that strike a note in [start, end)."""
    return set(window_parts(parts, start, end))


def sounding(parts: Parts, start: float, end: float) -> set[int]:
    """The instruments with a note sounding at some time of [start, end) (struck before it and held too)."""
    return {i for i, ns in parts.items() if any(n.start < end and n.end > start for n in ns)}


def continuity_cases(context: Parts, truth: Parts, generated: Parts) -> tuple[int, int]:
    """(cases, kept): the instruments sounding in the context's last TAIL_SECONDS (times relative to the cut,
    so negative) that the truth plays in its first HEAD_SECONDS, and how many of them the continuation plays
    there too. An instrument the truth lets rest is no case: resting it is no fault."""
    cases = sounding(context, -TAIL_SECONDS, 0.0) & playing(truth, 0.0, HEAD_SECONDS)
    return len(cases), len(cases & playing(generated, 0.0, HEAD_SECONDS))


def pooled_cases(samples) -> dict:
    """The continuity question pooled over every case of `samples`, (context, truth, generated) each, as the
    issue counts it: {cases, kept, share} (`continuity_cases`; share None without a case)."""
    cases = kept = 0
    for context, truth, generated in samples:
        c, k = continuity_cases(context, truth, generated)
        cases, kept = cases + c, kept + k
    return {"cases": cases, "kept": kept, "share": round(kept / cases, 4) if cases else None}


def continuity(context: Parts, truth: Parts, generated: Parts) -> float:
    """The share of `continuity_cases` the continuation keeps playing (NaN where there is no case)."""
    cases, kept = continuity_cases(context, truth, generated)
    return kept / cases if cases else math.nan


def drum_onsets(parts: Parts) -> np.ndarray:
    """The drums' distinct onsets (10 ms apart or more: a kick and a cymbal struck together are one)."""
    return np.unique(np.round([n.start for n in parts.get(DRUMS, [])], 2))


def drum_groove(generated: Parts, truth: Parts) -> float:
    """Overlap (0..1) of the drum-onset IOI histograms of the continuation and the truth (bins
    `metrics.IOI_EDGES`): does the drumming keep the truth's rhythm. NaN where the truth's drums have no IOI
    (fewer than two onsets): there is no groove to keep. A continuation without drums scores 0 there."""
    truth_ioi = inter_onset_intervals(truth.get(DRUMS, []))
    if not len(truth_ioi):
        return math.nan
    generated_ioi = inter_onset_intervals(generated.get(DRUMS, []))
    return histogram_overlap(histogram(generated_ioi, IOI_EDGES), histogram(truth_ioi, IOI_EDGES))


def drum_kit(generated: Parts, truth: Parts) -> float:
    """Overlap (0..1) of the drum-key histograms (how often each drum sound is struck) of the continuation
    and the truth: does the drumming keep the truth's kit (a percussion groove played on a rock kit scores
    low; the classifier reads no drum keys). NaN where the truth has no drums; 0 where the continuation
    drops them."""
    truth_keys = [n.pitch for n in truth.get(DRUMS, [])]
    if not truth_keys:
        return math.nan
    keys = [n.pitch for n in generated.get(DRUMS, [])]
    return histogram_overlap(histogram(keys, KEY_EDGES), histogram(truth_keys, KEY_EDGES))


def scores(context: Parts, truth: Parts, generated: Parts) -> dict[str, float]:
    """The report's instrument figures of one continuation (metrics.METRICS' `instruments` rows)."""
    return {
        "instrument_continuity": continuity(context, truth, generated),
        "drum_groove": drum_groove(generated, truth),
        "drum_kit": drum_kit(generated, truth),
    }


# the figures that compare a continuation's pitched notes with the truth's
COMPARED = frozenset(m.name for m in METRICS if not (m.intrinsic or m.tokens or m.index or m.instruments))


def with_parts(figures: dict, context: Parts, truth: Parts, generated: Parts | None) -> dict:
    """`figures` (a continuation's or a fill's, its pitched notes against the truth's) with the instrument
    figures of its parts (`scores`). A truth with no pitched note (drums alone) has nothing for the pitch
    figures to compare with: they are left empty, not "alike" as two empty histograms would read."""
    figures.update(scores(context, truth, generated or {}))
    if not any(ns for i, ns in truth.items() if i != DRUMS):
        figures.update(dict.fromkeys(COMPARED, math.nan))
    return figures


# ----------------------------------------------------------------------------------------------------------
# The classifier's `instruments` family


def _ioi_bins() -> list[str]:
    return [
        f"{lo:g}-{hi:g} s" if math.isfinite(hi) else f">={lo:g} s"
        for lo, hi in zip(IOI_EDGES[:-1], IOI_EDGES[1:], strict=True)
    ]


def feature_names() -> list[str]:
    """'instruments: name' for every column `features` returns, in order."""
    names = ["instruments: how many play", "instruments: motif's kept", "instruments: new"]
    for c in CLASSES:
        names += [f"instruments: {c} plays", f"instruments: {c} notes/s", f"instruments: {c} mean pitch"]
    names += ["instruments: drums play", "instruments: drum onsets/s"]
    names += [f"instruments: drum IOI {b}" for b in _ioi_bins()]
    return names


def features(parts: Parts, context: Parts, seconds: float) -> np.ndarray:
    """The columns of `feature_names` for one continuation: which instruments play (and whether they are the
    context's), each General MIDI class's notes/s and mean pitch, the drums' onsets and their IOI histogram.
    parts: the continuation from time 0 (clipped to `seconds`); context: what it follows, times relative to
    the cut (negative)."""
    heard = {i for i, ns in parts.items() if ns}
    tail = sounding(context, -TAIL_SECONDS, 0.0)
    cols: list[float] = [
        float(len(heard)),
        len(tail & heard) / len(tail) if tail else math.nan,
        float(len(heard - set(context))),
    ]
    by_class: dict[int, list] = {}
    for i, ns in parts.items():
        if i != DRUMS:
            by_class.setdefault(i // 8, []).extend(ns)
    for k in range(len(CLASSES)):
        ns = by_class.get(k, [])
        cols += [
            float(bool(ns)),
            len(ns) / seconds,
            float(np.mean([n.pitch for n in ns])) if ns else MISSING_PITCH,
        ]
    onsets = drum_onsets(parts)
    cols += [float(bool(len(onsets))), len(onsets) / seconds]
    cols += list(histogram(inter_onset_intervals(parts.get(DRUMS, [])), IOI_EDGES))
    return np.asarray(cols, dtype=np.float64)
