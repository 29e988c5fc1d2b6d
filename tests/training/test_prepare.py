from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

from musicrel.codec import EventCodec
from musicrel.errors import ConfigError
from training.prepare import assign_splits, codec_hash, load_split, prepare, split_of

SMALL = ("6338816_Etude_No._4.mid", "POP909_008.mid", "POP909_010.mid")


@pytest.fixture()
def small_sources(tmp_path, real_midi_dir, broken_midi_files):
    src = tmp_path / "src"
    (src / "nested").mkdir(parents=True)
    for name in SMALL:
        shutil.copy(real_midi_dir / name, src / name)
    shutil.copy(real_midi_dir / SMALL[0], src / "nested" / "copy_of_etude.MIDI")  # same bytes, other name
    for f in broken_midi_files:
        shutil.copy(f, src / "nested" / f.name)
    (src / "notes.txt").write_text("not MIDI, not picked up")
    return src


def test_prepare_counts_skips_splits_and_arrays(small_sources, tmp_path):
    out = tmp_path / "data"
    m = prepare([small_sources], out, workers=2, progress=False)
    c = m["counts"]
    assert c["found"] == 6  # 3 real + 1 duplicate + 2 broken; the .txt is ignored
    assert c["duplicates"] == 1 and m["duplicates"][0]["path"].endswith("copy_of_etude.MIDI")
    assert c["encoded"] == 3 and c["skipped"] == 2 and c["newly_encoded"] == 5
    assert {s["path"].rsplit("/", 1)[1]: s["code"] for s in m["skipped"]} == {
        "ValueError_Control168.mid": "bad_data_byte",
        "empty.mid": "no_notes",
    }
    codec = EventCodec()
    assert m["codec"] == codec.config.to_dict() and m["codec_hash"] == codec_hash(codec)
    # 3 files: one per split, so val and test are never empty on small data
    assert [m["splits"][s]["pieces"] for s in ("train", "val", "test")] == [1, 1, 1]
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk["counts"] == c
    for split in ("train", "val", "test"):
        stream, offsets = load_split(out, split)
        info = m["splits"][split]
        assert isinstance(stream, np.memmap) and stream.dtype == np.uint16
        assert stream.size == info["stream_tokens"] == offsets[-1]
        piece = info["files"][0]
        # the stored piece is exactly the codec's encoding of that file, between bos and eos
        expected = codec.encode(piece["path"])
        assert stream[0] == codec.bos_id and stream[-1] == codec.eos_id
        np.testing.assert_array_equal(stream[1:-1], expected)
        assert piece["tokens"] == expected.size


def test_rerun_does_no_work(small_sources, tmp_path):
    out = tmp_path / "data"
    prepare([small_sources], out, workers=1, progress=False)
    stamps = {p.name: p.stat().st_mtime_ns for p in out.glob("*.npy")}
    again = prepare([small_sources], out, workers=1, progress=False)
    assert again["counts"]["newly_encoded"] == 0 and again["counts"]["cached"] == 5
    assert again["counts"]["skipped"] == 2  # skips are cached with their codes too
    assert all(not s["written"] for s in again["splits"].values())
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.npy")} == stamps


def test_other_codec_settings_do_not_reuse_the_cache(small_sources, tmp_path):
    from musicrel.codec import CodecConfig

    out = tmp_path / "data"
    prepare([small_sources / "POP909_008.mid"], out, workers=1, progress=False)
    m = prepare(
        [small_sources / "POP909_008.mid"],
        out,
        codec=EventCodec(CodecConfig(velocity_bins=16)),
        workers=1,
        progress=False,
    )
    assert m["counts"]["newly_encoded"] == 1 and m["codec"]["velocity_bins"] == 16


def test_split_is_a_function_of_the_hash():
    hashes = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(300)]
    splits = assign_splits(hashes)
    assert splits == assign_splits(list(reversed(hashes)))
    assert all(splits[h] == split_of(h) for h in hashes)  # large sets: no adjustment
    counts = {s: list(splits.values()).count(s) for s in ("train", "val", "test")}
    assert counts["train"] > 240 and counts["val"] > 0 and counts["test"] > 0


def test_missing_source_and_unprepared_folder(tmp_path):
    with pytest.raises(FileNotFoundError):
        prepare([tmp_path / "nope"], tmp_path / "out", progress=False)
    with pytest.raises(ConfigError) as err:
        load_split(tmp_path, "train")
    assert err.value.code == "not_prepared"
