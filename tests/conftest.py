"""Shared fixtures. Real MIDI lives in ../shared/midi beside the repo (or $MUSICREL_SHARED); it is not in a
user's clone, so tests that need it skip with a reason when it is absent."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_MIDI = Path(os.environ.get("MUSICREL_SHARED", REPO.parent / "shared")) / "midi"


def pytest_configure(config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs two workers, one a core
        import torch

        # A tiny model's op is too small to split: a second thread per worker only waits at each op's
        # barrier for the core the other worker holds. Tests and commands that choose threads still do.
        torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items) -> None:
    """Under xdist (`make test`: `--dist loadfile --no-loadscope-reorder` hands out whole files in this
    order) the files with `long(seconds)` tests go first, the longest first: one worker is on them while the
    other takes the many short files, instead of one starting a minutes-long test when the rest is done."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        seconds: dict[Path, float] = {}
        for item in items:
            mark = item.get_closest_marker("long")
            seconds[item.path] = seconds.get(item.path, 0.0) + (mark.args[0] if mark else 0.0)
        items.sort(key=lambda item: -seconds[item.path])  # stable: each file's tests stay in order


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
def read_real_midi():
    """path -> the PrettyMIDI the codec reads from it, each file parsed once a session (0.1-2.5 s a file;
    several tests read them all). Shared: a test must not change what it gets."""
    from musicrel.midi.codec import EventCodec

    return functools.cache(EventCodec().read)


@pytest.fixture(scope="session")
def broken_midi_files() -> list[Path]:
    return sorted(_shared_dir("broken").glob("*.mid"))
