"""`musicrel bench shapes` on tiny shapes: a row per shape, and numbers that agree with each other and with
the model's own cache (speed itself is never asserted in tests)."""

from __future__ import annotations

import pytest

from musicrel.bench.generate import EVENTS_PER_SECOND_OF_MUSIC
from musicrel.bench.models import random_checkpoint
from musicrel.bench.shapes import (
    CONFIG_DIR,
    MEMORY_TOKENS,
    ShapeResult,
    build,
    config_shape,
    measure,
    motif_primer,
    verdict,
)
from musicrel.cli import main

TOKENS = 8

# A tiny stand-in for configs/: the shape's file overrides gpu.yaml's context, as gpu-default.yaml does.
GPU = "model:\n  config:\n    max_seq_len: 512\n    attention: skew\n    dropout: 0.1\n"
TINY = """model:
  config:
    n_layers: 2
    d_model: 64
    n_heads: 2
    d_ff: 128
    max_seq_len: 256
"""


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("configs")
    (folder / "gpu.yaml").write_text(GPU)
    (folder / "gpu-default.yaml").write_text(TINY)
    return folder


@pytest.fixture(scope="module")
def result(configs) -> ShapeResult:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        (out,) = measure([config_shape("default", configs)], tokens=TOKENS, repeats=2)
    finally:
        torch.set_num_threads(threads)
    return out


def test_the_shape_is_the_yaml_layered():
    default, big = config_shape("default"), config_shape("20m")  # the repository's configs
    assert default.config["max_seq_len"] == 512  # gpu-default.yaml's own context wins over gpu.yaml's
    assert big.config["max_seq_len"] == 1024 and big.config["attention"] == "skew"  # gpu.yaml's
    assert big.config["n_layers"] == 6 and big.config["d_model"] == 512  # gpu-20m.yaml's
    assert (CONFIG_DIR / "gpu-20m.yaml").is_file()


def test_events_and_rates_agree(result):
    assert (result.layers, result.d_model, result.context) == (2, 64, 256)
    assert result.events == {1: TOKENS, 8: 8 * TOKENS}  # every row decoded --tokens tokens, all counted
    assert result.rtf[1] > 0 and result.rtf[8] > 0
    assert 0 < result.primer_events <= 192  # 3/4 of the window at most, as the service takes
    assert result.first_note_s is not None and result.first_note_s > 0
    assert 1 <= result.first_note_tokens <= TOKENS
    # a batch-1 step: its model part is inside it, and both are real times; so without controls
    assert 0 < result.model_s < result.step_s < 1.0
    assert 0 < result.plain_model_s < result.plain_step_s < 1.0


def test_the_split_times_the_decoding_steps_inside_the_steps(configs):
    """step_split's model time is the model's decoding step (`decoder`) of each step (prefills, of many
    tokens, are not counted); the rest, the grammar and sampler, is what is left of the same steps."""
    import time

    from musicrel.bench.shapes import step_split

    model, codec = build(config_shape("default", configs))
    calls = []
    forward, decoder = model.forward, model.decoder

    def counted(tokens, *args, **kwargs):
        calls.append(tokens.size(1))
        return forward(tokens, *args, **kwargs)

    def sleepy():  # every decoding step made 20 ms longer
        decode = decoder()

        def step(tokens, cache):
            calls.append("step")
            time.sleep(0.02)
            return decode(tokens, cache)

        return step

    model.forward, model.decoder = counted, sleepy
    try:
        step_s, model_s = step_split(model, codec, motif_primer(codec, 32), 3)
    finally:
        del model.forward, model.decoder
    assert calls.count("step") == 4 and len(calls) == 5  # one prefill, a warm-up step and the 3 timed
    assert calls[0] > 1  # the prefill, through forward
    assert model_s >= 0.02 and step_s > model_s


def test_the_split_without_controls_asks_for_none(configs, monkeypatch):
    """The split's second row is a request without controls: the grammar its batch builds steers nothing
    (the first row's has every control on)."""
    from musicrel.bench import shapes
    from musicrel.generation.grammar import Grammar

    model, codec = build(config_shape("default", configs))
    steered = []
    init = Grammar.__init__

    def recorded(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if len(self.controlled):  # the batch's own grammar starts empty; the job's joins it
            steered.append(self.any_control)

    monkeypatch.setattr(Grammar, "__init__", recorded)
    for controls in (True, False):
        shapes.step_split(model, codec, motif_primer(codec, 32), 2, controls)
    assert steered == [True, False]


def test_memory_agrees_with_the_model_and_its_cache(result, configs):
    assert result.weights_bytes == 4 * result.params  # float32; this scheme has no buffers
    for rows in (1, 8):  # keys and values, per layer, row, position and model dimension, float32
        assert result.kv_bytes[rows] == 2 * result.layers * rows * result.context * result.d_model * 4
    assert all(result.peak_rss_bytes[rows] >= 0 for rows in (1, 8))
    # The memory job really decodes into the whole window: its peak holds the full cache of 8 rows.
    assert result.peak_rss_bytes[8] >= result.kv_bytes[8]
    assert result.memory_primer_events > result.context // 2


def test_the_service_batch_holds_the_reported_cache_once_its_window_is_full(result, configs):
    """What the bench reports as the KV cache is what a DecodeBatch allocates, and the memory job's
    MEMORY_TOKENS tokens after a 3/4-window primer grow it to the whole window."""
    from musicrel.generation.decode_batch import DecodeBatch
    from musicrel.generation.primer import default_max_primer_tokens
    from musicrel.generation.sampling import SamplingParams

    model, codec = build(config_shape("default", configs))
    batch = DecodeBatch(model, codec, max_rows=8)
    primer = motif_primer(codec, default_max_primer_tokens(model))
    batch.admit(
        [(primer, SamplingParams(seconds=100.0, max_new_tokens=MEMORY_TOKENS, seed=0, num_samples=8))]
    )
    assert batch._cache.max_len < model.cfg.max_seq_len  # the primer's length, as in the memory job
    while batch.rows:
        batch.step()
    assert batch._cache.max_len == model.cfg.max_seq_len
    assert batch._cache.k.nbytes + batch._cache.v.nbytes == result.kv_bytes[8]


def test_the_verdict_is_the_largest_shape_at_4x():
    def shape(name, params, rtf1):
        return ShapeResult(
            name, "int8", 1, 8, params, 128, 10, {1: 1, 8: 8}, {1: rtf1, 8: 8 * rtf1}, 0.1, 1, 4 * params
        )

    small, mid, big = shape("small", 10, 9.0), shape("mid", 20, 4.0), shape("big", 30, 3.9)
    assert verdict([big, small, mid]) is mid
    assert verdict([big]) is None


def test_bench_shapes_prints_a_row_per_shape_and_the_verdict(configs, tmp_path, capsys):
    ckpt = random_checkpoint(tmp_path / "ckpt", n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=64)
    # no --weights: both ways, side by side
    argv = ["bench", "shapes", "--configs", str(configs), "--shape", "default", "--checkpoint", str(ckpt),
            "--tokens", str(TOKENS), "--repeats", "1", "--threads", "1"]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    header = [c.strip() for c in lines[1].split("|")]
    assert header == ["shape", "weights", "params", "context", "RTF b1", "RTF b8", "first note ms",
                      "weights MiB", "KV MiB b1/b8", "peak RSS MiB b1/b8"]  # fmt: skip
    rows = [[c.strip() for c in line.split("|")] for line in lines[3:7]]  # each model both ways
    names = ["default (2x64)", "default (2x64)", f"{ckpt} (1x32)", f"{ckpt} (1x32)"]
    assert [(r[0], r[1]) for r in rows] == list(zip(names, ["int8", "float32"] * 2, strict=True))
    assert [r[3] for r in rows] == ["256", "256", "64", "64"]
    for r in rows:
        rtf1, rtf8 = float(r[4].rstrip("x")), float(r[5].rstrip("x"))
        assert rtf1 > 0 and rtf8 > 0 and float(r[2].split()[0]) > 0 and float(r[6].split()[0]) > 0
        assert all(float(x) >= 0 for col in (7, 8, 9) for x in r[col].split("/"))  # MiB, rounded
    # int8 holds the 2x64 model's linear layers in a quarter of the bytes; the 1x32 one's stay float32
    # (rows of 32 inputs are not a shape the kernel takes)
    assert float(rows[0][7]) < float(rows[1][7]) and rows[2][7] == rows[3][7]
    ratio = [line for line in lines if line.startswith("int8 / float32, default:")]
    assert len(ratio) == 1 and "RTF b1" in ratio[0] and "the bytes" in ratio[0]
    assert any(f"/ {EVENTS_PER_SECOND_OF_MUSIC:g}" in line for line in lines)
    # the batch-1 step's split: a row per model and weights, the rest what the model leaves of the step
    start = next(i for i, line in enumerate(lines) if line.startswith("batch-1 step"))
    # and with every control on and with none
    split = [[c.strip() for c in line.split("|")] for line in lines[start + 2 : start + 10]]
    both = [(n, w, c) for n, w in zip(names, ["int8", "float32"] * 2, strict=True) for c in ("every", "none")]
    assert [tuple(r[:3]) for r in split] == both
    for r in split:
        step, model, rest = float(r[3]), float(r[4]), float(r[5])
        assert step > 0 and model > 0 and rest == pytest.approx(step - model, abs=0.011)
        assert 0 <= float(r[6].rstrip(" %")) <= 100
        assert float(r[7].rstrip("x")) == pytest.approx(1e3 / (step * EVENTS_PER_SECOND_OF_MUSIC), rel=0.05)
    assert lines[-1].startswith("serve: ")


def test_a_missing_config_is_an_error(tmp_path, capsys):
    assert main(["bench", "shapes", "--configs", str(tmp_path), "--shape", "8m"]) == 2
    assert "config_missing" in capsys.readouterr().err
