"""How musical are the continuations? Compare them with the true continuation of held-out pieces.

For each piece the first `motif_seconds` are the motif and the next `seconds` the reference. Every system
continues the motif and is scored against the reference with simple, robust statistics of the notes:

- pitch-class histogram overlap (sum of bin-wise minima of two normalised 12-bin histograms; 1 = same),
- inter-onset-interval histogram overlap (same, over log-spaced IOI bins; 1 = same rhythmic profile),
- pitch range difference in semitones, and note density (notes per second) as a ratio to the reference,
- the share of outputs whose token stream breaks the grammar (a note-off of a pitch not sounding, counting
  the notes the primer leaves open as sounding; special tokens).

Baselines scored in the same run: the motif repeated, an untrained model (same config, fixed-seed random
init) and the trained model sampled without the grammar mask (what the mask prevents).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pretty_midi

# IOI bin edges in seconds: 10 ms grid up to 2 s, log-spaced (what separates a trill from a half note).
IOI_EDGES = np.array([0.0, 0.04, 0.08, 0.12, 0.17, 0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, np.inf])
METRICS = ("pc_overlap", "ioi_overlap", "range_diff", "density", "density_ratio", "grammar_error")


def pitch_class_histogram(notes) -> np.ndarray:
    """(12,) share of notes per pitch class (all zeros for no notes)."""
    counts = np.bincount([n.pitch % 12 for n in notes], minlength=12).astype(np.float64)
    return counts / counts.sum() if counts.sum() else counts


def inter_onset_intervals(notes) -> np.ndarray:
    """Gaps between successive distinct onsets (chord notes share an onset), in seconds."""
    onsets = np.unique(np.round([n.start for n in notes], 2))
    return np.diff(onsets)


def ioi_histogram(notes) -> np.ndarray:
    counts = np.histogram(inter_onset_intervals(notes), bins=IOI_EDGES)[0].astype(np.float64)
    return counts / counts.sum() if counts.sum() else counts


def histogram_overlap(p: np.ndarray, q: np.ndarray) -> float:
    """Sum of bin-wise minima of two normalised histograms: 1 when equal, 0 when disjoint. Two empty
    histograms are equal (1); one empty one is not (0)."""
    if not p.sum() and not q.sum():
        return 1.0
    return float(np.minimum(p, q).sum())


def pitch_range(notes) -> int:
    pitches = [n.pitch for n in notes]
    return max(pitches) - min(pitches) if pitches else 0


def note_density(notes, seconds: float) -> float:
    return len(notes) / seconds if seconds > 0 else 0.0


def grammar_errors(codec, tokens, sounding: np.ndarray | None = None) -> dict[str, int]:
    """Counts of grammar violations in a generated token stream: note-offs of pitches not sounding, special
    tokens, ids outside the vocabulary. `sounding` (128,) bool: the notes open when the stream starts (those
    the primer leaves sounding at its cut; default none). A note-on of a sounding pitch is a legal re-strike
    (the codec closes and restarts the note), not an error."""
    sounding = np.zeros(128, dtype=bool) if sounding is None else np.array(sounding, dtype=bool)
    errors = {"orphan_note_off": 0, "special_token": 0, "out_of_vocab": 0}
    specials = {codec.pad_id, codec.bos_id, codec.eos_id}
    for t in np.asarray(tokens, dtype=np.int64).tolist():
        if not 0 <= t < codec.vocab_size:
            errors["out_of_vocab"] += 1
        elif t in specials:
            errors["special_token"] += 1
        elif codec.note_on_offset <= t < codec.note_on_offset + 128:
            sounding[t - codec.note_on_offset] = True
        elif codec.note_off_offset <= t < codec.note_off_offset + 128:
            p = t - codec.note_off_offset
            errors["orphan_note_off"] += int(not sounding[p])
            sounding[p] = False
    return errors


def compare(generated, reference, seconds: float) -> dict[str, float]:
    """Scores of one generated note list against the reference continuation (both from time 0)."""
    ref_density = note_density(reference, seconds)
    density = note_density(generated, seconds)
    return {
        "pc_overlap": histogram_overlap(pitch_class_histogram(generated), pitch_class_histogram(reference)),
        "ioi_overlap": histogram_overlap(ioi_histogram(generated), ioi_histogram(reference)),
        "range_diff": float(abs(pitch_range(generated) - pitch_range(reference))),
        "density": density,
        "density_ratio": density / ref_density if ref_density else math.nan,
    }


def split_piece(notes, motif_seconds: float, seconds: float):
    """(motif notes in source time, clipped at the cut; reference notes from time 0; cut time)."""
    t0 = min(n.start for n in notes)
    cut = t0 + motif_seconds
    motif = [pretty_midi.Note(n.velocity, n.pitch, n.start, min(n.end, cut)) for n in notes if n.start < cut]
    reference = [
        pretty_midi.Note(n.velocity, n.pitch, n.start - cut, min(n.end - cut, seconds))
        for n in notes
        if cut <= n.start < cut + seconds
    ]
    return motif, reference, cut


def repeat_motif(motif, seconds: float) -> list:
    """The baseline that plays the motif again and again from time 0 for `seconds`."""
    t0 = min(n.start for n in motif)
    period = max(max(n.end for n in motif) - t0, 0.01)
    out, k = [], 0
    while k * period < seconds:
        for n in motif:
            start = n.start - t0 + k * period
            if start < seconds:
                out.append(
                    pretty_midi.Note(n.velocity, n.pitch, start, min(n.end - t0 + k * period, seconds))
                )
        k += 1
    return out


def _sample_unmasked(
    model, codec, primers: Sequence[np.ndarray], seconds: float, seed: int
) -> list[np.ndarray]:
    """The trained model sampled with the same settings but no grammar mask (a row stops at `seconds`)."""
    import torch

    from musicrel.generate import TOKENS_PER_SECOND_CAP, generate, row_seed, shift_steps

    steps = torch.as_tensor(shift_steps(codec))
    limit = math.ceil(seconds * 1000.0 / codec.config.step_ms - 1e-9)
    P = max(len(p) for p in primers)
    prompt = torch.full((len(primers), P), codec.pad_id, dtype=torch.long)
    for r, p in enumerate(primers):
        prompt[r, P - len(p) :] = torch.as_tensor(p)
    left_pad = torch.tensor([P - len(p) for p in primers])
    max_new = int(seconds * TOKENS_PER_SECOND_CAP) + 64
    out = torch.empty(len(primers), max_new, dtype=torch.long)
    elapsed = torch.zeros(len(primers), dtype=torch.long)
    n_new = torch.zeros(len(primers), dtype=torch.long)
    device = next(model.parameters()).device
    gens = [torch.Generator().manual_seed(row_seed(seed + r, 0)) for r in range(len(primers))]
    it = generate(
        model, prompt.to(device), max_new, left_pad=left_pad.to(device), top_p=0.95, generators=gens
    )
    for i, token in enumerate(it):
        token = token.cpu()
        active = elapsed < limit
        out[:, i] = token
        n_new += active.long()
        elapsed += torch.where(active, steps[token], 0)
        if bool((elapsed >= limit).all()):
            break
    it.close()
    return [out[r, : int(n_new[r])].numpy() for r in range(len(primers))]


def held_out_files(folder: Path, split: str = "test") -> list[Path]:
    """The `split` files of a prepared data folder (its manifest.json), else every MIDI file under folder."""
    import json

    from musicrel.errors import GenerationError
    from musicrel.files import find_midi_files

    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return find_midi_files(folder)
    splits = json.loads(manifest.read_text()).get("splits", {})
    if split not in splits:
        raise GenerationError(f"{manifest} has no split {split!r} (has {sorted(splits)})", code="no_input")
    return [Path(f["path"]) for f in splits[split].get("files", [])]


def evaluate_continuations(
    checkpoint,
    input_dir,
    motif_seconds: float = 10.0,
    seconds: float = 10.0,
    limit: int | None = None,
    seed: int = 0,
    batch_size: int = 8,
    progress: bool = False,
    split: str = "test",
) -> dict:
    """Score the checkpoint's continuations of held-out pieces against the truth and the baselines.

    input_dir: a folder of MIDI files, or a prepared data folder (manifest.json of `musicrel prepare`),
    whose `split` files are used: pieces the model never trained on."""
    import torch
    from tqdm import tqdm

    from musicrel.checkpoint import load_codec, load_model
    from musicrel.errors import GenerationError, MusicrelError
    from musicrel.generate import (
        Primer,
        SamplingParams,
        default_max_primer_tokens,
        generate_batch,
        open_pitches,
        primer_at_cut,
        render,
    )
    from musicrel.model import MusicTransformer

    if not (motif_seconds > 0 and seconds > 0):
        raise GenerationError("motif_seconds and seconds must be > 0", code="invalid_params")
    model = load_model(checkpoint)
    codec = load_codec(checkpoint)
    torch.manual_seed(seed)
    untrained = MusicTransformer(model.cfg).eval()

    pieces, skipped = [], {}
    for path in held_out_files(Path(input_dir), split):
        if limit is not None and len(pieces) >= limit:
            break
        try:
            notes = codec.to_notes(codec.read(path))
        except (MusicrelError, OSError) as exc:
            code = getattr(exc, "code", "unreadable")
            skipped[code] = skipped.get(code, 0) + 1
            continue
        motif, reference, cut = split_piece(notes, motif_seconds, seconds)
        if not reference:
            skipped["too_short"] = skipped.get("too_short", 0) + 1
            continue
        # Notes sounding at the cut stay open and the continuation starts at the cut, as the reference does.
        primer = primer_at_cut(codec, notes, cut, motif_seconds, max_tokens=default_max_primer_tokens(model))
        pieces.append({"path": str(path), "motif": motif, "reference": reference, "primer": primer})
    if not pieces:
        raise GenerationError(f"no usable pieces in {input_dir} (skipped: {skipped})", code="no_input")

    systems = ["model", "model, no grammar mask", "untrained model", "repeat motif"]
    scores: dict[str, list[dict]] = {s: [] for s in systems}
    timings = {s: 0.0 for s in systems}
    bar = tqdm(total=len(pieces) * 3, disable=not progress, unit="piece")
    for b in range(0, len(pieces), batch_size):
        chunk = pieces[b : b + batch_size]
        jobs = [
            (p["primer"], SamplingParams(seconds=seconds, seed=seed + b + i)) for i, p in enumerate(chunk)
        ]
        for name, m in (("model", model), ("untrained model", untrained)):
            t = time.perf_counter()
            results = generate_batch(m, codec, jobs)
            timings[name] += time.perf_counter() - t
            for p, res in zip(chunk, results, strict=True):
                notes = res.midis[0].instruments[0].notes
                errs = grammar_errors(codec, res.tokens[0], open_pitches(codec, p["primer"].tokens))
                scores[name].append(
                    {**compare(notes, p["reference"], seconds), "grammar_error": any(errs.values())}
                )
            bar.update(len(chunk))
        t = time.perf_counter()
        streams = _sample_unmasked(model, codec, [p["primer"].tokens for p in chunk], seconds, seed + b)
        timings["model, no grammar mask"] += time.perf_counter() - t
        for p, tokens in zip(chunk, streams, strict=True):
            primer: Primer = p["primer"]
            notes = render(codec, primer, tokens).instruments[0].notes
            errs = grammar_errors(codec, tokens, open_pitches(codec, primer.tokens))
            scores["model, no grammar mask"].append(
                {**compare(notes, p["reference"], seconds), "grammar_error": any(errs.values())}
            )
        for p in chunk:
            notes = repeat_motif(p["motif"], seconds)
            scores["repeat motif"].append({**compare(notes, p["reference"], seconds), "grammar_error": False})
        bar.update(len(chunk))
    bar.close()

    reference_density = float(np.mean([note_density(p["reference"], seconds) for p in pieces]))
    rows = {}
    for name in systems:
        rows[name] = {k: float(np.nanmean([s[k] for s in scores[name]])) for k in METRICS}
        rows[name]["seconds"] = round(timings[name], 3)
    return {
        "checkpoint": str(checkpoint),
        "input": str(input_dir),
        "split": split if (Path(input_dir) / "manifest.json").is_file() else None,
        "pieces": len(pieces),
        "skipped": skipped,
        "motif_seconds": motif_seconds,
        "seconds": seconds,
        "seed": seed,
        "reference_density": reference_density,
        "systems": rows,
    }


def format_table(report: dict) -> str:
    head = (
        f"{report['pieces']} pieces, motif {report['motif_seconds']:g} s -> "
        f"continuation {report['seconds']:g} s "
        f"(true density {report['reference_density']:.2f} notes/s)"
    )
    if report["skipped"]:
        head += f"; skipped {report['skipped']}"
    cols = (
        "system",
        "PC overlap ^",
        "IOI overlap ^",
        "range diff v",
        "notes/s",
        "density ratio",
        "grammar err v",
    )
    lines = [head, " | ".join(f"{c:>13}" if i else f"{c:<24}" for i, c in enumerate(cols))]
    lines.append("-" * len(lines[-1]))
    for name, r in report["systems"].items():
        cells = [
            f"{r['pc_overlap']:.3f}",
            f"{r['ioi_overlap']:.3f}",
            f"{r['range_diff']:.1f}",
            f"{r['density']:.2f}",
            f"{r['density_ratio']:.2f}",
            f"{100 * r['grammar_error']:.0f}%",
        ]
        lines.append(" | ".join([f"{name:<24}"] + [f"{c:>13}" for c in cells]))
    return "\n".join(lines)
