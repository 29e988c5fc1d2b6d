"""Bundled example motifs: indexed exactly, small, usable by the codec, reproducible by server/examples.py."""

from __future__ import annotations

import json

import pretty_midi
import pytest

from musicrel.midi.codec import EventCodec
from server.examples import EXAMPLES, EXAMPLES_DIR, build_examples

MAX_EXAMPLE_BYTES = 20_000


@pytest.fixture(scope="module")
def index() -> list[dict]:
    return json.loads((EXAMPLES_DIR / "index.json").read_text())


def test_index_lists_exactly_the_files_present(index):
    listed = [e["file"] for e in index]
    assert len(listed) == len(set(listed)), "duplicate entries in index.json"
    assert sorted(listed) == sorted(p.name for p in EXAMPLES_DIR.glob("*.mid"))
    assert sorted(p.name for p in EXAMPLES_DIR.iterdir()) == sorted([*listed, "index.json"]), "stray files"
    for entry in index:
        assert set(entry) == {"name", "file", "description"}
        assert entry["name"].strip() and entry["description"].strip()


def test_index_matches_the_generator(index):
    assert index == [{"name": e.name, "file": e.file, "description": e.description} for e in EXAMPLES]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.file)
def test_example_is_small_and_encodes(example):
    path = EXAMPLES_DIR / example.file
    assert path.stat().st_size < MAX_EXAMPLE_BYTES
    codec = EventCodec()
    tokens = codec.encode(path)
    assert len(tokens) > 50, "too short to be a useful motif"
    assert tokens.min() >= 0 and tokens.max() < codec.pad_id, "encode must return event tokens only"
    assert codec.decode_notes(tokens), "the tokens decode to no notes"


def _notes(path) -> list[tuple]:
    pm = pretty_midi.PrettyMIDI(str(path))
    return sorted(
        (i.program, n.pitch, n.velocity, round(n.start, 4), round(n.end, 4))
        for i in pm.instruments
        for n in i.notes
    )


@pytest.mark.parametrize("example", [e for e in EXAMPLES if not e.needs_corpus], ids=lambda e: e.file)
def test_note_by_note_examples_regenerate_identically(example, tmp_path):
    example.build(tmp_path / example.file)
    assert _notes(tmp_path / example.file) == _notes(EXAMPLES_DIR / example.file)


def test_build_examples_regenerates_every_committed_file(tmp_path):
    pytest.importorskip("music21", reason="music21 (the `corpus` extra) builds the corpus examples")
    index = build_examples(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*(e["file"] for e in index), "index.json"])
    assert (tmp_path / "index.json").read_text() == (EXAMPLES_DIR / "index.json").read_text()
    for entry in index:
        assert _notes(tmp_path / entry["file"]) == _notes(EXAMPLES_DIR / entry["file"]), entry["file"]
