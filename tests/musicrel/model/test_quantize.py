"""Weight-only int8 decoding (musicrel.model.quantize): what is replaced, how close it stays to float32, that
the cached decode still matches a full forward, and how a checkpoint loads and refuses to be saved."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from musicrel.errors import CheckpointError, ConfigError
from musicrel.generation.decode import prefill
from musicrel.midi.codec import EventCodec
from musicrel.model import quantize
from musicrel.model.checkpoint import load_model, save_model
from musicrel.model.quantize import (
    DEQUANTIZE_ROWS,
    PROBE_ROUNDS,
    PROBE_STEPS,
    Int8Linear,
    faster_weights,
    held_weights,
    is_quantized,
    quantize_int8,
)
from musicrel.model.weights import DECODE_WEIGHTS, DEFAULT_DECODE_WEIGHTS, HELD_WEIGHTS
from tests.musicrel.model.conftest import make, tokens

# The kernel's shapes (KERNEL_IN_MULTIPLE): d_model and d_ff multiples of 64
SHAPE = dict(d_model=64, n_heads=4, d_ff=128)


def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    p, q = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)
    return float((p.exp() * (p - q)).sum(-1).mean())


def test_int8_linear_is_the_float_product_within_rounding():
    torch.manual_seed(0)
    linear = nn.Linear(128, 64)
    q = Int8Linear(linear)
    assert q.kernel and q.weight.dtype == torch.int8 and q.weight.shape == (64, 128)
    x = torch.randn(3, 5, 128)
    with torch.no_grad():
        want, got = linear(x), q(x)
    assert got.shape == want.shape == (3, 5, 64) and got.dtype == torch.float32
    # int8 weights (1/254 of each row's range) and bfloat16 activations: about 1 % of the output's scale
    assert (got - want).abs().max() < 0.02 * want.abs().max()
    assert not torch.equal(got, want)  # it is not the float32 layer under another name
    # the kernel computes the dequantized product
    assert torch.allclose(got - linear.bias, q.dequantized(x.reshape(-1, 128)).view(3, 5, 64), atol=1e-2)


def test_a_prefill_multiplies_the_same_weights_dequantized():
    torch.manual_seed(0)
    q = Int8Linear(nn.Linear(64, 32))
    x = torch.randn(DEQUANTIZE_ROWS, 64)  # a prefill's rows: float32's GEMM on the dequantized weights
    with torch.no_grad():
        long, short = q(x), q(x[:8])  # the first 8 rows again, through the int8 kernel
    assert not torch.equal(long[:8], short)  # two paths: bfloat16 activations in the kernel only
    assert (long[:8] - short).abs().max() < 0.02 * short.abs().max()


def test_a_shape_the_kernel_does_not_take_stays_float32():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(48, 64), nn.Linear(64, 64), nn.Linear(64, 40))
    quantize_int8(model)
    assert isinstance(model[0], nn.Linear)  # 48 inputs: not a multiple of 64
    assert isinstance(model[1], Int8Linear)
    assert isinstance(model[2], nn.Linear)  # 40 outputs: not a multiple of 16


@pytest.mark.parametrize("attention", ["skew", "t5"])
def test_quantized_model_stays_close_and_keeps_its_head_tied(attention):
    model = make(attention, **SHAPE)
    x = tokens(2, 40)
    with torch.inference_mode():
        want = model(x)
    n = model.num_parameters()
    quantize_int8(model)
    linears = [m for m in model.modules() if isinstance(m, Int8Linear)]
    assert len(linears) == 4 * model.cfg.n_layers  # qkv, proj and the two of the feed-forward block
    assert isinstance(model.head, nn.Linear) and model.head.weight is model.tok_emb.weight
    assert model.num_parameters() == n and is_quantized(model)
    with torch.inference_mode():
        got = model(x)
    assert _kl(want, got) < 1e-3
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.95


def test_quantized_cached_decoding_matches_its_full_forward():
    model = quantize_int8(make("skew", **SHAPE))
    x = tokens(2, 30)
    with torch.inference_mode():
        full = model(x)
        cache = model.new_cache(2, 30)
        steps = [prefill(model, x[:, :20], cache)]
        decode = model.decoder()
        steps += [decode(x[:, t], cache) for t in range(20, 30)]
    cached = torch.stack(steps, dim=1)  # (B, 11, vocab): positions 19..29
    assert torch.allclose(cached, full[:, 19:], atol=0.05)


def test_load_model_int8_and_the_refusals(tmp_path):
    codec = EventCodec()
    torch.manual_seed(0)
    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import MusicTransformer

    cfg = ModelConfig(vocab_size=codec.vocab_size, n_layers=1, max_seq_len=64, **SHAPE)
    save_model(MusicTransformer(cfg).eval(), tmp_path / "m", codec=codec)
    assert DECODE_WEIGHTS == ("auto", "int8", "float32") and HELD_WEIGHTS == ("int8", "float32")
    assert DEFAULT_DECODE_WEIGHTS == "int8"
    assert not is_quantized(load_model(tmp_path / "m"))  # float32 unless asked: training and NLL
    model = load_model(tmp_path / "m", weights="int8")
    assert is_quantized(model) and not model.training
    with pytest.raises(ConfigError) as err:
        load_model(tmp_path / "m", weights="int4")
    assert err.value.code == "invalid_weights"
    with pytest.raises(CheckpointError, match="int8"):
        save_model(model, tmp_path / "again", codec=codec)
    assert not (tmp_path / "again" / "config.json").exists()


def _model(**shape):
    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import MusicTransformer

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=EventCodec().vocab_size, n_layers=2, max_seq_len=64, **(shape or SHAPE))
    return MusicTransformer(cfg).eval()


@pytest.mark.parametrize("faster", ["int8", "float32"])
def test_auto_keeps_the_weights_that_decode_faster(monkeypatch, faster):
    """The probe times one-token steps both ways, alternating, and keeps the faster: int8 layers, or the
    model's own float32 ones (the very modules it had)."""
    model = _model()
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    timed = []

    def probe(m):
        held = held_weights(m)
        timed.append(held)
        return 0.001 if held == faster else 0.002

    monkeypatch.setattr(quantize, "_probe", probe)
    monkeypatch.setattr(quantize, "_VERDICTS", {})
    assert faster_weights(model) is model and held_weights(model) == faster
    assert timed == ["float32", "int8"] + ["float32", "int8"] * (PROBE_ROUNDS - 1)
    assert model.weights_probe == {"float32_step_ms": 1.0 if faster == "float32" else 2.0,
                                   "int8_step_ms": 1.0 if faster == "int8" else 2.0}  # fmt: skip
    if faster == "float32":
        assert all(model.get_submodule(name) is m for name, m in linears.items())
    # the same shape again in this process: the first verdict, no second probe
    again = _model()
    assert held_weights(faster_weights(again)) == faster and len(timed) == 2 * PROBE_ROUNDS


def test_auto_probe_is_a_few_real_steps_and_its_choice_decodes_as_that_weights(tmp_path):
    """A real probe: a bounded number of decoding steps (the model's own, `decoder`) over a cached context;
    the model it leaves decodes exactly as one loaded with the weights it chose."""
    codec = EventCodec()
    save_model(_model(), tmp_path / "m", codec=codec)
    quantize._VERDICTS.clear()
    calls = []
    model = load_model(tmp_path / "m")  # float32, to count the probe's steps below
    decoder = model.decoder

    def counted():
        decode = decoder()

        def step(token, cache):
            calls.append((tuple(token.shape), cache.length))
            return decode(token, cache)

        return step

    model.decoder = counted
    faster_weights(model)
    del model.decoder
    context = min(quantize.PROBE_CONTEXT, model.cfg.max_seq_len - 1)
    assert calls == [((1,), context)] * (2 * PROBE_ROUNDS * (PROBE_STEPS + 1))
    assert set(model.weights_probe) == {"int8_step_ms", "float32_step_ms"}
    held = held_weights(model)
    assert model.weights_probe[f"{held}_step_ms"] == min(model.weights_probe.values())
    auto, same = load_model(tmp_path / "m", weights="auto"), load_model(tmp_path / "m", weights=held)
    assert held_weights(auto) == held  # the process's verdict for this shape
    x = tokens(1, 12)
    with torch.inference_mode():
        assert torch.equal(auto(x), same(x))


def test_auto_has_nothing_to_choose_off_the_kernel_s_shapes():
    """A model whose layers the int8 kernel does not take stays float32 without a probe."""
    model = _model(d_model=32, n_heads=2, d_ff=96)  # no layer with a multiple of 64 inputs
    assert held_weights(faster_weights(model)) == "float32" and not hasattr(model, "weights_probe")


def test_on_a_gpu_int8_and_auto_hold_bfloat16_and_reports_say_so():
    """The GPU's rule (the int8 kernel is CPU-only): what each choice holds there, and what a model held in
    bfloat16 reports, checked on the CPU (the same `.to(dtype)` the GPU path makes)."""
    from musicrel.model.config import ModelConfig
    from musicrel.model.quantize import gpu_dtype
    from musicrel.model.transformer import MusicTransformer
    from musicrel.model.weights import GPU_WEIGHTS

    assert [gpu_dtype(w) for w in DECODE_WEIGHTS] == [torch.bfloat16, torch.bfloat16, torch.float32]
    model = MusicTransformer(ModelConfig(vocab_size=64, n_layers=1, max_seq_len=32, **SHAPE)).eval()
    assert held_weights(model) == "float32"
    model.to(gpu_dtype("int8"))
    assert held_weights(model) == GPU_WEIGHTS == "bfloat16"
    assert model.new_cache(2).k.dtype == torch.bfloat16  # the KV cache follows the weights
