"""Infill training examples (training/data.py `infill_example`, musicrel.generation.fim's layout) and a tiny
`musicrel train` run that grows a model's vocabulary by the infill markers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pretty_midi
import pytest
import torch

from musicrel.generation import fim
from musicrel.midi.codec import CodecConfig, EventCodec, shift_steps
from training.data import CropDataset, infill_example

CODEC = EventCodec(CodecConfig(infill=True))
STEPS = shift_steps(CODEC)
REPO = Path(__file__).resolve().parents[2]


def _piece(n: int = 120, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t, notes = 0.0, []
    for _ in range(n):
        t += float(rng.choice([0.0, 0.12, 0.25, 0.5, 1.7]))
        notes.append(pretty_midi.Note(int(rng.integers(30, 120)), int(rng.integers(40, 90)), t, t + 0.3))
    return CODEC.encode_notes(notes).astype(np.int64)


def _stream(*pieces) -> np.ndarray:
    parts = []
    for p in pieces:
        parts += [[CODEC.bos_id], p, [CODEC.eos_id]]
    return np.concatenate(parts).astype(np.int64)


def _segments(tokens, roles):
    return {r: tokens[roles == r] for r in (fim.FUTURE, fim.PAST, fim.GAP)}


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("want", [129, 513])
def test_an_infill_example_is_future_past_gap_and_splits_the_crop_losslessly(seed, want):
    piece = _piece(200, seed)
    crop = piece[:want]
    out = infill_example(CODEC, crop, np.random.default_rng(seed), want)
    assert out is not None
    tokens, roles = out
    assert len(tokens) == len(roles) <= want
    # markers in place: FUTURE first, then PAST, then FILL right before the gap
    assert tokens[0] == CODEC.future_id
    (past_at,) = np.flatnonzero(tokens == CODEC.past_id)
    (fill_at,) = np.flatnonzero(tokens == CODEC.fill_id)
    assert 0 < past_at < fill_at
    assert (roles[fill_at + 1 :] == fim.GAP).all() and len(tokens) > fill_at + 1
    assert (roles[past_at + 1 : fill_at] == fim.PAST).all()
    # the shifts after FUTURE say the gap's length, and the gap's own shifts add up to exactly that
    head = 1
    while roles[head] == fim.PLACED:
        head += 1
    gap_steps = int(STEPS[tokens[1:head]].sum())
    assert CODEC.is_time_shift(tokens[1:head]).all() and gap_steps > 0
    seg = _segments(tokens, roles)
    assert int(STEPS[seg[fim.GAP]].sum()) == gap_steps
    # the gap ends on its last shift (it is cut at a time boundary), and no marker is inside a segment
    assert CODEC.is_time_shift(seg[fim.GAP][-1:]).all()
    assert (np.concatenate(list(seg.values())) < CODEC.pad_id).all()
    # past + gap + future is the crop's music: the same notes (when nothing was cut to fit)
    if len(seg[fim.PAST]) + len(seg[fim.GAP]) + len(seg[fim.FUTURE]) == len(crop):
        a = CODEC.decode_notes(crop)
        b = CODEC.decode_notes(np.concatenate([seg[fim.PAST], seg[fim.GAP], seg[fim.FUTURE]]))
        assert [(n.start, n.end, n.pitch, n.velocity) for n in a] == [
            (n.start, n.end, n.pitch, n.velocity) for n in b
        ]
    # the future is bounded
    assert past_at <= int(want * fim.FUTURE_SHARE)


def test_a_long_crop_gets_a_gap_of_four_to_eight_seconds():
    lengths = []
    for seed in range(20):
        out = infill_example(CODEC, _piece(400, seed)[:1025], np.random.default_rng(seed), 1025)
        tokens, roles = out
        lengths.append(int(STEPS[tokens[roles == fim.GAP]].sum()) * CODEC.step)
    assert sum(4.0 <= s <= 8.0 + 1e-9 for s in lengths) >= 15, lengths


def test_a_gap_never_spans_two_pieces_and_bos_eos_mark_piece_edges():
    short, long = _piece(20, 1), _piece(150, 2)
    crop = _stream(short, long)[:400]
    tokens, roles = infill_example(CODEC, crop, np.random.default_rng(0), 401)
    seg = _segments(tokens, roles)
    # everything comes from the long piece (the longest run), which starts after a bos: the past may say so
    assert len(seg[fim.PAST]) + len(seg[fim.GAP]) + len(seg[fim.FUTURE]) >= len(crop) - len(short) - 10
    after_past = tokens[np.flatnonzero(tokens == CODEC.past_id)[0] + 1]
    assert after_past == CODEC.bos_id
    whole = _stream(_piece(40, 2))  # a short piece in a long example: its future fits, up to the piece's end
    tokens, roles = infill_example(CODEC, whole, np.random.default_rng(3), 4 * len(whole))
    assert CODEC.eos_id in tokens[: np.flatnonzero(tokens == CODEC.past_id)[0]]


def test_a_crop_with_too_few_events_stays_a_continuation():
    crop = _stream(_piece(2, 0), _piece(2, 1))  # 4 to 6 events each
    assert infill_example(CODEC, crop, np.random.default_rng(0), 64) is None


@pytest.mark.parametrize("loss", ["all", "gap"])
def test_the_dataset_mixes_continuations_and_infills_and_masks_the_loss(loss):
    stream = _stream(*[_piece(150, s) for s in range(6)])
    ds = CropDataset(stream, 256, CODEC, 40, seed=1, augment=True, infill_rate=0.5, infill_loss=loss)
    plain = CropDataset(stream, 256, CODEC, 40, seed=1, augment=True)
    kinds = []
    for i in range(40):
        ex, ref = ds[i], plain[i]
        x, y = ex["inputs"], ex["targets"]
        assert x.shape == y.shape == (256,)
        if x[0] != CODEC.future_id:  # a continuation: exactly the crop it was before infill existed
            assert torch.equal(x, ref["inputs"]) and torch.equal(y, ref["targets"])
            kinds.append("continue")
            continue
        kinds.append("infill")
        seq = torch.cat([x, y[-1:]])
        fill = int((seq == CODEC.fill_id).nonzero()[0])
        past = int((seq == CODEC.past_id).nonzero()[0])
        trained = y != -100
        # markers and the gap-length shifts are never targets; the gap's tokens always are
        for marker in (CODEC.past_id, CODEC.fill_id, CODEC.future_id):
            assert not ((y == marker) & trained).any()
        real = (y >= 0) & (y != CODEC.pad_id)
        gap = seq[fill + 1 :][real[fill:]].numpy()
        gap_steps = int(STEPS[gap].sum())
        assert CODEC.is_time_shift(gap[-1])  # the gap ends on its cut
        head = 1 + len(fim.shifts(CODEC, gap_steps))  # FUTURE and the gap-length shifts
        assert torch.equal(seq[1:head], torch.from_numpy(fim.shifts(CODEC, gap_steps)))
        assert not trained[: head - 1].any()
        assert trained[fill:][real[fill:]].all()
        if loss == "gap":
            assert not trained[:fill].any()
        else:
            assert trained[head - 1 : past - 1].any() and trained[past + 1 : fill - 1].all()
    assert 10 <= kinds.count("infill") <= 30, kinds


def test_infill_rate_needs_the_markers_and_is_checked():
    from musicrel.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        CropDataset(np.arange(100) % 300, 16, EventCodec(), 4, infill_rate=0.5)
    assert err.value.code == "model_cannot_infill"
    with pytest.raises(ConfigError):
        CropDataset(np.arange(100) % 300, 16, CODEC, 4, infill_rate=1.5)
    with pytest.raises(ConfigError):
        CropDataset(np.arange(100) % 300, 16, CODEC, 4, infill_rate=0.5, infill_loss="future")


def test_init_from_grows_the_vocabulary_by_the_markers(tmp_path):
    from musicrel.model.checkpoint import save_model
    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import MusicTransformer
    from training.module import MusicLM

    old = EventCodec()
    shape = dict(n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=64)
    torch.manual_seed(0)
    base = MusicTransformer(ModelConfig(vocab_size=old.vocab_size, **shape))
    save_model(base, tmp_path / "m", codec=old)
    grown = ModelConfig(vocab_size=CODEC.vocab_size, **shape).to_dict()
    module = MusicLM(config=grown, codec=CODEC.config.to_dict(), init_from=str(tmp_path / "m"))
    emb, base_emb = module.model.tok_emb.weight, base.tok_emb.weight
    assert emb.shape[0] == base_emb.shape[0] + 3
    assert torch.equal(emb[: old.vocab_size], base_emb)  # every old id keeps its row
    for marker in (CODEC.future_id, CODEC.past_id, CODEC.fill_id):
        assert torch.equal(emb[marker], base_emb[old.bos_id])
    # and an infill model cannot start a model without the markers
    save_model(module.model, tmp_path / "infill", codec=CODEC)
    from musicrel.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        MusicLM(config={**grown, "vocab_size": old.vocab_size}, codec=old.config.to_dict(),
                init_from=str(tmp_path / "infill"))  # fmt: skip
    assert err.value.code == "codec_mismatch"


def test_tiny_training_with_infill_examples_exports_an_infill_model(tiny_data, tmp_path):
    from musicrel.cli import main
    from musicrel.model.checkpoint import load_codec, load_model

    root = tmp_path / "runs"
    rc = main(
        [
            "train",
            "--config",
            str(REPO / "configs" / "tiny.yaml"),
            "--data.data_dir",
            str(tiny_data),
            "--data.infill_rate",
            "0.5",
            "--model.config.max_seq_len",
            "128",
            "--trainer.default_root_dir",
            str(root),
            "--trainer.max_steps",
            "3",
        ]
    )
    assert rc == 0
    (version,) = sorted((root / "tiny").glob("version_*"))
    out = tmp_path / "model"
    assert main(["export", str(version / "checkpoints" / "last.ckpt"), "--out", str(out)]) == 0
    codec, model = load_codec(out), load_model(out)
    assert codec.config.infill and model.cfg.vocab_size == codec.vocab_size == CODEC.vocab_size
    # the plain prepared data still evaluates with it (the markers add tokens, they change none)
    assert main(["evaluate", "--checkpoint", str(out), "--data", str(tiny_data), "--split", "val"]) == 0
