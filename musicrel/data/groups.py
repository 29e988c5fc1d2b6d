"""A corpus folder's own list of its files and their compositions: `manifest.csv` with at least the columns
`path` (from the folder) and `group` (the composition: a work's movements, a song cycle, one drummer's
session), and optionally `source` (the collection a file comes from). `musicrel prepare` splits such a folder
by group, never by file, and records each file's source, so that NLL is reported per source."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from musicrel.errors import ConfigError

GROUP_MANIFEST = "manifest.csv"
REQUIRED = ("path", "group")


@dataclass(frozen=True)
class Listed:
    """What a corpus manifest says about one file."""

    source: str  # the `source` column, else the name the folder was given
    group: str  # the composition, unique within the folder


def read_groups(folder, default_source: str) -> dict[Path, Listed] | None:
    """{resolved file path: Listed} from `folder`/manifest.csv; None when the folder has none, or one without
    the `path` and `group` columns (a manifest of something else). ConfigError (code bad_group_manifest) for a
    row without a path or group, or a path listed twice."""
    path = Path(folder) / GROUP_MANIFEST
    if not Path(folder).is_dir() or not path.is_file():
        return None
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if not set(REQUIRED) <= set(reader.fieldnames or ()):
            return None
        rows = list(reader)
    out: dict[Path, Listed] = {}
    root = Path(folder).resolve()
    for line, row in enumerate(rows, start=2):
        file, group = (row.get("path") or "").strip(), (row.get("group") or "").strip()
        if not file or not group:
            raise ConfigError(f"{path}:{line}: a row without a path or a group", code="bad_group_manifest")
        resolved = (root / file).resolve()
        if resolved in out:
            raise ConfigError(f"{path}:{line}: {file} is listed twice", code="bad_group_manifest")
        source = (row.get("source") or "").strip() or default_source
        out[resolved] = Listed(source, group)
    return out
