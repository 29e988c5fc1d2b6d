"""Held-out pieces, what every evaluation reads: which files (`held_out_files`), their sources and
compositions (`file_sources`, `piece_compositions`), and a piece cut at a motif (`load_pieces`: the motif, the
truth after it, the real music after that). `EvaluationError` is every evaluation's bad setting or input."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pretty_midi

from musicrel.data.compositions import group_versions, shingles
from musicrel.data.prepared import MANIFEST, is_prepared, load_manifest
from musicrel.errors import MusicrelError
from musicrel.evaluation.ensemble import Parts, parts_of, pitched
from musicrel.generation.keys import find_key
from musicrel.generation.primer import default_max_primer_tokens, primer_at_cut
from musicrel.midi.files import find_midi_files
from musicrel.midi.tracks import Tracks, new_track


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
    cut = min(n.start for n in notes) + motif_seconds
    return before(notes, cut), window(notes, cut, seconds), cut


def before(notes, cut: float) -> list:
    """The notes struck before `cut`, clipped at it (source time)."""
    return [pretty_midi.Note(n.velocity, n.pitch, n.start, min(n.end, cut)) for n in notes if n.start < cut]


@dataclass
class Piece:
    path: str
    motif: list  # notes before the cut, clipped at it (source time)
    reference: list  # the truth: notes of [cut, cut + seconds), from time 0
    # notes of [cut + seconds, cut + 2 seconds) from time 0 (real music); None when the piece ends sooner
    after: list | None
    primer: object  # musicrel.generation.primer.Primer ending at the cut
    key: tuple[int, str] | None  # the motif's key
    # With a codec that has instruments, every instrument's notes (evaluation.ensemble.Parts, drums too): the
    # motif's with times relative to the cut (negative), the truth's and the real music's from time 0 (None
    # as `after` is). The fields above then hold the pitched notes of every instrument merged. None: one
    # stream.
    motif_parts: dict | None = None
    reference_parts: dict | None = None
    after_parts: dict | None = None


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


def read_parts(codec, path, skipped: dict[str, int]) -> Parts | None:
    """A file's notes by instrument as a codec with instruments renders a model's (`read_notes`' rule), or
    None with the reason counted in `skipped`."""
    try:
        read = codec.instrument_notes(codec.read(path))
        heard = codec.decode_instrument_notes(codec.encode_notes(read.notes, read.instruments))
        return parts_of(heard.notes, heard.instruments)
    except (MusicrelError, OSError) as exc:
        code = getattr(exc, "code", "unreadable")
        skipped[code] = skipped.get(code, 0) + 1
        return None


def _cut_parts(parts: Parts, cut: float, seconds: float) -> tuple[Parts, Parts, Parts]:
    """(motif relative to the cut, truth, real music after it) of every instrument; empty ones left out."""
    motif = {i: shift(before(ns, cut), cut) for i, ns in parts.items()}
    reference = {i: window(ns, cut, seconds) for i, ns in parts.items()}
    after = {i: window(ns, cut + seconds, seconds) for i, ns in parts.items()}
    return tuple({i: ns for i, ns in p.items() if ns} for p in (motif, reference, after))


def shift(notes, seconds: float) -> list:
    """The notes moved `seconds` earlier (a motif in source time -> times relative to its cut)."""
    return [pretty_midi.Note(n.velocity, n.pitch, n.start - seconds, n.end - seconds) for n in notes]


def piece_primer(codec, notes, cut: float, motif_seconds: float, model):
    """The primer of a piece cut at `cut` (`primer_at_cut`). notes: a list, or with instruments `Parts`:
    then every instrument is in it, drums too, and each on a track of its own (`midi.tracks`), so the
    continuation comes back by instrument as a route writes it."""
    window = default_max_primer_tokens(model)
    if not isinstance(notes, dict):
        return primer_at_cut(codec, notes, cut, motif_seconds, max_tokens=window)
    every = [(n, i) for i, ns in notes.items() for n in ns]
    primer = primer_at_cut(
        codec, [n for n, _ in every], cut, motif_seconds, max_tokens=window, instruments=[i for _, i in every]
    )
    # the piece's every instrument is a track, as an upload read with motif_end has them: one silent in the
    # motif (a Lied's voice after the piano's introduction) may come in
    order = sorted(set(notes) | set(primer.motif_instruments))
    tracks = Tracks([new_track(i) for i in order])
    return replace(primer, tracks=tracks, motif_tracks=[(order.index(i),) for i in primer.motif_instruments])


def load_pieces(model, codec, files, motif_seconds: float, seconds: float, limit: int | None):
    """(pieces, skipped counts by code): the first `limit` files that sound through motif + reference. With a
    codec that has instruments every instrument is read (`Piece`'s parts), drums too."""
    pieces, skipped = [], {}
    instruments = codec.instrument_offset is not None
    for path in files:
        if limit is not None and len(pieces) >= limit:
            break
        if instruments:
            parts = read_parts(codec, path, skipped)
            if parts is None:
                continue
            every = [n for ns in parts.values() for n in ns]
        else:
            read = read_notes(codec, path, skipped)
            if read is None:
                continue
            every = read[1]
        cut = min(n.start for n in every) + motif_seconds
        end = max(n.end for n in every)
        # A piece that ends inside the reference window would be scored against a fragment (its density
        # against a whole continuation's, say): only pieces that sound to the window's end count.
        if not window(every, cut, seconds) or end < cut + seconds:
            skipped["too_short"] = skipped.get("too_short", 0) + 1
            continue
        notes = pitched(parts) if instruments else every
        motif, reference = before(notes, cut), window(notes, cut, seconds)
        long_enough = end >= cut + 2 * seconds
        after = window(notes, cut + seconds, seconds) if long_enough else None
        # Notes sounding at the cut stay open and the continuation starts at the cut, as the reference does.
        primer = piece_primer(codec, parts if instruments else every, cut, motif_seconds, model)
        piece = Piece(str(path), motif, reference, after, primer, find_key(motif))
        if instruments:
            piece.motif_parts, piece.reference_parts, after_parts = _cut_parts(parts, cut, seconds)
            piece.after_parts = after_parts if long_enough else None
        pieces.append(piece)
    return pieces, skipped
