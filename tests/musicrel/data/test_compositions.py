"""Versions of one composition found from the notes (musicrel.data.compositions)."""

from __future__ import annotations

import numpy as np
import pretty_midi

from musicrel.data.compositions import containment, group_versions, shingles
from musicrel.midi.codec import EventCodec

CODEC = EventCodec()


def melody(seed: int, n: int = 120) -> list[int]:
    """A random walk of pitches: two seeds give two unrelated tunes."""
    rng = np.random.default_rng(seed)
    steps = rng.choice([-5, -3, -2, -1, 1, 2, 3, 4, 7], size=n)
    return list(60 + np.cumsum(steps) % 24)


def tokens(pitches, transpose=0, jitter=0.0, chords=False, seed=0) -> np.ndarray:
    """Encoded notes, optionally transposed, with onset jitter (a performance), a chord under each note."""
    rng = np.random.default_rng(seed)
    pm = pretty_midi.PrettyMIDI()
    inst = pretty_midi.Instrument(0)
    for i, p in enumerate(pitches):
        t = i * 0.3 + (rng.uniform(-jitter, jitter) if jitter else 0.0)
        t = max(t, 0.0)
        inst.notes.append(pretty_midi.Note(80, int(p) + transpose, t, t + 0.25))
        if chords:  # inner voices a few ms apart, below the melody: the top voice stays the tune
            for k, below in enumerate((12, 17)):
                inst.notes.append(pretty_midi.Note(60, int(p) + transpose - below, t + 0.01 * k, t + 0.25))
    pm.instruments.append(inst)
    return np.asarray(CODEC.encode(pm))


def test_a_performance_of_a_tune_shares_its_shingles_and_a_transposed_copy_all_of_them():
    tune = melody(1)
    score = shingles(CODEC, tokens(tune))
    assert len(score) > 50
    assert containment(score, shingles(CODEC, tokens(tune, transpose=5))) == 1.0
    performed = shingles(CODEC, tokens(tune, jitter=0.02, chords=True, seed=3))
    assert containment(score, performed) > 0.9
    assert containment(score, shingles(CODEC, tokens(melody(2)))) < 0.1


def test_versions_group_together_and_unrelated_tunes_stay_apart():
    tune, other = melody(1), melody(2)
    sets = [
        shingles(CODEC, tokens(tune)),
        shingles(CODEC, tokens(other)),
        shingles(CODEC, tokens(tune, transpose=-3, jitter=0.02, chords=True, seed=1)),
        shingles(CODEC, tokens(tune[:60])),  # an excerpt of the tune
        shingles(CODEC, tokens(melody(3))),
    ]
    g = group_versions(sets)
    assert g.group[0] == g.group[2] == g.group[3]
    assert len({g.group[0], g.group[1], g.group[4]}) == 3
    assert {(i, j) for i, j, _ in g.pairs} >= {(0, 2), (0, 3)}


def test_a_figure_shared_by_many_files_does_not_chain_them_into_one_group():
    scale = [60, 62, 64, 65, 67, 69, 71, 72] * 6  # the same run in every file
    sets = [shingles(CODEC, tokens(scale + melody(seed, 60))) for seed in range(12)]
    assert len(set(group_versions(sets, max_files=5).group)) == 12
    # without the rule the shared run alone makes them "versions" of each other
    assert len(set(group_versions(sets, max_files=100, threshold=0.1).group)) < 12


def test_files_with_too_few_shingles_are_left_alone():
    short = shingles(CODEC, tokens(melody(1, n=12)))
    assert 0 < len(short) < 24
    g = group_versions([short, set(short)])
    assert g.group == [0, 1] and g.pairs == []


def test_without_datasketch_grouping_fails_with_a_typed_error(monkeypatch):
    import builtins

    import pytest

    from musicrel.data.compositions import CompositionsUnavailable
    from musicrel.errors import MusicrelError

    real_import = builtins.__import__

    def no_datasketch(name, *args, **kw):
        if name == "datasketch" or name.startswith("datasketch."):
            raise ImportError("No module named 'datasketch'")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_datasketch)
    with pytest.raises(CompositionsUnavailable, match=r"musicrel\[eval\]") as err:
        group_versions([shingles(CODEC, tokens(melody(1)))])
    assert isinstance(err.value, MusicrelError) and err.value.code == "compositions_unavailable"
