"""Finding MIDI files on disk: the one place that says which names count as MIDI."""

from __future__ import annotations

from pathlib import Path

MIDI_SUFFIXES = (".mid", ".midi")


def find_midi_files(path: Path) -> list[Path]:
    """The file itself, or every .mid/.midi under the folder (recursive, sorted). FileNotFoundError when the
    path does not exist."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(2, "No such file or directory", str(path))
    return sorted(p for p in path.rglob("*") if p.suffix.lower() in MIDI_SUFFIXES and p.is_file())
