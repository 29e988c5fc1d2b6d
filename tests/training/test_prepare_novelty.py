"""`musicrel prepare` writes the train split's novelty index beside the splits: built from the train pieces
only, named without the machine's absolute paths, found again by a held-out transposition, not rebuilt by an
idempotent re-run, rebuilt when the train split changes."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from musicrel.data.prepared import load_split
from musicrel.evaluation.novelty import NoveltyIndexError, load_index
from musicrel.midi.codec import EventCodec
from tests.training.conftest import write_pattern_midi
from training.prepare import prepare


def test_prepare_writes_a_novelty_index_of_the_train_split(pattern_midi_dir, tmp_path):
    src = tmp_path / "patterns"
    shutil.copytree(pattern_midi_dir, src)
    out = tmp_path / "data"
    with pytest.raises(NoveltyIndexError) as e:
        load_index(out)
    assert e.value.code == "novelty_index_missing"

    m = prepare([src], out, workers=1, progress=False)
    train = m["splits"]["train"]["files"]
    info = m["novelty"]
    assert (
        info["file"] == "novelty.npz"
        and info["written"]
        and info["bytes"] == (out / "novelty.npz").stat().st_size
    )
    index = load_index(out)
    assert index.pieces == info["pieces"] == len(train) and index.meta["split"] == "train"
    assert index.notes == info["notes"] == 72 * len(train)  # 12 x 6 notes a piece
    assert sorted(index.shas) == sorted(f["sha256"] for f in train)
    assert sorted(index.names) == sorted(f"patterns/{f['path'].rsplit('/', 1)[1]}" for f in train)

    # Every piece is the same arpeggio in another key: a held-out piece is a whole transposed copy.
    codec = EventCodec()
    stream, offsets = load_split(out, "test")
    held_out = codec.decode_notes(stream[offsets[0] + 1 : offsets[1] - 1])
    match = index.longest_match(held_out)
    assert match.notes == len(held_out) == 72 and match.source in index.names
    assert match.occurrences == len(train) and match.seconds == pytest.approx(71 * 0.25)

    stamp = (out / "novelty.npz").stat().st_mtime_ns
    again = prepare([src], out, workers=1, progress=False)
    assert not again["novelty"]["written"] and again["novelty"]["pieces"] == len(train)
    assert (out / "novelty.npz").stat().st_mtime_ns == stamp

    # More training data: the index follows the train split.
    for i in range(8, 40):
        write_pattern_midi(src / f"more_{i}.mid", 40 + i, repeats=3 + i % 5)
    grown = prepare([src], out, workers=1, progress=False)
    assert grown["novelty"]["written"] and grown["novelty"]["pieces"] == grown["splits"]["train"]["pieces"]
    assert load_index(out).pieces > len(train)


def test_a_damaged_index_is_rebuilt_by_prepare(pattern_midi_dir, tmp_path):
    out = tmp_path / "data"
    prepare([pattern_midi_dir], out, workers=1, progress=False)
    (out / "novelty.npz").write_bytes(b"damaged")
    with pytest.raises(NoveltyIndexError) as e:
        load_index(out)
    assert e.value.code == "novelty_index_corrupt"
    assert prepare([pattern_midi_dir], out, workers=1, progress=False)["novelty"]["written"]
    assert np.all(load_index(out).sa >= 0)


def test_prepare_without_novelty_writes_the_splits_and_no_index(pattern_midi_dir, tmp_path):
    """`--no-novelty` (novelty=False): the same splits, no index file and none in the manifest."""
    with_index = prepare([pattern_midi_dir], tmp_path / "a", workers=1, progress=False)
    without = prepare([pattern_midi_dir], tmp_path / "b", workers=1, progress=False, novelty=False)
    assert "novelty" not in without and not (tmp_path / "b" / "novelty.npz").exists()
    assert without["splits"]["train"]["stream_tokens"] == with_index["splits"]["train"]["stream_tokens"] > 0
    with pytest.raises(NoveltyIndexError):
        load_index(tmp_path / "b")
