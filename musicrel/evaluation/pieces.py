"""Held-out pieces, what every evaluation reads: which files (`held_out_files`), their sources and
compositions (`file_sources`, `piece_compositions`), and a piece cut at a motif (`load_pieces`: the motif, the
truth after it, the real music after that). `EvaluationError` is every evaluation's bad setting or input."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pretty_midi

from musicrel.data.compositions import group_versions, shingles
from musicrel.data.prepared import MANIFEST, is_prepared, load_manifest
from musicrel.errors import MusicrelError
from musicrel.generation.keys import find_key
from musicrel.generation.primer import default_max_primer_tokens, primer_at_cut
from musicrel.midi.files import find_midi_files


class EvaluationError(MusicrelError, ValueError):
    """Evaluation settings or inputs that cannot be used (no pieces, unknown system, bad numbers)."""

    code = "invalid_evaluation"


def window(notes, start: float, seconds: float) -> list:
    """The notes that start in [start, start + seconds), moved to time 0 and clipped to the window."""
    return [
        pretty_midi.Note(n.velocity, n.pitch, n.start - start, min(n.end - start, seconds))
        for n in notes
        if start <= n.start < start + seconds
    ]


def split_piece(notes, motif_seconds: float, seconds: float):
    """(motif notes in source time, clipped at the cut; reference notes from time 0; cut time)."""
    t0 = min(n.start for n in notes)
    cut = t0 + motif_seconds
    motif = [pretty_midi.Note(n.velocity, n.pitch, n.start, min(n.end, cut)) for n in notes if n.start < cut]
    return motif, window(notes, cut, seconds), cut


@dataclass
class Piece:
    path: str
    motif: list  # notes before the cut, clipped at it (source time)
    reference: list  # the truth: notes of [cut, cut + seconds), from time 0
    # notes of [cut + seconds, cut + 2 seconds) from time 0 (real music); None when the piece ends sooner
    after: list | None
    primer: object  # musicrel.generation.primer.Primer ending at the cut
    key: tuple[int, str] | None  # the motif's key


def held_out_files(folder: Path, split: str = "test", source: str | None = None) -> list[Path]:
    """The `split` files (a comma list: `test,val`) of a prepared data folder (its manifest.json), those of
    one `source` of a multi-source folder if given; else every MIDI file under folder."""
    manifest = folder / MANIFEST
    if not is_prepared(folder):
        if source is not None:
            raise EvaluationError(f"a source needs a prepared data folder: {folder}", code="no_input")
        return find_midi_files(folder)
    splits = load_manifest(folder).get("splits", {})
    files = []
    for name in split.split(","):
        if name not in splits:
            raise EvaluationError(f"{manifest} has no split {name!r} (has {sorted(splits)})", code="no_input")
        files += splits[name].get("files", [])
    if source is not None:
        known = sorted({f.get("source") for info in splits.values() for f in info.get("files", [])} - {None})
        if source not in known:
            raise EvaluationError(f"{manifest} has no source {source!r} (has {known})", code="no_input")
        files = [f for f in files if f.get("source") == source]
    return [Path(f["path"]) for f in files]


def file_sources(folder: Path) -> tuple[dict[str, str], dict[str, str]]:
    """({file: source}, {file: its composition}) of a prepared folder's manifest; ({}, {}) for a plain folder.
    A composition is named by the first file of its versions (`musicrel.data.compositions`: ASAP has up to 29
    performances of one piece); files with no other version are not listed."""
    if not is_prepared(folder):
        return {}, {}
    info = load_manifest(folder)
    files = [f for split in info.get("splits", {}).values() for f in split.get("files", [])]
    groups = info.get("compositions", {}).get("multi_file", [])
    return (
        {f["path"]: f["source"] for f in files if f.get("source")},
        {path: group["files"][0] for group in groups for path in group["files"]},
    )


def piece_compositions(codec, folder: Path, paths: Sequence[str]) -> tuple[list[str], dict]:
    """Per piece (its path), the composition it is a version of, named by the path of its first version, and
    how they were found: {method, files, compositions, multi_file: [[the paths of one composition], ...]}.

    A prepared folder: the groups of its manifest (`musicrel prepare` found them over the whole corpus). A
    plain folder of MIDI: found here, among these pieces, from their notes as prepare finds them
    (`musicrel.data.compositions`; CompositionsUnavailable without datasketch). Folded by file instead, one
    performance of a piece on the training side taught the classifier the others: on ASAP's Haydn folder (54
    files, 10 pieces, all 10 found) real music read 86 % by file, 56 % by composition."""
    paths = [str(p) for p in paths]
    if is_prepared(folder):
        known = file_sources(folder)[1]
        comps, method = [known.get(p, p) for p in paths], "manifest"
    else:
        sets = []
        for path in paths:
            try:
                sets.append(shingles(codec, codec.encode(path)))
            except (MusicrelError, OSError):  # read before as a piece; an error here: it stays alone
                sets.append(set())
        comps, method = [paths[g] for g in group_versions(sets).group], "notes"
    members: dict[str, list[str]] = {}
    for path, comp in zip(paths, comps, strict=True):
        members.setdefault(comp, []).append(path)
    return comps, {
        "method": method,
        "files": len(paths),
        "compositions": len(members),
        "multi_file": [m for m in members.values() if len(m) > 1],
    }


def read_notes(codec, path, skipped: dict[str, int]):
    """(the PrettyMIDI, its notes as the codec renders the model's) of a file, or None with the reason counted
    in `skipped` by error code: the truth is scored as a generated piece is heard."""
    try:
        pm = codec.read(path)
        return pm, codec.heard(codec.to_notes(pm))
    except (MusicrelError, OSError) as exc:
        code = getattr(exc, "code", "unreadable")
        skipped[code] = skipped.get(code, 0) + 1
        return None


def load_pieces(model, codec, files, motif_seconds: float, seconds: float, limit: int | None):
    """(pieces, skipped counts by code): the first `limit` files that sound through motif + reference."""
    pieces, skipped = [], {}
    for path in files:
        if limit is not None and len(pieces) >= limit:
            break
        read = read_notes(codec, path, skipped)
        if read is None:
            continue
        notes = read[1]
        motif, reference, cut = split_piece(notes, motif_seconds, seconds)
        end = max(n.end for n in notes)
        # A piece that ends inside the reference window would be scored against a fragment (its density
        # against a whole continuation's, say): only pieces that sound to the window's end count.
        if not reference or end < cut + seconds:
            skipped["too_short"] = skipped.get("too_short", 0) + 1
            continue
        after = window(notes, cut + seconds, seconds) if end >= cut + 2 * seconds else None
        # Notes sounding at the cut stay open and the continuation starts at the cut, as the reference does.
        primer = primer_at_cut(codec, notes, cut, motif_seconds, max_tokens=default_max_primer_tokens(model))
        pieces.append(Piece(str(path), motif, reference, after, primer, find_key(motif)))
    return pieces, skipped
