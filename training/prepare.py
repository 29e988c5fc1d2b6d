"""`musicrel prepare`: MIDI files -> de-duplicated, split, memory-mappable token arrays (read back by
musicrel/data/prepared.py, the format's one reader).

Layout of OUT:
    manifest.json             codec settings + hash, counts, token totals, every skipped file with its code
    train.npy / val.npy / test.npy
                              uint16, one stream per split: [bos] piece [eos] [bos] piece [eos] ...
    train_offsets.npy ...     int64 [n_pieces + 1]: where each piece's bos starts (last = stream length)
    novelty.npz               the train split's novelty index (`evaluation.novelty`): which training piece a
                              generated note sequence copies the longest stretch of
    cache/<codec hash>/<sha256>.npy | .json
                              the encoded events (or the InvalidMidiError) of one file content, so that a
                              re-run (or a run with more sources) encodes nothing twice

Sources are `[NAME=]PATH`: a file, a folder (searched recursively) or a glob (`asap/**/midi_score.mid`); NAME
defaults to the folder's name. A file found by several sources belongs to the first. A folder with its own
`manifest.csv` (`path` and `group` columns, optionally `source`: `musicrel.data.groups`, e.g.
../shared/midi/multi) is split by its `group` column, never by file (each source's groups by the hash of
their name, at least one in val and in test where a source has three), and each listed file belongs to the
source its row names (so NLL is reported per source); a weight given to the folder's NAME applies to each of
those sources unless one is weighted by its own name. Each split's stream
holds its pieces source by source, and the manifest records where each source's pieces lie
(`splits.<split>.sources`) and its mixing `weights`: training draws a crop from a source with probability
proportional to weight x tokens, so weight 1 everywhere samples every token alike, and weight 0.5 halves how
often a source is seen.

Files are identified by the sha256 of their bytes: duplicates (same bytes under another name) are counted and
dropped. Versions of one composition (performances of a piece, its score, a copy in another collection) are
found from their notes (`musicrel.data.compositions`) and a whole group goes to one split, chosen by the hash
of its first member: a file with no other version keeps the split of its hash alone, as the corpus grows.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from musicrel.data.compositions import CONTAINMENT, MIN_SHINGLES, NGRAM, group_versions, shingles
from musicrel.data.groups import read_groups
from musicrel.data.prepared import FORMAT_VERSION, MANIFEST, SPLITS, check_weights
from musicrel.errors import ConfigError, InvalidMidiError
from musicrel.midi.files import find_midi_files

# Percent of the hash space per split (train, val, test).
SPLIT_PERCENT = (90, 5, 5)


_GLOB_CHARS = set("*?[")


def parse_source(spec: str) -> tuple[str, str]:
    """`[NAME=]PATH` -> (name, path); the name defaults to the path's last folder or file stem."""
    spec = str(spec)
    name, sep, path = spec.partition("=")
    if not sep or "/" in name or not name:
        name, path = "", spec
    if not name:
        plain = Path(path.split("*")[0].rstrip("/") or ".")
        name = plain.name if plain.is_dir() or not plain.suffix else plain.stem
    return name, path


def source_files(path: str) -> list[Path]:
    """A file, a folder's MIDI files (recursive) or a glob's matches; resolved and sorted."""
    if _GLOB_CHARS & set(path):
        return sorted({Path(p).resolve() for p in glob.glob(path, recursive=True) if Path(p).is_file()})
    return sorted({p.resolve() for p in find_midi_files(path)})


def codec_hash(codec) -> str:
    """Short hash of the codec settings: token caches are only reused by an identical codec."""
    text = json.dumps(codec.config.to_dict(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def split_of(sha: str, percent: tuple[int, int, int] = SPLIT_PERCENT) -> str:
    bucket = int(sha[:8], 16) % 100
    if bucket < percent[0]:
        return "train"
    return "val" if bucket < percent[0] + percent[1] else "test"


def assign_splits(hashes: list[str], percent: tuple[int, int, int] = SPLIT_PERCENT) -> dict[str, str]:
    """sha -> split, by hash; with >= 3 files, val and test each get at least one file (taken from train,
    the train files whose hash is highest), so small data sets can still be validated."""
    splits = {h: split_of(h, percent) for h in hashes}
    if len(hashes) >= 3:
        for need in ("val", "test"):
            if need not in splits.values():
                donors = sorted(h for h, s in splits.items() if s == "train")
                donor = donors[-1] if donors else None
                if donor is None:  # every file landed in the other held-out split
                    donor = sorted(h for h, s in splits.items())[-1]
                splits[donor] = need
        if "train" not in splits.values():
            splits[sorted(splits)[0]] = "train"
    return splits


# ---------------------------------------------------------------- worker side
_CODEC = None


def _init_worker(codec_config: dict) -> None:
    global _CODEC
    import warnings

    from musicrel.midi.codec import CodecConfig, EventCodec

    warnings.simplefilter("ignore")  # pretty_midi warns about odd meta events on every other file
    _CODEC = EventCodec(CodecConfig.from_dict(codec_config))


def _encode_one(job: tuple[str, str, str]) -> tuple[str, str, int, str | None, str | None]:
    """Encode one file into its cache entry. Returns (sha, status, n_tokens, code, message)."""
    path, sha, cache_dir = job
    try:
        data = Path(path).read_bytes()
        tokens = np.asarray(_CODEC.encode(data))
        if tokens.size == 0:
            raise InvalidMidiError("the file encodes to no events", code="no_notes")
    except InvalidMidiError as exc:
        _write_json(Path(cache_dir) / f"{sha}.json", {"code": exc.code, "message": str(exc)})
        return sha, "skipped", 0, exc.code, str(exc)
    except Exception as exc:  # a codec bug must not kill a 15k-file run; reported, not cached
        return sha, "skipped", 0, "internal_error", f"{type(exc).__name__}: {exc}"
    _save_npy(Path(cache_dir) / f"{sha}.npy", tokens.astype(np.uint16))
    return sha, "encoded", int(tokens.size), None, None


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def _save_npy(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npy")
    np.save(tmp, array)
    os.replace(tmp, path)


# ---------------------------------------------------------------- main
def prepare(
    sources,
    out_dir,
    codec=None,
    workers: int | None = None,
    progress: bool = True,
    split_percent: tuple[int, int, int] = SPLIT_PERCENT,
    weights: dict[str, float] | None = None,
    novelty: bool = True,
) -> dict:
    """Encode every MIDI file under `sources` (`[NAME=]PATH` each) into OUT (see the module docstring);
    returns the manifest. `split_percent` (train, val, test) is the share of the hash space per split; it sums
    to 100. `weights` maps source names to mixing weights (default 1). `novelty=False` writes no novelty
    index (a third of preparing a large corpus; only a served checkpoint's novelty answers read it)."""
    from musicrel.midi.codec import EventCodec

    codec = codec or EventCodec()
    split_percent = tuple(int(p) for p in split_percent)
    if len(split_percent) != 3 or sum(split_percent) != 100 or min(split_percent) < 0:
        raise ConfigError(f"split_percent must be three shares summing to 100, got {split_percent}")
    if codec.vocab_size > np.iinfo(np.uint16).max:
        raise ConfigError(f"vocab_size {codec.vocab_size} does not fit the uint16 token arrays")
    out_dir = Path(out_dir)
    chash = codec_hash(codec)
    cache_dir = out_dir / "cache" / chash
    cache_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    specs, path_of, weights, source_of, group_of = _sources(sources, weights)
    names = list(path_of)
    paths = sorted(source_of)
    first_path, duplicates = _hash_files(paths, progress)
    results = _encode_files(first_path, cache_dir, codec, workers, progress)

    usable = sorted(sha for sha, r in results.items() if r[0] in ("encoded", "cached"))
    skipped = [
        {"path": str(first_path[sha]), "sha256": sha, "code": r[2], "message": r[3]}
        for sha, r in sorted(results.items(), key=lambda kv: str(first_path[kv[0]]))
        if r[0] in ("skipped", "cached_skip")
    ]
    source = {sha: source_of[first_path[sha]] for sha in usable}
    order = {name: i for i, name in enumerate(names)}
    usable.sort(key=lambda sha: (order[source[sha]], sha))
    grouping = group_versions([shingles(codec, np.load(cache_dir / f"{sha}.npy")) for sha in usable])
    group = {sha: group_of.get(first_path[sha]) for sha in usable}
    splits = _assign(grouping, usable, group, source, split_percent)
    manifest = {
        "format_version": FORMAT_VERSION,
        "codec": codec.config.to_dict(),
        "codec_hash": chash,
        "vocab_size": codec.vocab_size,
        "pad_id": codec.pad_id,
        "bos_id": codec.bos_id,
        "eos_id": codec.eos_id,
        "sources": [{"name": name, "path": path_of[name], "weight": weights[name]} for name in names],
        "weights": {name: weights[name] for name in names},
        "split_percent": dict(zip(SPLITS, split_percent, strict=True)),
        "counts": {
            "found": len(paths),
            "duplicates": len(duplicates),
            "unique": len(first_path),
            "encoded": len(usable),
            "skipped": len(skipped),
            "newly_encoded": sum(r[0] in ("encoded", "skipped") for r in results.values()),
            "cached": sum(r[0] in ("cached", "cached_skip") for r in results.values()),
        },
        "skipped_by_code": {},
        "compositions": _composition_report(grouping, usable, first_path, splits),
        "splits": {},
        "skipped": skipped,
        "duplicates": duplicates,
    }
    for item in skipped:
        manifest["skipped_by_code"][item["code"]] = manifest["skipped_by_code"].get(item["code"], 0) + 1

    for split in SPLITS:
        members = [sha for sha in usable if splits[sha] == split]
        files = [
            {"path": str(first_path[sha]), "sha256": sha, "source": source[sha]}
            | ({"group": group[sha]} if group[sha] else {})
            for sha in members
        ]
        key = hashlib.sha256((chash + split + ",".join(members)).encode()).hexdigest()
        info = _write_split(out_dir, split, members, cache_dir, codec, key)
        for f, n in zip(files, info.pop("piece_tokens"), strict=True):
            f["tokens"] = n
        info["sources"] = _source_layout(files, names)
        manifest["splits"][split] = {**info, "files": files}
        if split == "train" and novelty:
            manifest["novelty"] = _write_novelty(
                out_dir, members, first_path, [p for _, p in specs], cache_dir, codec, key
            )
    manifest["seconds"] = round(time.perf_counter() - start, 2)
    _write_json(out_dir / MANIFEST, manifest)
    return manifest


def _encode_files(first_path: dict[str, Path], cache_dir: Path, codec, workers, progress: bool) -> dict:
    """{sha256: (status, tokens, error code, message)} of every file, encoded in `workers` processes into
    `cache_dir`, or read from it when a previous run encoded it (or found it unusable)."""
    from tqdm import tqdm

    results: dict[str, tuple[str, int, str | None, str | None]] = {}
    jobs = []
    for sha, path in first_path.items():
        if (cache_dir / f"{sha}.npy").is_file():
            results[sha] = ("cached", 0, None, None)
        elif (cache_dir / f"{sha}.json").is_file():
            err = json.loads((cache_dir / f"{sha}.json").read_text())
            results[sha] = ("cached_skip", 0, err["code"], err["message"])
        else:
            jobs.append((str(path), sha, str(cache_dir)))

    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs) or 1))
    bar = tqdm(
        total=len(jobs),
        desc="encoding",
        unit="file",
        disable=not progress or not jobs,
        mininterval=0.5 if sys.stderr.isatty() else 30,
    )
    try:
        if workers == 1:
            _init_worker(codec.config.to_dict())
            outcomes = map(_encode_one, jobs)
            executor = None
        else:
            executor = ProcessPoolExecutor(
                workers, initializer=_init_worker, initargs=(codec.config.to_dict(),)
            )
            outcomes = executor.map(_encode_one, jobs, chunksize=8)
        for sha, status, n, code, message in outcomes:
            results[sha] = (status, n, code, message)
            bar.update(1)
    finally:
        bar.close()
        if workers > 1 and executor is not None:
            executor.shutdown(cancel_futures=True)
    return results


def _sources(sources, weights: dict[str, float] | None):
    """(NAME, PATH) of each source as given; the sources files belong to, in order (a listed folder's
    sources in its place), each with the PATH that found it and its weight; each file's source (the first
    that finds it) and each listed file's group ("NAME:group")."""
    specs = [parse_source(src) for src in sources]
    given = [name for name, _ in specs]
    if len(set(given)) != len(given):
        raise ConfigError(f"two sources share a name: {given}; name them NAME=PATH", code="bad_sources")
    source_of: dict[Path, str] = {}
    group_of: dict[Path, str] = {}
    path_of: dict[str, str] = {}  # each source's PATH
    parent: dict[str, str] = {}  # a listed folder's source -> the folder's NAME (for its weight)
    for name, path in specs:
        listed = read_groups(path, name) if Path(path).is_dir() else None
        mine = []
        for f in source_files(path):
            if f in source_of:
                continue  # a file found by several sources belongs to the first
            entry = listed.get(f) if listed else None
            source_of[f] = entry.source if entry else name
            mine.append(source_of[f])
            if entry:
                group_of[f] = f"{name}:{entry.group}"
                parent[entry.source] = name
        for n in dict.fromkeys(mine if listed and mine else [name]):
            if n in path_of:
                raise ConfigError(
                    f"two sources share a name: {n!r} (a listed folder's sources are named by its manifest)",
                    code="bad_sources",
                )
            path_of[n] = path
    names = list(path_of)
    given_w = {k: float(v) for k, v in (weights or {}).items()}
    if unknown := sorted(set(given_w) - set(names) - set(given)):
        raise ConfigError(f"weights for unknown sources {unknown} (sources: {names})", code="bad_sources")
    weights = check_weights({n: given_w.get(n, given_w.get(parent.get(n, n), 1.0)) for n in names})
    return specs, path_of, weights, source_of, group_of


def _assign(grouping, usable: list[str], group: dict, source: dict, split_percent) -> dict[str, str]:
    """sha -> split. Listed files (a corpus manifest's `group`) by group: each source's groups by the hash of
    their name (`assign_splits`: val and test get one where a source has three). The others as versions of a
    composition: a group of versions goes where a listed member's group goes, else by the hash of its first
    member, so a file with no other version keeps the split of its hash alone."""
    by_source: dict[str, dict[str, str]] = {}
    for sha in usable:
        if group[sha]:
            key = hashlib.sha256(group[sha].encode()).hexdigest()
            by_source.setdefault(source[sha], {})[key] = group[sha]
    listed: dict[str, str] = {}
    for keyed in by_source.values():
        listed.update({keyed[k]: split for k, split in assign_splits(sorted(keyed), split_percent).items()})
    follow, key_of = {}, {}
    for g, members in grouping.members().items():
        labels = sorted({group[usable[i]] for i in members if group[usable[i]]})
        if labels:
            follow[g] = listed[labels[0]]
        else:
            key_of[g] = min(usable[i] for i in members)
    by_key = assign_splits(sorted(key_of.values()), split_percent)
    return {
        sha: listed[group[sha]] if group[sha] else follow[g] if g in follow else by_key[key_of[g]]
        for sha, g in zip(usable, grouping.group, strict=True)
    }


def _hash_files(paths: list[Path], progress: bool) -> tuple[dict[str, Path], list[dict]]:
    """({sha256: the first file with those bytes}, the other files with the same bytes)."""
    from tqdm import tqdm

    first_path: dict[str, Path] = {}
    duplicates = []
    for path in tqdm(paths, desc="hashing", unit="file", disable=not progress, leave=False):
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        if sha in first_path:
            duplicates.append({"path": str(path), "same_as": str(first_path[sha])})
        else:
            first_path[sha] = path
    return first_path, duplicates


def _source_layout(files: list[dict], names: list[str]) -> dict[str, dict]:
    """Where each source's pieces lie in a split's stream ([start, end) in tokens; they are contiguous)."""
    out, pos = {}, 0
    for name in names:
        mine = [f for f in files if f["source"] == name]
        size = sum(f["tokens"] + 2 for f in mine)
        tokens = size - 2 * len(mine)
        out[name] = {"pieces": len(mine), "event_tokens": tokens, "start": pos, "end": pos + size}
        pos += size
    return out


def _composition_report(grouping, usable: list[str], first_path: dict, splits: dict) -> dict:
    """The groups of versions found (those of more than one file), listed with their paths and split."""
    groups = [m for m in grouping.members().values() if len(m) > 1]
    groups.sort(key=lambda m: (-len(m), str(first_path[usable[m[0]]])))
    return {
        "method": "top-voice interval n-grams, MinHash LSH + exact containment (musicrel.data.compositions)",
        "settings": {"ngram": NGRAM, "containment": CONTAINMENT, "min_shingles": MIN_SHINGLES},
        "files": len(usable),
        "groups": len(grouping.members()),
        "multi_file_groups": len(groups),
        "files_in_multi_file_groups": sum(len(m) for m in groups),
        "largest_group": max((len(m) for m in groups), default=1),
        "near_duplicate_pairs": len(grouping.pairs),
        "multi_file": [
            {"split": splits[usable[m[0]]], "files": [str(first_path[usable[i]]) for i in m]} for m in groups
        ],
    }


def _write_split(out_dir: Path, split: str, members: list[str], cache_dir: Path, codec, key: str) -> dict:
    """Concatenate the split's pieces as [bos] piece [eos]...; skipped when the same content is already there
    (same codec, same files), so an idempotent re-run rewrites nothing."""
    stream_path, offsets_path = out_dir / f"{split}.npy", out_dir / f"{split}_offsets.npy"
    key_path = out_dir / f".{split}.key"
    pieces = [np.load(cache_dir / f"{sha}.npy", mmap_mode="r") for sha in members]
    lengths = [int(p.size) for p in pieces]
    fresh = not (
        stream_path.is_file()
        and offsets_path.is_file()
        and key_path.is_file()
        and key_path.read_text() == key
    )
    if fresh:
        offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([n + 2 for n in lengths])
        stream = np.empty(int(offsets[-1]), dtype=np.uint16)
        for p, a, b in zip(pieces, offsets[:-1], offsets[1:], strict=True):
            stream[a] = codec.bos_id
            stream[a + 1 : b - 1] = p
            stream[b - 1] = codec.eos_id
        _save_npy(stream_path, stream)
        _save_npy(offsets_path, offsets)
        key_path.write_text(key)
    return {
        "pieces": len(pieces),
        "event_tokens": int(sum(lengths)),
        "stream_tokens": int(sum(lengths) + 2 * len(lengths)),
        "written": fresh,
        "piece_tokens": lengths,
    }


def _source_name(path: Path, sources) -> str:
    """The path from its source folder's parent (e.g. `music21/bach/bwv1.mid`): names the corpus without
    the building machine's absolute paths, which would be shipped with the index."""
    for src in sources:
        src = Path(src).resolve()
        if src.is_dir() and path.is_relative_to(src):
            return path.relative_to(src.parent).as_posix()
    return path.name


def _notes(codec, path: Path) -> list:
    return codec.decode_notes(np.load(path))


def _write_novelty(out_dir: Path, members, first_path, sources, cache_dir: Path, codec, key: str) -> dict:
    """Build the train split's novelty index from the cached tokens (decoded as the model's outputs are, so
    both sides are on the codec's grid); skipped when the index on disk was built from the same split."""
    from musicrel.evaluation.novelty import FORMAT_VERSION as NOVELTY_VERSION
    from musicrel.evaluation.novelty import INDEX_FILE, NoveltyIndex, read_header

    path = out_dir / INDEX_FILE
    header = read_header(path) or {}
    fresh = header.get("format_version") != NOVELTY_VERSION or header.get("meta", {}).get("split_key") != key
    start = time.perf_counter()
    if fresh:
        pieces = (
            (_source_name(first_path[sha], sources), _notes(codec, cache_dir / f"{sha}.npy"), sha)
            for sha in members
        )
        index = NoveltyIndex.build(pieces, meta={"split": "train", "split_key": key})
        index.save(path)
        notes, pieces_n = index.notes, index.pieces
    else:
        notes, pieces_n = header["notes"], len(header["names"])
    return {
        "file": INDEX_FILE,
        "pieces": pieces_n,
        "notes": notes,
        "bytes": path.stat().st_size,
        "written": fresh,
        "seconds": round(time.perf_counter() - start, 2),
    }
