"""Keys: the names of the pitch classes, a key's one text form ("C:major", `key_label`), and the
Krumhansl-Schmuckler key of some notes (`find_key`). Controls detect the motif's key with it (`--key auto`);
the evaluation scores how well music stays in a key."""

from __future__ import annotations

import math

import numpy as np

MAJOR_PROFILE = np.array([6.35, 2.23, 3.48, 2.33, 4.38, 4.09, 2.52, 5.19, 2.39, 3.66, 2.29, 2.88])
MINOR_PROFILE = np.array([6.33, 2.68, 3.52, 5.38, 2.60, 3.53, 2.54, 4.75, 3.98, 2.69, 3.34, 3.17])
PITCH_NAMES = ("C", "C#", "D", "Eb", "E", "F", "F#", "G", "Ab", "A", "Bb", "B")


def pitch_class_histogram(notes, weight: str = "count") -> np.ndarray:
    """(12,) share of notes per pitch class, or of sounding time with weight="duration" (zeros: no notes)."""
    w = [n.end - n.start for n in notes] if weight == "duration" else None
    counts = np.bincount([n.pitch % 12 for n in notes], weights=w, minlength=12).astype(np.float64)
    return counts / counts.sum() if counts.sum() > 0 else counts


def key_profile(key: tuple[int, str]) -> np.ndarray:
    """(12,) Krumhansl-Kessler profile of (tonic pitch class, "major" | "minor"), indexed by pitch class."""
    tonic, mode = key
    return np.roll(MAJOR_PROFILE if mode == "major" else MINOR_PROFILE, tonic)


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    if np.std(a) == 0 or np.std(b) == 0:
        return math.nan
    return float(np.corrcoef(a, b)[0, 1])


def find_key(notes) -> tuple[int, str] | None:
    """Krumhansl-Schmuckler: the (tonic, mode) whose profile correlates best with the duration-weighted
    pitch-class histogram; None when the notes give no histogram to correlate (none, or all classes equal)."""
    hist = pitch_class_histogram(notes, weight="duration")
    if np.std(hist) == 0:
        return None
    keys = [(tonic, mode) for mode in ("major", "minor") for tonic in range(12)]
    return max(keys, key=lambda k: correlation(hist, key_profile(k)))


def key_label(key: tuple[int, str]) -> str:
    """A key's one text form, "C:major", as controls.parse_key reads it (controls, warnings, reports)."""
    return f"{PITCH_NAMES[key[0]]}:{key[1]}"
