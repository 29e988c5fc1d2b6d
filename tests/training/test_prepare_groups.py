"""`musicrel prepare` on a folder that lists its files' compositions (manifest.csv: path, group, source), as
../shared/midi/multi does: split by group, never by file; each file's source from its row; weights per source
or for the whole folder; the instruments codec."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pretty_midi
import pytest

from musicrel.data.groups import read_groups
from musicrel.data.prepared import source_ranges
from musicrel.errors import ConfigError
from tests.conftest import SHARED_MIDI
from training.prepare import prepare

# source -> groups -> files per group
LAYOUT = {"quartets": {"q1": 3, "q2": 2, "q3": 1, "q4": 2}, "band": {"b1": 1, "b2": 2, "b3": 1}}


def _piece(path: Path, seed: int, drums: bool) -> None:
    """Random notes (no two pieces alike: no versions found), a second part, and drums when asked."""
    rng = np.random.default_rng(seed)
    pm = pretty_midi.PrettyMIDI()
    for program, is_drum in [(40, False), (42, False)] + ([(0, True)] if drums else []):
        inst = pretty_midi.Instrument(program=program, is_drum=is_drum)
        t = 0.0
        for _ in range(40):
            pitch = int(rng.integers(36, 50)) if is_drum else int(rng.integers(40, 90))
            inst.notes.append(pretty_midi.Note(80, pitch, t, t + 0.2))
            t += float(rng.choice([0.125, 0.25, 0.5]))
        pm.instruments.append(inst)
    pm.write(str(path))


def _write_manifest(folder: Path, rows: list[dict], fields=("path", "source", "group", "licence")) -> None:
    with open(folder / "manifest.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


@pytest.fixture()
def listed(tmp_path) -> Path:
    folder = tmp_path / "multi"
    rows, seed = [], 0
    for source, groups in LAYOUT.items():
        for group, n in groups.items():
            (folder / source / group).mkdir(parents=True)
            for k in range(n):
                path = f"{source}/{group}/movement{k}.mid"
                _piece(folder / path, seed, drums=source == "band")
                seed += 1
                rows.append({"path": path, "source": source, "group": f"{group} | a work", "licence": "CC0"})
    _write_manifest(folder, rows)
    return folder


def test_a_listed_folder_is_split_by_group_and_reports_its_sources(listed, tmp_path):
    m = prepare([listed], tmp_path / "data", workers=1, progress=False)
    files = [(s, f) for s, info in m["splits"].items() for f in info["files"]]
    assert len(files) == sum(sum(g.values()) for g in LAYOUT.values())
    split_of_group: dict[str, set] = {}
    for split, f in files:
        source, group = Path(f["path"]).relative_to(listed.resolve()).parts[:2]
        assert f["source"] == source and f["group"] == f"multi:{group} | a work"
        split_of_group.setdefault(f["group"], set()).add(split)
    assert all(len(s) == 1 for s in split_of_group.values())  # never by file
    for groups in LAYOUT.values():  # three groups or more: each source has one in val and in test
        mine = {next(iter(split_of_group[f"multi:{g} | a work"])) for g in groups}
        assert {"val", "test"} <= mine
    assert [s["name"] for s in m["sources"]] == ["band", "quartets"] and m["weights"] == {
        "band": 1.0,
        "quartets": 1.0,
    }
    for split in ("val", "test"):
        assert set(source_ranges(m, split)) == {"band", "quartets"}  # NLL per source


def test_weights_for_the_folder_and_for_its_sources(listed, tmp_path):
    m = prepare([f"multi={listed}"], tmp_path / "a", workers=1, progress=False, weights={"multi": 3})
    assert m["weights"] == {"band": 3.0, "quartets": 3.0}
    m = prepare(
        [f"multi={listed}"], tmp_path / "b", workers=1, progress=False, weights={"multi": 0.5, "band": 4}
    )
    assert m["weights"] == {"band": 4.0, "quartets": 0.5}
    with pytest.raises(ConfigError) as err:
        prepare([listed], tmp_path / "c", workers=1, progress=False, weights={"drums": 2})
    assert err.value.code == "bad_sources"


def test_a_training_run_replaces_the_prepared_weights_by_name(listed, tmp_path):
    from training.module import MusicDataModule

    data = tmp_path / "data"
    prepare([listed], data, workers=1, progress=False, weights={"band": 2})
    ranges = source_ranges(json.loads((data / "manifest.json").read_text()), "train")

    def weights(module):
        return {name: w for name, (_, _, w) in zip(ranges, module.source_parts("train"), strict=True)}

    assert weights(MusicDataModule(str(data), seq_len=32)) == {"band": 2.0, "quartets": 1.0}
    module = MusicDataModule(str(data), seq_len=32, source_weights={"quartets": 5})
    assert weights(module) == {"band": 2.0, "quartets": 5.0}
    for bad in ({"drums": 1}, {"band": -1}, {"band": 0, "quartets": 0}):
        with pytest.raises(ConfigError) as err:
            MusicDataModule(str(data), seq_len=32, source_weights=bad)
        assert err.value.code == "bad_sources"


def test_a_source_of_the_listed_folder_may_not_take_another_sources_name(listed, tmp_path, pattern_midi_dir):
    with pytest.raises(ConfigError, match="share a name") as err:
        prepare([f"band={pattern_midi_dir}", listed], tmp_path / "data", workers=1, progress=False)
    assert err.value.code == "bad_sources"


def test_unlisted_files_and_other_manifests(listed, tmp_path):
    _piece(listed / "extra.mid", 99, drums=False)  # not in the manifest: its own source, split by its hash
    m = prepare([listed], tmp_path / "a", workers=1, progress=False)
    extra = [f for info in m["splits"].values() for f in info["files"] if f["path"].endswith("extra.mid")]
    assert extra[0]["source"] == "multi" and "group" not in extra[0]
    assert [s["name"] for s in m["sources"]] == ["band", "multi", "quartets"]
    # a manifest.csv without a group column is not a list of compositions: the folder is one source
    with open(listed / "manifest.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    _write_manifest(listed, rows, fields=("path", "source"))
    assert read_groups(listed, "multi") is None
    m = prepare([listed], tmp_path / "b", workers=1, progress=False)
    assert [s["name"] for s in m["sources"]] == ["multi"]
    # a row without a group is an error in the list, said so
    _write_manifest(listed, [{"path": "band/b1/movement0.mid", "source": "band", "group": ""}])
    with pytest.raises(ConfigError) as err:
        prepare([listed], tmp_path / "c", workers=1, progress=False)
    assert err.value.code == "bad_group_manifest"


def test_prepare_cli_with_instruments(listed, tmp_path, capsys):
    from musicrel.cli import main
    from musicrel.midi.codec import CodecConfig, EventCodec

    out = tmp_path / "data"
    assert (
        main(["prepare", str(listed), "--instruments", "--out", str(out), "--workers", "1", "--quiet"]) == 0
    )
    assert "band" in capsys.readouterr().out
    m = json.loads((out / "manifest.json").read_text())
    codec = EventCodec(CodecConfig.from_dict(m["codec"]))
    assert m["codec"]["instruments"] is True and m["vocab_size"] == codec.vocab_size == 391 + 129
    stream = np.load(out / "train.npy")
    assert codec.is_instrument(stream).any() and (stream == codec.drums_id).any()  # the band's drums kept
    plain = prepare([listed], tmp_path / "plain", workers=1, progress=False)
    assert "instruments" not in plain["codec"] and plain["codec_hash"] != m["codec_hash"]


def test_the_shared_multi_corpus_by_group(tmp_path):
    multi = SHARED_MIDI / "multi"
    if not (multi / "manifest.csv").is_file():
        pytest.skip(f"the multi-instrument corpus is not at {multi} (set MUSICREL_SHARED)")
    # a few short files of every source, with their manifest rows: the corpus' own layout, made small
    with open(multi / "manifest.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    chosen, per_source = [], {}
    for row in sorted(rows, key=lambda r: float(r["seconds"])):
        groups = per_source.setdefault(row["source"], set())
        room = sum(r["source"] == row["source"] for r in chosen) < 4
        if room and (row["group"] in groups or len(groups) < 3):
            groups.add(row["group"])
            chosen.append(row)
    folder = tmp_path / "multi"
    for row in chosen:
        (folder / row["path"]).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(multi / row["path"], folder / row["path"])
    _write_manifest(folder, chosen, fields=list(rows[0]))
    from musicrel.midi.codec import CodecConfig, EventCodec

    m = prepare([folder], tmp_path / "data", codec=EventCodec(CodecConfig(instruments=True)), workers=1)
    got = {(f["source"], f["group"], s) for s, info in m["splits"].items() for f in info["files"]}
    assert {s for s, _, _ in got} == {r["source"] for r in chosen}
    by_group: dict[str, set] = {}
    for _, group, split in got:
        by_group.setdefault(group, set()).add(split)
    assert all(len(s) == 1 for s in by_group.values())
    assert "real" not in {Path(f["path"]).parts[-2] for info in m["splits"].values() for f in info["files"]}
