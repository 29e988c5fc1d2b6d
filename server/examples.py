"""The bundled example motifs of the web page, made by code: the repo carries no binaries of unknown origin.

Two come from the music21 corpus (public-domain scores), three are written note by note with pretty_midi.
Regenerate with `python -m server.examples` (needs the `corpus` extra for music21); the .mid files and the
index.json it writes under server/static/examples/ are committed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pretty_midi

EXAMPLES_DIR = Path(__file__).resolve().parent / "static" / "examples"


@dataclass(frozen=True)
class Example:
    name: str
    file: str
    description: str
    build: Callable[[Path], None]
    needs_corpus: bool = False  # built from the music21 corpus (the `corpus` extra)


def _corpus_excerpt(work: str, first_measure: int, last_measure: int) -> Callable[[Path], None]:
    def build(path: Path) -> None:
        from music21 import corpus  # heavy import, only needed when regenerating

        score = corpus.parse(work)
        score.measures(first_measure, last_measure).write("midi", fp=str(path))

    return build


def _write(pm: pretty_midi.PrettyMIDI, path: Path) -> None:
    pm.write(str(path))


def _piano_motif(path: Path) -> None:
    """A four-bar C-major theme over an Alberti bass at 96 bpm: a clean, unambiguous prompt."""
    beat = 60.0 / 96
    pm = pretty_midi.PrettyMIDI(initial_tempo=96)
    piano = pretty_midi.Instrument(program=0, name="Piano")
    melody = [  # (pitch, start beat, length in beats)
        (72, 0, 1),
        (76, 1, 1),
        (79, 2, 1.5),
        (77, 3.5, 0.5),
        (76, 4, 1),
        (74, 5, 1),
        (72, 6, 2),
        (74, 8, 1),
        (77, 9, 1),
        (81, 10, 1.5),
        (79, 11.5, 0.5),
        (77, 12, 1),
        (76, 13, 1),
        (74, 14, 2),
    ]
    for pitch, start, length in melody:
        piano.notes.append(pretty_midi.Note(92, pitch, start * beat, (start + length) * beat - 0.02))
    chords = [(48, 55, 52), (48, 55, 52), (50, 57, 53), (43, 50, 47)]  # C C Dm G as Alberti bass
    for bar, (root, fifth, third) in enumerate(chords):
        for i, pitch in enumerate((root, fifth, third, fifth) * 2):
            start = bar * 4 + i * 0.5
            piano.notes.append(pretty_midi.Note(64, pitch, start * beat, (start + 0.5) * beat - 0.02))
    pm.instruments.append(piano)
    _write(pm, path)


def _blues_riff(path: Path) -> None:
    """A swung twelve-bar-style riff in A on electric piano with a walking bass: two programs, one file."""
    beat = 60.0 / 120
    swing = (0.0, 2 / 3)  # long-short eighth pairs
    pm = pretty_midi.PrettyMIDI(initial_tempo=120)
    keys = pretty_midi.Instrument(program=4, name="Electric Piano")
    bass = pretty_midi.Instrument(program=33, name="Bass")
    for bar, root in enumerate((57, 57, 62, 57)):  # A A D A
        for b in range(4):
            for half, offset in enumerate(swing):
                start = (bar * 4 + b + offset) * beat
                third = root + (4 if (b + half) % 2 == 0 else 3)  # blue wobble: major/minor third
                velocity = 80 if half == 0 else 70
                for pitch in (root, third, root + 7):
                    keys.notes.append(pretty_midi.Note(velocity, pitch, start, start + 0.28 * beat))
            walk = root - 24 + (0, 4, 7, 9)[b]
            bass.notes.append(pretty_midi.Note(84, walk, (bar * 4 + b) * beat, (bar * 4 + b + 0.9) * beat))
    pm.instruments.extend([keys, bass])
    _write(pm, path)


def _band_groove(path: Path) -> None:
    """Four bars of a band at 100 bpm: a drum kit (kick, snare, closed hi-hat in eighths, a crash on the
    first beat), a bass on the roots and fifths, a muted guitar's offbeat chords. Drums and two pitched
    instruments: what a server with an instruments model continues track by track."""
    beat = 60.0 / 100
    pm = pretty_midi.PrettyMIDI(initial_tempo=100)
    drums = pretty_midi.Instrument(program=0, is_drum=True, name="Drums")
    bass = pretty_midi.Instrument(program=33, name="Bass")
    guitar = pretty_midi.Instrument(program=28, name="Guitar")
    for bar, (root, chord) in enumerate(
        ((40, (64, 67, 71)), (40, (64, 67, 71)), (45, (64, 69, 72)), (47, (63, 66, 71)))
    ):
        t = bar * 4
        if bar == 0:
            drums.notes.append(pretty_midi.Note(100, 49, 0.0, 0.5 * beat))  # crash
        for eighth in range(8):
            start = (t + eighth / 2) * beat
            drums.notes.append(pretty_midi.Note(70 if eighth % 2 else 85, 42, start, start + 0.1))  # hi-hat
        for b in (0, 2, 2.5):
            drums.notes.append(pretty_midi.Note(100, 36, (t + b) * beat, (t + b) * beat + 0.1))  # kick
        for b in (1, 3):
            drums.notes.append(pretty_midi.Note(95, 38, (t + b) * beat, (t + b) * beat + 0.1))  # snare
        for b, pitch in ((0, root), (1.5, root), (2, root + 7), (3, root + 12), (3.5, root + 7)):
            bass.notes.append(pretty_midi.Note(90, pitch, (t + b) * beat, (t + b + 0.45) * beat))
        for b in (0.5, 1.5, 2.5, 3.5):
            for pitch in chord:
                guitar.notes.append(pretty_midi.Note(72, pitch, (t + b) * beat, (t + b + 0.3) * beat))
    pm.instruments.extend([drums, bass, guitar])
    _write(pm, path)


EXAMPLES: tuple[Example, ...] = (
    Example(
        "Bach chorale (BWV 66.6)",
        "bach_bwv66_6.mid",
        "Opening bars of a four-voice J. S. Bach chorale, from the music21 corpus.",
        _corpus_excerpt("bach/bwv66.6", 0, 4),
        needs_corpus=True,
    ),
    Example(
        "Chopin mazurka (Op. 6 No. 2)",
        "chopin_mazurka_op6_no2.mid",
        "First sixteen bars of a Chopin mazurka in 3/4, from the music21 corpus.",
        _corpus_excerpt("chopin/mazurka06-2.krn", 1, 16),
        needs_corpus=True,
    ),
    Example(
        "Piano theme in C",
        "piano_theme_c.mid",
        "A four-bar melody over an Alberti bass, written note by note with pretty_midi.",
        _piano_motif,
    ),
    Example(
        "Blues riff in A",
        "blues_riff_a.mid",
        "A swung electric-piano riff with a walking bass (two tracks), written with pretty_midi.",
        _blues_riff,
    ),
    Example(
        "Band groove in E",
        "band_groove_e.mid",
        "Drums, bass and a muted guitar, four bars (three tracks, drums on channel 10), written with "
        "pretty_midi: a server with an instruments model continues each on its track.",
        _band_groove,
    ),
)


def build_examples(out_dir: Path = EXAMPLES_DIR) -> list[dict[str, str]]:
    """Write every example and index.json into out_dir; returns the index entries."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for example in EXAMPLES:
        example.build(out_dir / example.file)
    index = [{"name": e.name, "file": e.file, "description": e.description} for e in EXAMPLES]
    (out_dir / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    return index


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out_dir = Path(args[0]) if args else EXAMPLES_DIR
    for entry in build_examples(out_dir):
        size = (out_dir / entry["file"]).stat().st_size
        sys.stdout.write(f"{entry['file']}: {size} bytes\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
