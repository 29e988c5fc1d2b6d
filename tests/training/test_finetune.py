"""`musicrel finetune` on a tiny model: it starts from the base weights, the held-out NLL of the fine-tuning
files falls, the card records the base and the data, and bad requests are refused with a code."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from musicrel.cli import main
from musicrel.errors import ConfigError
from musicrel.midi.codec import CodecConfig, EventCodec
from musicrel.model.checkpoint import load_model, save_model, weights_sha256
from musicrel.model.config import ModelConfig
from musicrel.model.transformer import MusicTransformer
from training.finetune import FinetuneConfig, FinetuneRun, build_module, finetune
from training.prepare import prepare

from .conftest import write_pattern_midi


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """An untrained tiny model folder: whatever it knows, the pattern files are new to it."""
    codec = EventCodec()
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=codec.vocab_size, n_layers=2, d_model=32, n_heads=2, d_ff=64, max_seq_len=32, dropout=0.0
    )
    return save_model(MusicTransformer(cfg), tmp_path_factory.mktemp("base") / "base", codec=codec)


def test_the_module_starts_from_the_base_weights(base):
    lm = build_module(base, EventCodec(), FinetuneConfig())
    want = load_model(base).state_dict()
    got = lm.model.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert lm.hparams.lr == FinetuneConfig().lr


def test_finetune_lowers_the_held_out_nll_and_records_its_base(base, pattern_midi_dir, tmp_path):
    out = tmp_path / "mine"
    cfg = FinetuneConfig(lr=3e-3, warmup_steps=2, max_steps=16, val_every=4, batch_size=4, patience=10)
    s = finetune(
        FinetuneRun(base, [pattern_midi_dir], out, accelerator="cpu", progress=False, command="x"), cfg
    )

    assert s["steps"] == 16
    for split in ("val", "test"):  # files the fine-tuning never trained on
        assert s["data"]["files"][split] >= 1
        assert s["nll_after"][split] < 0.9 * s["nll_before"][split]
    assert s["data"]["files"]["train"] + s["data"]["files"]["val"] + s["data"]["files"]["test"] == 8
    assert s["base"]["weights_sha256"] == weights_sha256(base)
    card = (out / "MODEL_CARD.md").read_text()
    assert weights_sha256(base) in card and s["data"]["sha256"] in card
    assert json.loads((out / "finetune.json").read_text())["nll_after"] == s["nll_after"]
    tuned = load_model(out)  # a plain model folder: generate and serve read it unchanged
    assert tuned.cfg.d_model == 32
    pairs = zip(tuned.parameters(), load_model(base).parameters(), strict=True)
    moved = sum((a - b).abs().sum() for a, b in pairs)
    assert moved > 0


def test_too_few_files_are_refused(base, tmp_path):
    (tmp_path / "src").mkdir()
    for i in range(2):
        write_pattern_midi(tmp_path / "src" / f"p{i}.mid", 60 + i)
    (tmp_path / "src" / "broken.mid").write_bytes(b"MThd not really")
    with pytest.raises(ConfigError) as exc:
        finetune(FinetuneRun(base, [tmp_path / "src"], tmp_path / "out", accelerator="cpu", progress=False))
    assert exc.value.code == "too_few_files"
    assert "2 usable" in str(exc.value)


def test_a_folder_prepared_with_another_codec_is_refused(base, pattern_midi_dir, tmp_path, capsys):
    other = tmp_path / "prepared"
    prepare([pattern_midi_dir], other, codec=EventCodec(CodecConfig(velocity_bins=16)), progress=False)
    rc = main(["finetune", "--checkpoint", str(base), "--data", str(other), "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "codec_mismatch" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_resume_needs_a_checkpoint(base, pattern_midi_dir, tmp_path):
    with pytest.raises(ConfigError) as exc:
        finetune(
            FinetuneRun(
                base, [pattern_midi_dir], tmp_path / "o", resume=True, accelerator="cpu", progress=False
            )
        )
    assert exc.value.code == "nothing_to_resume"


def test_config_is_validated():
    with pytest.raises(ConfigError, match="sources"):
        FinetuneRun("base", "one/folder", "out")  # a string, not a list of paths
    with pytest.raises(ConfigError, match="max_steps"):
        FinetuneConfig(max_steps=0)
    with pytest.raises(ConfigError, match="lr"):
        FinetuneConfig(lr=0)
    with pytest.raises(ConfigError, match="val_windows"):
        FinetuneConfig(val_windows=0)


def test_validation_and_the_before_after_figures_are_capped(base, pattern_midi_dir, tmp_path, monkeypatch):
    import training.finetune as ft

    seen = []

    def spy(real, key):
        return lambda *a, **k: seen.append(k[key]) or real(*a, **k)

    monkeypatch.setattr(ft, "evaluate", spy(ft.evaluate, "max_windows"))
    monkeypatch.setattr(ft, "MusicDataModule", spy(ft.MusicDataModule, "val_windows"))
    cfg = FinetuneConfig(max_steps=2, val_every=2, batch_size=2, val_windows=1)
    finetune(FinetuneRun(base, [pattern_midi_dir], tmp_path / "m", accelerator="cpu", progress=False), cfg)
    assert seen == [1, 1, 1, 1, 1]  # the data module, then NLL before and after on val and test


def test_an_interrupted_run_resumes_from_its_last_checkpoint(base, pattern_midi_dir, tmp_path):
    out = tmp_path / "mine"
    cfg = dict(lr=3e-3, warmup_steps=2, val_every=4, batch_size=4, patience=10)
    run = FinetuneRun(base, [pattern_midi_dir], out, accelerator="cpu", progress=False)
    first = finetune(run, FinetuneConfig(max_steps=8, **cfg))
    assert first["steps"] == 8 and (out.with_name("mine.work") / "checkpoints" / "last.ckpt").is_file()
    again = finetune(replace(run, resume=True), FinetuneConfig(max_steps=12, **cfg))
    assert again["steps"] == 12  # went on from step 8, not from 0
    assert again["nll_before"] == first["nll_before"]  # the same base and held-out files
