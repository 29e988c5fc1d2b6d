from __future__ import annotations

import numpy as np
import pretty_midi
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from musicrel.midi.codec import EventCodec
from training.data import CropDataset, ResumableLoader, ResumableSampler, WindowDataset, augment

CODEC = EventCodec()


def _notes(seed: int, n: int = 30) -> list[pretty_midi.Note]:
    rng = np.random.default_rng(seed)
    notes, t = [], 0.0
    for _ in range(n):
        t += float(rng.integers(0, 40)) * 0.01
        notes.append(
            pretty_midi.Note(
                velocity=int(rng.integers(20, 127)),
                pitch=int(rng.integers(30, 100)),
                start=t,
                end=t + float(rng.integers(5, 80)) * 0.01,
            )
        )
    return notes


def _key(notes, time_scale=1.0):
    return sorted((round(n.start * time_scale, 2), n.pitch) for n in notes)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), semitones=st.integers(-3, 3))
def test_transposed_tokens_decode_to_transposed_notes(seed, semitones):
    tokens = CODEC.encode_notes(_notes(seed))
    before = CODEC.decode_notes(tokens)
    after = CODEC.decode_notes(augment(CODEC, tokens, semitones, 1.0))
    assert [(n.start, n.end, n.pitch + semitones, n.velocity) for n in before] == [
        (n.start, n.end, n.pitch, n.velocity) for n in after
    ]


def test_transposition_drops_notes_pushed_out_of_range():
    notes = [
        pretty_midi.Note(velocity=64, pitch=p, start=i * 0.1, end=i * 0.1 + 0.05)
        for i, p in enumerate((1, 60, 126))
    ]
    up = CODEC.decode_notes(augment(CODEC, CODEC.encode_notes(notes), 3, 1.0))
    down = CODEC.decode_notes(augment(CODEC, CODEC.encode_notes(notes), -3, 1.0))
    assert [n.pitch for n in up] == [4, 63] and [n.pitch for n in down] == [57, 123]


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), factor=st.sampled_from([0.95, 0.975, 1.025, 1.05]))
def test_stretched_tokens_decode_to_stretched_notes(seed, factor):
    notes = _notes(seed)
    out = CODEC.decode_notes(augment(CODEC, CODEC.encode_notes(notes), 0, factor))
    # onsets 10 ms apart may land on one step, which reorders them by pitch: compare as multisets
    plain = CODEC.decode_notes(CODEC.encode_notes(notes))
    assert sorted(n.pitch for n in out) == sorted(n.pitch for n in plain)
    # onsets scale by the factor, within the 10 ms grid (re-quantised by rounding)
    src = sorted(n.start for n in CODEC.decode_notes(CODEC.encode_notes(notes)))
    np.testing.assert_allclose(sorted(n.start for n in out), np.array(src) * factor, atol=0.0101)


def test_augment_keeps_separators_in_place():
    a, b = CODEC.encode_notes(_notes(1, 8)), CODEC.encode_notes(_notes(2, 8))
    seq = np.concatenate([[CODEC.bos_id], a, [CODEC.eos_id, CODEC.bos_id], b, [CODEC.eos_id]])
    out = augment(CODEC, seq, 2, 1.05)
    specials = np.flatnonzero(out >= CODEC.pad_id)
    assert out[specials].tolist() == [CODEC.bos_id, CODEC.eos_id, CODEC.bos_id, CODEC.eos_id]
    np.testing.assert_array_equal(out[1 : specials[1]], augment(CODEC, a, 2, 1.05))


def _stream(n_pieces=6):
    parts = []
    for i in range(n_pieces):
        parts += [[CODEC.bos_id], CODEC.encode_notes(_notes(i, 40)), [CODEC.eos_id]]
    return np.concatenate(parts).astype(np.uint16)


def test_crops_are_deterministic_per_seed_epoch_index():
    stream = _stream()
    ds = CropDataset(stream, 64, CODEC, length=10, seed=3)
    again = CropDataset(stream, 64, CODEC, length=10, seed=3)
    x = ds[4]
    assert x["inputs"].shape == (64,) and x["targets"].shape == (64,)
    assert torch.equal(x["inputs"], again[4]["inputs"])
    assert torch.equal(x["inputs"][1:], x["targets"][:-1])  # targets are the inputs shifted by one
    assert not torch.equal(ds[4]["inputs"], ds[14]["inputs"])  # same index, next epoch: another crop
    assert not torch.equal(ds[4]["inputs"], CropDataset(stream, 64, CODEC, 10, seed=4)[4]["inputs"])
    assert int(x["inputs"].max()) < CODEC.vocab_size


def test_short_stream_is_padded_and_masked():
    stream = np.array([CODEC.bos_id, 60, 300, 188, CODEC.eos_id], dtype=np.uint16)
    x = CropDataset(stream, 16, CODEC, length=1, augment=False)[0]
    assert x["inputs"][:5].tolist() == stream.tolist() and (x["inputs"][5:] == CODEC.pad_id).all()
    assert x["targets"][:4].tolist() == stream[1:].tolist() and (x["targets"][4:] == -100).all()


def test_windows_cover_every_target_once():
    stream = np.arange(1, 26, dtype=np.uint16)
    ds = WindowDataset(stream, 8, pad_id=0)
    targets = torch.cat([ds[k]["targets"] for k in range(len(ds))])
    assert targets[targets != -100].tolist() == list(range(2, 26))


@pytest.mark.parametrize("num_workers", [0])
def test_loader_resumes_at_the_next_batch(num_workers):
    ds = CropDataset(_stream(), 32, CODEC, length=12, seed=0)

    def loader():
        return ResumableLoader(
            ds, batch_size=2, sampler=ResumableSampler(len(ds)), drop_last=True, num_workers=num_workers
        )

    full = loader()
    full.sampler.set_epoch(1)
    batches = [b["inputs"] for b in full]
    assert len(batches) == 6
    first = loader()
    first.sampler.set_epoch(1)
    it = iter(first)
    for _ in range(2):
        next(it)
    state = first.state_dict()
    assert state == {"epoch": 1, "batches": 2}
    resumed = loader()
    resumed.load_state_dict(state)
    resumed.sampler.set_epoch(1)
    rest = [b["inputs"] for b in resumed]
    assert len(rest) == 4 and all(torch.equal(a, b) for a, b in zip(rest, batches[2:], strict=True))
    assert resumed.state_dict() == {"epoch": 1, "batches": 6}
    resumed.sampler.set_epoch(2)  # the resume offset applies to the interrupted epoch only
    assert len(list(resumed)) == 6


def test_ranks_share_an_epoch_without_overlap_and_resume_per_rank():
    ranks = [ResumableSampler(10, num_replicas=2, rank=r) for r in (0, 1)]
    for s in ranks:
        s.set_epoch(3)
    shares = [list(s) for s in ranks]
    assert sorted(shares[0] + shares[1]) == list(range(30, 40)) and len(ranks[0]) == 5
    ranks[1].start = 2  # rank 1 had consumed 2 examples
    assert list(ranks[1]) == shares[1][2:]


def test_crops_come_from_each_source_in_proportion_to_weight_times_tokens():
    stream = np.arange(40_000)  # a crop's first value is its start: [0, 10k) is source a, [10k, 40k) b
    parts = [(0, 10_000, 3.0), (10_000, 40_000, 1.0)]  # masses 30k and 30k: half each
    ds = CropDataset(stream, 16, CODEC, length=2000, seed=0, augment=False, sources=parts)
    starts = np.array([int(ds[i]["inputs"][0]) for i in range(2000)])
    assert 0.45 < float(np.mean(starts < 10_000)) < 0.55
    assert all(s + 17 <= 10_000 for s in starts[starts < 10_000])  # a crop never runs into the next source
    zero = CropDataset(
        stream, 16, CODEC, 500, augment=False, sources=[(0, 10_000, 0.0), (10_000, 40_000, 1.0)]
    )
    assert min(int(zero[i]["inputs"][0]) for i in range(500)) >= 10_000
    # one part covering the stream draws exactly the crops of no parts at all
    one = CropDataset(stream, 16, CODEC, 50, seed=2, augment=False, sources=[(0, 40_000, 1.0)])
    plain = CropDataset(stream, 16, CODEC, 50, seed=2, augment=False)
    assert all(torch.equal(one[i]["inputs"], plain[i]["inputs"]) for i in range(50))
