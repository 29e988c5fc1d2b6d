"""Shared fixtures. Real MIDI lives in ../shared/midi beside the repo (or $MUSICREL_SHARED); it is not in a
user's clone, so tests that need it skip with a reason when it is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_MIDI = Path(os.environ.get("MUSICREL_SHARED", REPO.parent / "shared")) / "midi"


def _shared_dir(name: str) -> Path:
    path = SHARED_MIDI / name
    if not path.is_dir():
        pytest.skip(f"shared MIDI not available at {path} (set MUSICREL_SHARED to the shared/ folder)")
    return path


@pytest.fixture(scope="session")
def real_midi_dir() -> Path:
    return _shared_dir("real")


@pytest.fixture(scope="session")
def real_midi_files(real_midi_dir) -> list[Path]:
    return sorted(real_midi_dir.glob("*.mid"))


@pytest.fixture(scope="session")
def broken_midi_files() -> list[Path]:
    return sorted(_shared_dir("broken").glob("*.mid"))
