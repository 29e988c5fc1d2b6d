from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

from musicrel.data.prepared import load_split
from musicrel.errors import ConfigError
from musicrel.midi.codec import EventCodec
from training.prepare import assign_splits, codec_hash, prepare, split_of

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
    from musicrel.midi.codec import CodecConfig

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


def _tune_file(path, seed: int, transpose: int = 0, jitter: float = 0.0):
    """A MIDI file of a random tune (seed), optionally transposed and with onset jitter (another version)."""
    import pretty_midi

    rng = np.random.default_rng(seed)
    pitches = 60 + np.cumsum(rng.choice([-5, -3, -2, -1, 1, 2, 3, 4, 7], size=80)) % 24
    pm = pretty_midi.PrettyMIDI()
    inst = pretty_midi.Instrument(0)
    for i, p in enumerate(pitches):
        t = max(0.0, i * 0.3 + (rng.uniform(-jitter, jitter) if jitter else 0.0))
        inst.notes.append(pretty_midi.Note(80, int(p) + transpose, t, t + 0.25))
    pm.instruments.append(inst)
    path.parent.mkdir(parents=True, exist_ok=True)
    pm.write(str(path))
    return path


@pytest.fixture()
def two_corpora(tmp_path):
    """folk/: 6 tunes; piano/: 8 tunes, each a folder of a score and two performances (one transposed)."""
    for i in range(6):
        _tune_file(tmp_path / "folk" / f"tune{i}.mid", seed=100 + i)
    for i in range(8):
        _tune_file(tmp_path / "piano" / f"piece{i}" / "score.mid", seed=i)
        _tune_file(tmp_path / "piano" / f"piece{i}" / "perf1.mid", seed=i, jitter=0.02)
        _tune_file(tmp_path / "piano" / f"piece{i}" / "perf2.mid", seed=i, transpose=2, jitter=0.03)
    return tmp_path


def test_sources_are_named_weighted_and_laid_out_one_after_another(two_corpora, tmp_path):
    root = two_corpora
    m = prepare(
        [f"scores={root}/piano/**/score.mid", str(root / "piano"), f"folk={root / 'folk'}"],
        tmp_path / "data",
        workers=1,
        progress=False,
        weights={"folk": 0.5},
    )
    assert [s["name"] for s in m["sources"]] == ["scores", "piano", "folk"]
    assert m["weights"] == {"scores": 1.0, "piano": 1.0, "folk": 0.5}
    files = [f for info in m["splits"].values() for f in info["files"]]
    by_source = {}
    for f in files:
        by_source.setdefault(f["source"], []).append(f["path"].rsplit("/", 1)[1])
    # a file found by two sources belongs to the first: the scores are not also "piano"
    assert sorted(set(by_source["scores"])) == ["score.mid"] and len(by_source["scores"]) == 8
    assert sorted(set(by_source["piano"])) == ["perf1.mid", "perf2.mid"] and len(by_source["folk"]) == 6
    for split, info in m["splits"].items():
        stream, offsets = load_split(tmp_path / "data", split)
        pos = 0
        for name, r in info["sources"].items():
            mine = [f for f in info["files"] if f["source"] == name]
            assert r["start"] == pos and r["pieces"] == len(mine)
            assert r["event_tokens"] == sum(f["tokens"] for f in mine)
            pos = r["end"]
        assert pos == stream.size


def test_versions_of_a_composition_share_a_split(two_corpora, tmp_path):
    m = prepare([two_corpora / "piano", two_corpora / "folk"], tmp_path / "data", workers=1, progress=False)
    split_of_file = {f["path"]: s for s, info in m["splits"].items() for f in info["files"]}
    for i in range(8):
        folder = str(two_corpora / "piano" / f"piece{i}")
        assert len({s for p, s in split_of_file.items() if p.startswith(folder + "/")}) == 1
    c = m["compositions"]
    assert c["multi_file_groups"] == 8 and c["largest_group"] == 3 and c["files_in_multi_file_groups"] == 24
    assert c["groups"] == 8 + 6
    assert all(len({p.rsplit("/", 2)[1] for p in g["files"]}) == 1 for g in c["multi_file"])


@pytest.mark.parametrize(
    "sources, weights, match",
    [
        (["a=X", "a=Y"], None, "share a name"),
        (["a=X"], {"b": 1}, "unknown sources"),
        (["a=X"], {"a": -1}, ">= 0"),
        (["a=X"], {"a": 0}, "one > 0"),
    ],
)
def test_bad_sources_and_weights_are_refused(two_corpora, tmp_path, sources, weights, match):
    sources = [
        s.replace("X", str(two_corpora / "folk")).replace("Y", str(two_corpora / "piano")) for s in sources
    ]
    with pytest.raises(ConfigError, match=match) as err:
        prepare(sources, tmp_path / "data", workers=1, progress=False, weights=weights)
    assert err.value.code == "bad_sources"


def test_prepare_cli_takes_named_sources_and_weights(two_corpora, tmp_path, capsys):
    from musicrel.cli import main

    out = tmp_path / "data"
    rc = main(
        [
            "prepare",
            f"folk={two_corpora / 'folk'}",
            str(two_corpora / "piano"),
            "--weight",
            "folk=3",
            "--out",
            str(out),
            "--workers",
            "1",
            "--quiet",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "groups of versions (largest 3)" in text and "weights: folk 3, piano 1" in text
    assert rc == 0 and json.loads((out / "manifest.json").read_text())["weights"] == {
        "folk": 3.0,
        "piano": 1.0,
    }
    assert main(["prepare", str(two_corpora / "folk"), "--weight", "folk", "--out", str(out)]) == 2
    assert "NAME=NUMBER" in capsys.readouterr().err
