"""The prepared-folder reader: what counts as a prepared folder and a split, the streams memory-mapped, the
sources' ranges, and the typed error for a folder that is not one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from musicrel.data.prepared import (
    MANIFEST,
    has_split,
    is_prepared,
    load_manifest,
    load_split,
    source_ranges,
)
from musicrel.errors import ConfigError


@pytest.fixture
def folder(tmp_path):
    sources = {
        "piano": {"start": 0, "end": 4}, "pop": {"start": 4, "end": 7}, "empty": {"start": 7, "end": 7}
    }  # fmt: skip
    manifest = {"format_version": 2, "splits": {"train": {"sources": sources}, "val": {}}}
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    np.save(tmp_path / "train.npy", np.arange(7, dtype=np.uint16))
    np.save(tmp_path / "train_offsets.npy", np.array([0, 4, 7], dtype=np.int64))
    return tmp_path


def test_a_prepared_folder_and_its_splits(folder, tmp_path_factory):
    assert is_prepared(folder) and has_split(folder, "train")
    assert not has_split(folder, "val")  # in the manifest, but no stream was written
    assert not has_split(folder, "nope") and not is_prepared(tmp_path_factory.mktemp("plain"))
    stream, offsets = load_split(folder, "train")
    assert isinstance(stream, np.memmap) and stream.tolist() == list(range(7))
    assert offsets.tolist() == [0, 4, 7]
    assert source_ranges(load_manifest(folder), "train") == {"piano": (0, 4), "pop": (4, 7)}  # empty left out


def test_a_folder_that_is_not_prepared_says_so(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_split(tmp_path, "train")
    assert err.value.code == "not_prepared"
    with pytest.raises(ConfigError, match="split must be one of"):
        load_split(tmp_path, "everything")
