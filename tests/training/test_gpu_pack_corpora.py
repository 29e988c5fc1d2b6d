"""`musicrel pack-gpu` on the shared corpora: an eighth of every corpus of the shipped model's recipe,
prepared and packed for real, and its size projected to the whole. A file of its own: its quarter minute goes
to one xdist worker while the other runs tests/training/test_gpu_pack.py's tiny runs.

Preparing and packing the corpora at full size took 130 CPU-s, an eighth of the suite; a quarter took 35,
the eighth 16. Its projection errs on the safe side (2026-11-27: 22.0 M training tokens and 16.1 MB of packed
data projected from the eighth, 20.2 M and 15.3 MB from a quarter, 20.4 M and 14.7 MB at full size: a
sample's token streams compress a little worse); `musicrel pack-gpu` itself refuses, writing nothing, a pack
over its limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.pack import PACK_LIMIT_BYTES, REPO, carried_bytes, pack_gpu

SAMPLE = 8  # one file in SAMPLE of each corpus, every SAMPLE-th in path order


def _sample(corpus: Path, out: Path) -> Path:
    """`out` mirroring `corpus` with links to one MIDI file in SAMPLE (prepare reads through the links: the
    sources' globs still match)."""
    files = sorted(p for p in corpus.rglob("*") if p.suffix.lower() in (".mid", ".midi") and p.is_file())
    for path in files[::SAMPLE]:
        link = out / path.relative_to(corpus)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(path)
    return out


@pytest.mark.long(15)
def test_the_shared_corpora_pack_under_the_limit(tmp_path):
    """At the corpora's real size, projected from an eighth of each (every shared corpus, as the shipped
    model's recipe prepares them): the data fits beside the checkout's files (the shipped checkpoints but the
    one a run starts from left out) with room for the wheels (1.6 MiB
    when last packed, pretty_midi's soundfont left out) and for music21's export, which this test does not run
    (1.1 M of the recipe's 21.5 M training tokens)."""
    from tests.conftest import SHARED_MIDI
    from training.prepare import prepare

    shared = SHARED_MIDI / "corpora"
    if not shared.is_dir():
        pytest.skip(f"the shared corpora are not at {shared} (set MUSICREL_SHARED to the shared/ folder)")
    c = tmp_path / "corpora"
    for name in ("pop909", "asap", "piano-midi.de", "giantmidi-eval"):
        _sample(shared / name, c / name)
    sources = [
        f"pop909={c / 'pop909'}",
        f"scores={c}/asap/**/midi_score.mid",
        f"performances={c / 'asap'}",
        f"piano-midi={c / 'piano-midi.de'}",
        f"giantmidi={c / 'giantmidi-eval'}",
    ]
    # no novelty index: a third of preparing the corpora, and the pack leaves it out
    m = prepare(sources, tmp_path / "data", progress=False, weights={"pop909": 2}, novelty=False)
    train_tokens = SAMPLE * m["splits"]["train"]["stream_tokens"]
    assert train_tokens > 20_000_000
    # The checkout as a piano run's device call carries it: the shipped checkpoints it does not read leave the
    # tree for the call (with five shipped, the checkout alone is 63.8 MiB: docs/TRAINING.md says how)
    others = [p for p in (REPO / "checkpoints").glob("*/*") if p.parent.name != "default" and p.is_file()]
    checkout = carried_bytes() - sum(p.stat().st_size for p in others)
    limit = PACK_LIMIT_BYTES - checkout
    info = pack_gpu(tmp_path / "data", tmp_path / "pack", wheels=False, limit_bytes=limit)
    sample = sum(n for f, n in info["files"].items() if f.startswith("data/"))
    assert sample < info["data"]["unpacked_bytes"] / 2.5  # xz shrinks the token streams about 3x
    data = SAMPLE * sample  # the manifest too: a line a piece
    music21 = data * 1.2e6 / train_tokens
    assert data + music21 + 2 * 2**20 <= info["limit_bytes"]  # 2 MiB left for the wheels
