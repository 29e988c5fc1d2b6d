"""`musicrel train` end to end on a tiny model: loss goes down, resume is exact, export keeps the logits."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from musicrel.cli import main
from musicrel.model.checkpoint import load_codec, load_model

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "tiny.yaml")


def _train(data: Path, root: Path, *extra: str) -> Path:
    # decay_steps pinned: by default the cosine follows max_steps, which differs between the runs compared
    rc = main(
        [
            "train",
            "--config",
            TINY,
            "--data.data_dir",
            str(data),
            "--trainer.default_root_dir",
            str(root),
            "--model.decay_steps",
            "12",
            *extra,
        ]
    )
    assert rc == 0
    (version,) = sorted((root / "tiny").glob("version_*"))
    return version


def _rows(version: Path) -> dict[int, dict[str, str]]:
    rows: dict[int, dict[str, str]] = {}
    with open(version / "metrics.csv") as f:
        for row in csv.DictReader(f):
            if row.get("train/nll"):
                rows[int(row["step"])] = row
    return rows


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def runs(tiny_data, tmp_path_factory):
    """A: 12 steps uninterrupted. B: the same run stopped at 6 (epochs are 8 steps: resume lands mid-epoch).
    C: B resumed up to 12. One torch thread each: `musicrel train` otherwise chooses its threads by the
    machine's load at its start, and a loss summed by two threads differs from one thread's in its last bit
    (a clean-clone run once logged 5.1651683 against 5.1651678 at step 6)."""
    root = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")
        a = _train(tiny_data, root / "a", "--trainer.max_steps", "12")
        b = _train(tiny_data, root / "b", "--trainer.max_steps", "6")
        c = _train(
            tiny_data,
            root / "c",
            "--trainer.max_steps",
            "12",
            "--resume",
            str(b / "checkpoints" / "last.ckpt"),
        )
    return a, b, c


def test_training_lowers_the_loss_and_logs(runs):
    a, _, _ = runs
    rows = _rows(a)
    assert sorted(rows) == list(range(12))
    nll = [float(rows[s]["train/nll"]) for s in range(12)]
    assert sum(nll[-3:]) / 3 < sum(nll[:3]) / 3 - 0.5, nll
    assert all(float(rows[s]["lr"]) > 0 for s in rows) and rows[5]["train/tokens_per_s"]
    assert (a / "config.yaml").is_file()  # the resolved config of the run
    assert any(a.glob("events.out.tfevents.*"))  # TensorBoard beside the CSV
    assert list((a / "checkpoints").glob("best-*.ckpt"))  # best by val_nll, validated at steps 6 and 12


def test_resume_is_exact(runs):
    a, b, c = runs
    first, resumed = _rows(a), _rows(c)
    assert sorted(resumed) == list(range(6, 12))  # continues from the saved step
    # same weights + same next batch -> the very same loss at step 6, and on to the end
    assert [resumed[s]["train/nll"] for s in range(6, 12)] == [first[s]["train/nll"] for s in range(6, 12)]
    ckpt_a, ckpt_c = _load(a / "checkpoints" / "last.ckpt"), _load(c / "checkpoints" / "last.ckpt")
    assert ckpt_a["global_step"] == ckpt_c["global_step"] == 12
    for k, v in ckpt_a["state_dict"].items():
        assert torch.equal(v, ckpt_c["state_dict"][k]), k
    opt_a, opt_c = ckpt_a["optimizer_states"][0], ckpt_c["optimizer_states"][0]
    assert opt_a["param_groups"] == opt_c["param_groups"]
    for i, state in opt_a["state"].items():
        for name, value in state.items():
            assert torch.equal(value, opt_c["state"][i][name]), (i, name)
    assert ckpt_a["lr_schedulers"] == ckpt_c["lr_schedulers"]


def test_export_keeps_the_logits(runs, tmp_path, tiny_data):
    from training.module import MusicLM

    a, _, _ = runs
    ckpt_path = a / "checkpoints" / "last.ckpt"
    assert main(["export", str(ckpt_path), "--out", str(tmp_path / "model")]) == 0
    assert {p.name for p in (tmp_path / "model").iterdir()} == {
        "config.json",
        "model.safetensors",
        "MODEL_CARD.md",
    }
    ckpt = _load(ckpt_path)
    module = MusicLM(**{k: v for k, v in ckpt["hyper_parameters"].items() if not k.startswith("_")})
    module.load_state_dict(ckpt["state_dict"])
    module.eval()
    model, codec = load_model(tmp_path / "model"), load_codec(tmp_path / "model")
    assert codec.config.to_dict() == ckpt["hyper_parameters"]["codec"]
    x = torch.randint(0, codec.vocab_size, (2, 32))
    with torch.inference_mode():
        torch.testing.assert_close(model(x), module(x), rtol=0, atol=0)


def test_evaluate_prints_the_table(runs, tmp_path, tiny_data, capsys):
    a, _, _ = runs
    main(["export", str(a / "checkpoints" / "last.ckpt"), "--out", str(tmp_path / "m")])
    capsys.readouterr()
    assert (
        main(["evaluate", "--checkpoint", str(tmp_path / "m"), "--data", str(tiny_data), "--split", "val"])
        == 0
    )
    out = capsys.readouterr().out
    nll = float(next(line.split()[-1] for line in out.splitlines() if line.startswith("NLL")))
    assert 0 < nll < 5.0 and "perplexity" in out and "accuracy" in out
    assert any(line.split() == ["weights", "float32"] for line in out.splitlines())  # the model as trained
    argv = ["evaluate", "--checkpoint", str(tmp_path / "m"), "--data", str(tiny_data), "--split", "val"]
    assert main([*argv, "--weights", "int8"]) == 0  # as the service decodes: the same NLL within rounding
    out = capsys.readouterr().out
    assert any(line.split() == ["weights", "int8"] for line in out.splitlines())
    nll_int8 = float(next(line.split()[-1] for line in out.splitlines() if line.startswith("NLL")))
    assert abs(nll_int8 - nll) < 0.05


def test_train_help_is_lightning_cli_help(capsys, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    with pytest.raises(SystemExit) as exc:
        main(["train", "--help"])
    torch.set_num_threads(before)
    assert exc.value.code == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "--trainer.max_steps" in out and "--model.config.n_layers" in out and "--data.data_dir" in out
    assert "musicrel train: " in captured.err and "CPUs available" in captured.err  # the threads it chose


def test_export_rejects_a_non_checkpoint(tmp_path, capsys):
    bad = tmp_path / "x.ckpt"
    bad.write_bytes(b"not a checkpoint")
    assert main(["export", str(bad), "--out", str(tmp_path / "m")]) == 2
    assert "invalid_checkpoint" in capsys.readouterr().err


def test_init_from_starts_from_a_model_folder_and_refuses_another_shape(runs, tmp_path, tiny_data):
    from musicrel.errors import ConfigError
    from training.module import MusicLM

    a, _, _ = runs
    assert main(["export", str(a / "checkpoints" / "last.ckpt"), "--out", str(tmp_path / "m")]) == 0
    hp = {k: v for k, v in _load(a / "checkpoints" / "last.ckpt")["hyper_parameters"].items()}
    hp = {k: v for k, v in hp.items() if not k.startswith("_")}
    base = load_model(tmp_path / "m")
    module = MusicLM(**{**hp, "init_from": str(tmp_path / "m"), "config": {**hp["config"], "dropout": 0.3}})
    for (name, p), q in zip(module.model.state_dict().items(), base.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    with pytest.raises(ConfigError, match=r"d_model .* there") as err:
        wider = {**hp["config"], "d_model": hp["config"]["d_model"] * 2}
        MusicLM(**{**hp, "init_from": str(tmp_path / "m"), "config": wider})
    assert err.value.code == "shape_mismatch"
    other_codec = {**hp["codec"], "velocity_bins": 16}
    with pytest.raises(ConfigError) as err:
        MusicLM(**{**hp, "codec": other_codec, "init_from": str(tmp_path / "m")})
    assert err.value.code == "codec_mismatch"
    # a model with melody tokens starts from one without: every row kept, each melody row its note's
    from musicrel.midi.codec import CodecConfig, EventCodec

    melody = {**hp["codec"], "melody": True, "tracks": [0, 1]}
    grown = EventCodec(CodecConfig.from_dict(melody))
    old = EventCodec(CodecConfig.from_dict(hp["codec"]))
    grown_config = {**hp["config"], "vocab_size": grown.vocab_size}
    module = MusicLM(**{**hp, "codec": melody, "config": grown_config, "init_from": str(tmp_path / "m")})
    emb, base_emb = module.model.tok_emb.weight, base.tok_emb.weight
    assert emb.shape[0] == base_emb.shape[0] + 256
    assert torch.equal(emb[: old.num_events], base_emb[: old.num_events])
    assert torch.equal(emb[grown.melody_on_offset + 60], base_emb[old.note_on_offset + 60])
    assert torch.equal(emb[grown.melody_off_offset + 60], base_emb[old.note_off_offset + 60])
    assert torch.equal(emb[grown.bos_id], base_emb[old.bos_id])
    with pytest.raises(ConfigError) as err:  # the vocab_size is the grown codec's
        MusicLM(**{**hp, "codec": melody, "init_from": str(tmp_path / "m")})
    assert err.value.code == "shape_mismatch"


def test_multi_source_data_validates_each_source_and_evaluates_each(pattern_midi_dir, tmp_path, capsys):
    from training.prepare import prepare

    data = tmp_path / "data"
    low, high = f"low={pattern_midi_dir}/pattern_[0-3].mid", f"high={pattern_midi_dir}"
    m = prepare([low, high], data, workers=1, progress=False, split_percent=(40, 30, 30))
    assert all(r["pieces"] for r in m["splits"]["val"]["sources"].values())  # both sources have val pieces
    version = _train(data, tmp_path / "runs", "--trainer.max_steps", "6", "--data.val_windows", "4")
    with open(version / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("val_nll")]
    assert rows and all(float(rows[-1][f"val_nll/{s}"]) > 0 for s in ("low", "high"))
    assert main(["export", str(version / "checkpoints" / "last.ckpt"), "--out", str(tmp_path / "m")]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(tmp_path / "m"), "--data", str(data), "--split", "val"]) == 0
    table = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in table.splitlines()[-2:]}
    assert set(rows) == {"low", "high"}
    pooled = float(next(line.split()[-1] for line in table.splitlines() if line.startswith("NLL")))
    per = {s: (int(r[2]), float(r[3])) for s, r in rows.items()}
    assert pooled == pytest.approx(
        sum(n * x for n, x in per.values()) / sum(n for n, _ in per.values()), abs=1e-3
    )


@pytest.mark.parametrize("guarded", [True, False])
def test_a_step_with_non_finite_gradients_is_skipped(tiny_data, tmp_path, guarded):
    """One poisoned gradient (as a NaN from a kernel's backward would be) costs one update, not the run; the
    control without the guard shows the poison is real."""
    import lightning as L

    from musicrel.midi.codec import CodecConfig
    from musicrel.model.config import ModelConfig
    from training.module import MusicDataModule, MusicLM

    class Poison(L.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            if trainer.global_step == 2:  # callbacks run before the module's own hook
                next(pl_module.parameters()).grad.view(-1)[0] = float("nan")

    data = MusicDataModule(str(tiny_data), batch_size=2, seq_len=16, examples_per_epoch=8)
    cfg = ModelConfig(vocab_size=data.vocab_size, n_layers=1, d_model=16, n_heads=2, d_ff=32, max_seq_len=16)
    module = MusicLM(cfg, codec=CodecConfig().to_dict(), compile=False, warmup_steps=1, decay_steps=5)
    if not guarded:
        module.on_before_optimizer_step = lambda optimizer: None
    trainer = L.Trainer(
        accelerator="cpu", max_steps=5, callbacks=[Poison()], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(module, datamodule=data)
    finite = all(torch.isfinite(p).all() for p in module.parameters())
    assert trainer.global_step == 5
    assert finite is guarded
    if guarded:
        assert module.skipped_steps == 1


def test_default_precision_is_bf16_only_where_the_hardware_computes_in_it(monkeypatch):
    from training import module

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(module, "cpu_has_bf16", lambda: False)
    assert module.default_precision() == "32-true"  # emulated bfloat16: several times slower here
    monkeypatch.setattr(module, "cpu_has_bf16", lambda: True)
    assert module.default_precision() == "bf16-mixed"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert module.default_precision() == "32-true"  # the GPU's say, not the CPU's
    assert module.default_precision("cpu") == "bf16-mixed"  # a CPU run on a GPU machine: the CPU's


def test_cpu_recipes_leave_precision_to_the_hardware():
    import yaml

    recipes = sorted((REPO / "configs").glob("cpu-*.yaml"))
    assert recipes
    for path in recipes:
        trainer = yaml.safe_load(path.read_text()).get("trainer", {})
        assert "precision" not in trainer, f"{path.name} pins precision"


def test_bf16_asked_for_on_a_cpu_without_it_is_named(tiny_data, tmp_path, monkeypatch, capsys):
    from training import module

    monkeypatch.setattr(module, "cpu_has_bf16", lambda: False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    _train(tiny_data, tmp_path, "--trainer.max_steps", "1", "--trainer.precision", "bf16-mixed")
    err = capsys.readouterr().err
    assert "precision bf16-mixed on hardware without native bfloat16" in err
    capsys.readouterr()
    _train(tiny_data, tmp_path / "b", "--trainer.max_steps", "1")
    assert "without native bfloat16" not in capsys.readouterr().err
