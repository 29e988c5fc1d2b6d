"""A piano model's vocabulary grown by INSTRUMENT tokens (`model.init_from` with data prepared with
--instruments): the shipped model's rows kept and its piano logits unchanged, the new rows where
`_instrument_rows` puts them, the head still tied; and the path end to end on a tiny model (piano run, export,
a run on a piano + band mix from it, export, load)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pretty_midi
import pytest
import torch

from musicrel.cli import main
from musicrel.errors import ConfigError
from musicrel.midi.codec import CodecConfig, EventCodec
from musicrel.model.checkpoint import load_codec, load_model, read_config
from musicrel.model.config import ModelConfig
from musicrel.model.transformer import MusicTransformer
from training.module import INSTRUMENT_ROW_NOISE, _weights_from

REPO = Path(__file__).resolve().parents[2]
DEFAULT = REPO / "checkpoints" / "default"
TINY = str(REPO / "configs" / "tiny.yaml")
BAND = EventCodec(CodecConfig(instruments=True))


def test_the_shipped_model_grows_instrument_rows_and_keeps_its_piano():
    saved = read_config(DEFAULT)
    cfg = ModelConfig.from_dict({**saved["model"], "vocab_size": BAND.vocab_size})
    assert cfg.tie_embeddings
    state = _weights_from(str(DEFAULT), cfg, BAND.config.to_dict())
    base = load_model(DEFAULT).eval()
    old = base.tok_emb.weight.detach()
    emb = state["tok_emb.weight"]
    assert emb.shape == (520, old.size(1)) and state["head.weight"] is emb  # tied: one tensor
    assert torch.equal(emb[:391], old)  # every piano row keeps its id and its values
    new = emb[BAND.instrument_offset :]
    notes = old[:128]
    assert torch.allclose(
        new.mean(dim=0), notes.mean(dim=0), atol=4 * INSTRUMENT_ROW_NOISE * notes.std() / 11
    )
    spread = (new - notes.mean(dim=0)).std(dim=0) / notes.std(dim=0)
    assert 0.5 * INSTRUMENT_ROW_NOISE < spread.mean() < 1.5 * INSTRUMENT_ROW_NOISE
    assert torch.cdist(new, new).fill_diagonal_(1.0).min() > 0  # 129 different rows
    grown = MusicTransformer(cfg).eval()
    grown.load_state_dict(state)
    assert grown.head.weight is grown.tok_emb.weight
    # a piano stream reads the same: the logits of the old ids are the shipped model's
    piano = torch.as_tensor(EventCodec().encode_notes(_scale())[:200], dtype=torch.long)[None]
    with torch.no_grad():
        before, after = base(piano), grown(piano)
    assert torch.allclose(after[..., :391], before, atol=1e-5)
    # and the new tokens start with a typical note-on's logit, not far above or below every other
    on_logit = before[0, :, :128].mean()
    assert (after[0, :, 391:].mean() - on_logit).abs() < before[0].std()


def test_an_instruments_model_cannot_start_a_piano_one(tmp_path):
    from musicrel.model.checkpoint import save_model

    small = dict(n_layers=1, d_model=16, n_heads=2, d_ff=32, max_seq_len=32)
    folder = save_model(
        MusicTransformer(ModelConfig(vocab_size=BAND.vocab_size, **small)), tmp_path / "band", codec=BAND
    )
    with pytest.raises(ConfigError) as err:  # its instruments cannot be taken away
        _weights_from(str(folder), ModelConfig(vocab_size=391, **small), EventCodec().config.to_dict())
    assert err.value.code == "codec_mismatch"
    # the same codec on both sides: the rows as they are
    state = _weights_from(str(folder), ModelConfig(vocab_size=520, **small), BAND.config.to_dict())
    assert torch.equal(state["tok_emb.weight"], load_model(folder).tok_emb.weight)


def test_an_instruments_model_grown_by_infill_markers_keeps_every_instrument_row(tmp_path):
    """The markers come before the INSTRUMENT ids, so every instrument row moves up by three: each keeps its
    own values, the drums' too (it once started as program 0's)."""
    from musicrel.model.checkpoint import save_model

    small = dict(n_layers=1, d_model=16, n_heads=2, d_ff=32, max_seq_len=32)
    folder = save_model(
        MusicTransformer(ModelConfig(vocab_size=BAND.vocab_size, **small)), tmp_path / "band", codec=BAND
    )
    both = EventCodec(CodecConfig(instruments=True, infill=True))
    cfg = ModelConfig(vocab_size=both.vocab_size, **small)
    state = _weights_from(str(folder), cfg, both.config.to_dict())
    old, new = load_model(folder).tok_emb.weight, state["tok_emb.weight"]
    assert new.shape[0] == both.vocab_size == BAND.vocab_size + 3
    assert torch.equal(new[: BAND.pad_id + 3], old[: BAND.pad_id + 3])  # events and specials in place
    count = BAND.num_instruments
    assert torch.equal(
        new[both.instrument_offset : both.instrument_offset + count],
        old[BAND.instrument_offset : BAND.instrument_offset + count],
    )
    assert torch.equal(new[both.drums_id], old[BAND.drums_id])
    for marker in (both.future_id, both.past_id, both.fill_id):
        assert torch.equal(new[marker], old[BAND.bos_id])


def _scale(n: int = 48):
    return [
        pretty_midi.Note(velocity=80, pitch=48 + k % 24, start=0.125 * k, end=0.125 * k + 0.3)
        for k in range(n)
    ]


def _band_file(path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    pm = pretty_midi.PrettyMIDI()
    for program, is_drum in ((33, False), (29, False), (0, True)):
        inst = pretty_midi.Instrument(program=program, is_drum=is_drum)
        for k in range(48):
            low, high = (36, 46) if is_drum else (40, 70)
            start = 0.25 * k
            inst.notes.append(pretty_midi.Note(90, int(rng.integers(low, high)), start, start + 0.2))
        pm.instruments.append(inst)
    pm.write(str(path))


def _train(root: Path, data: Path, *extra: str) -> Path:
    args = ["train", "--config", TINY, "--data.data_dir", str(data), "--trainer.default_root_dir", str(root)]
    assert main([*args, "--model.decay_steps", "4", "--trainer.max_steps", "4", *extra]) == 0
    (version,) = sorted((root / "tiny").glob("version_*"))
    return version


def test_fine_tune_a_piano_model_on_a_band_mix(pattern_midi_dir, tiny_data, tmp_path):
    piano = tmp_path / "piano"
    version = _train(tmp_path / "runs-piano", tiny_data)
    assert main(["export", str(version / "checkpoints" / "last.ckpt"), "--out", str(piano)]) == 0
    assert not load_codec(piano).config.instruments
    band = tmp_path / "band"
    band.mkdir()
    for k in range(4):
        _band_file(band / f"song{k}.mid", k)
    data = tmp_path / "mix"
    sources = [f"piano={pattern_midi_dir}", f"band={band}"]
    assert (
        main(["prepare", *sources, "--instruments", "--weight", "band=3", "--out", str(data), "--quiet"]) == 0
    )
    version = _train(tmp_path / "runs-mix", data, "--model.init_from", str(piano))
    mixed = tmp_path / "mixed"
    assert main(["export", str(version / "checkpoints" / "last.ckpt"), "--out", str(mixed)]) == 0
    codec = load_codec(mixed)
    assert codec.config.instruments and codec.vocab_size == BAND.vocab_size
    model = load_model(mixed)
    start = load_model(piano)
    # the piano rows moved by training only: the new rows were appended, the old ones not re-indexed
    assert model.tok_emb.weight.shape[0] == 520 and start.tok_emb.weight.shape[0] == 391
    assert model.head.weight is model.tok_emb.weight
    assert main(["evaluate", "--checkpoint", str(mixed), "--data", str(data), "--split", "val"]) == 0
    # the piano's NLL on the very tokens a piano model is scored on: a folder prepared without instruments
    from training.evaluate import evaluate

    assert evaluate(mixed, tiny_data, split="val")["nll"] > 0
    with pytest.raises(ConfigError) as err:  # a piano model cannot read a folder with instruments
        evaluate(piano, data, split="val")
    assert err.value.code == "codec_mismatch"


def test_crops_know_the_instrument_they_start_in():
    from training.data import augment, instrument_at

    c = BAND
    kit, bass, shift = c.drums_id, c.instrument_offset + 33, c.time_shift_offset + 9
    piece = [kit, 36, shift, 128 + 36, 38, shift, 128 + 38, bass, 40, shift, 128 + 40]
    stream = np.array([c.bos_id, *piece, c.eos_id, c.bos_id, 60, shift, 128 + 60, c.eos_id])
    index = np.flatnonzero(c.is_instrument(stream))
    assert instrument_at(c, stream, 4, index) == 128  # inside the drums
    assert instrument_at(c, stream, 10, index) == 33
    assert instrument_at(c, stream, 15, index) == 0  # the next piece: the piano's, as its encoding says
    assert instrument_at(EventCodec(), stream, 4, None) == 0
    crop = stream[4:]  # starts inside the drums: told so, the kit keeps its pitches, the bass moves
    up = augment(c, crop, 2, 1.0, instrument_at(c, stream, 4, index))
    assert up.tolist() == [128 + 36, 38, shift, 128 + 38, bass, 42, shift, 128 + 42, c.eos_id, c.bos_id, 62,
                           shift, 128 + 62, c.eos_id]  # fmt: skip


def test_musicrel_finetune_with_instruments(tmp_path):
    from musicrel.model.checkpoint import save_model

    torch.manual_seed(0)
    small = dict(n_layers=1, d_model=16, n_heads=2, d_ff=32, max_seq_len=32, dropout=0.0)
    piano = save_model(
        MusicTransformer(ModelConfig(vocab_size=391, **small)), tmp_path / "piano", codec=EventCodec()
    )
    band = tmp_path / "band"
    band.mkdir()
    for k in range(5):
        _band_file(band / f"song{k}.mid", 10 + k)
    out = tmp_path / "out"
    args = ["finetune", "--checkpoint", str(piano), "--data", str(band), "--out", str(out), "--instruments"]
    assert main([*args, "--max-steps", "4", "--val-every", "2", "--batch-size", "2", "--quiet"]) == 0
    codec = load_codec(out)
    assert codec.config.instruments and load_model(out).tok_emb.weight.shape[0] == 520
    summary = json.loads((out / "finetune.json").read_text())
    assert summary["base"]["grown"] and summary["steps"] == 4
    assert all(np.isfinite(v) for v in summary["nll_before"].values())
    assert "INSTRUMENT tokens" in (out / "MODEL_CARD.md").read_text()
    grown = load_model(out.with_name("out.work") / "grown")  # what "before" scored: the base, grown
    assert torch.equal(grown.tok_emb.weight[:391], load_model(piano).tok_emb.weight)


def test_infill_markers_added_to_an_instruments_folder_move_its_instrument_ids(tmp_path):
    """A folder prepared with instruments, trained and scored by a model with infill markers (no re-prepare):
    the markers take ids 391-393 where the folder has INSTRUMENT tokens, so every one of those moves up by
    three (read as they were, the bass became a marker and every program the one three below it)."""
    from training.evaluate import evaluate
    from training.module import MusicDataModule

    band = tmp_path / "band"
    band.mkdir()
    for k in range(4):
        _band_file(band / f"song{k}.mid", k)
    data = tmp_path / "data"
    assert main(["prepare", f"band={band}", "--instruments", "--out", str(data), "--quiet"]) == 0
    both = EventCodec(CodecConfig(instruments=True, infill=True))
    plain = MusicDataModule(str(data), seq_len=64)
    module = MusicDataModule(str(data), seq_len=64, infill_rate=0.5)
    assert module.vocab_size == both.vocab_size
    for split in ("train", "val"):
        before, after = np.asarray(plain._stream(split)), module._stream(split)
        assert after.shape == before.shape and after.max() < both.vocab_size
        moved = BAND.is_instrument(before)
        assert moved.any() and not np.isin(after, [both.future_id, both.past_id, both.fill_id]).any()
        assert np.array_equal(after[moved], before[moved] + 3)
        assert np.array_equal(after[~moved], before[~moved])
        assert np.array_equal(both.is_instrument(after), moved)
    # `musicrel evaluate` reads the folder the same way: a model whose codec has both scores its tokens
    from musicrel.model.checkpoint import save_model

    torch.manual_seed(0)
    small = dict(n_layers=1, d_model=16, n_heads=2, d_ff=32, max_seq_len=64)
    folder = save_model(
        MusicTransformer(ModelConfig(vocab_size=both.vocab_size, **small)), tmp_path / "m", codec=both
    )
    assert evaluate(folder, data, split="val")["tokens"] > 0
