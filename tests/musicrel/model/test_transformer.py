"""MusicTransformer: config validation, causality, chunked == unchunked, left padding, every scheme."""

from __future__ import annotations

import pytest
import torch

from musicrel.errors import ConfigError
from musicrel.model.config import ModelConfig
from tests.musicrel.model.conftest import SCHEMES, VOCAB, make, tiny, tokens

# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    "field, value",
    [
        ("vocab_size", 0),
        ("n_layers", -1),
        ("d_model", 30),  # not divisible by n_heads=4
        ("n_heads", 0),
        ("d_ff", 2.5),
        ("max_seq_len", True),
        ("dropout", 1.0),
        ("dropout", "x"),
        ("attention", "rope"),
        ("max_relative_distance", 0),
        ("absolute_kind", "rotary"),
        ("t5_num_buckets", 1),
        ("t5_max_distance", 3),
        ("query_chunk_size", 0),
        ("tie_embeddings", "yes"),
    ],
)
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ConfigError) as info:
        ModelConfig(**{**tiny("skew").to_dict(), field: value})
    assert field in str(info.value)
    assert info.value.code == "invalid_config"


def test_config_round_trip_and_unknown_fields():
    cfg = tiny("t5", query_chunk_size=5, absolute_kind="sinusoidal", tie_embeddings=False)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="n_layer"):
        ModelConfig.from_dict({**cfg.to_dict(), "n_layer": 3})
    with pytest.raises(ConfigError, match="vocab_size"):
        ModelConfig.from_dict({"n_layers": 3})


def test_default_relative_distance_is_no_clipping():
    assert ModelConfig(vocab_size=10, max_seq_len=100).relative_distance == 99
    assert ModelConfig(vocab_size=10, max_relative_distance=7).relative_distance == 7


# ---------------------------------------------------------------- forward


@pytest.mark.parametrize("attention", SCHEMES)
def test_shapes_finite_and_backward(attention):
    model = make(attention)
    model.train()
    x = tokens(2, 20)
    logits = model(x)
    assert logits.shape == (2, 20, VOCAB)
    assert torch.isfinite(logits).all()
    logits.logsumexp(-1).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, missing  # every parameter (E_r, a^K, a^V, T5 bias, ...) is used and trainable


@pytest.mark.parametrize("attention", SCHEMES)
@pytest.mark.parametrize("j", [0, 7, 19])
def test_causality(attention, j):
    """Changing token j never changes logits at positions < j (and does change position j's successors)."""
    model = make(attention)
    x = tokens(1, 20)
    y = x.clone()
    y[0, j] = (y[0, j] + 1) % VOCAB
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :j], b[:, :j], rtol=0, atol=0)
    assert not torch.allclose(a[:, j:], b[:, j:])


@pytest.mark.parametrize("attention", SCHEMES)
@pytest.mark.parametrize("chunk", [1, 5, 16])
def test_query_chunked_equals_unchunked(attention, chunk):
    full, chunked = make(attention, query_chunk_size=None), make(attention, query_chunk_size=chunk)
    chunked.load_state_dict(full.state_dict())
    x = tokens(2, 37)
    lp = torch.tensor([0, 6])
    with torch.no_grad():
        torch.testing.assert_close(chunked(x), full(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(chunked(x, left_pad=lp), full(x, left_pad=lp), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attention", SCHEMES)
def test_left_padded_row_equals_row_alone(attention):
    model = make(attention)
    rows = [tokens(1, 30, seed=2)[0], tokens(1, 21, seed=3)[0], tokens(1, 9, seed=4)[0]]
    T = max(len(r) for r in rows)
    pad = torch.tensor([T - len(r) for r in rows])
    batch = torch.stack([torch.cat([torch.full((T - len(r),), 5), r]) for r in rows])
    with torch.no_grad():
        out = model(batch, left_pad=pad)
        assert torch.isfinite(out).all()  # queries inside the padding stay finite
        for b, r in enumerate(rows):
            torch.testing.assert_close(out[b, pad[b] :], model(r[None])[0], rtol=1e-5, atol=1e-5)


def test_padding_token_values_do_not_matter():
    model = make("skew")
    x = tokens(2, 16)
    lp = torch.tensor([4, 0])
    y = x.clone()
    y[0, :4] = 0
    with torch.no_grad():
        torch.testing.assert_close(model(x, left_pad=lp)[0, 4:], model(y, left_pad=lp)[0, 4:])


def test_clipping_makes_far_context_share_one_embedding():
    """With k = 2, skew logits depend on E_r rows only; a model whose E_r rows are equal beyond k is the same
    as one with a smaller k: compare max_relative_distance=2 against 30 with the far rows set to row k."""
    small = make("skew", max_relative_distance=2)
    big = make("skew", max_relative_distance=30)
    state = small.state_dict()
    for name, value in list(state.items()):
        if name.endswith("E_r"):  # (H, 3, D) -> (H, 31, D): the far 28 distances copy the row of distance 2
            state[name] = torch.cat([value[:, :1].expand(-1, 28, -1), value], dim=1)
    big.load_state_dict(state)
    x = tokens(2, 40)
    with torch.no_grad():
        torch.testing.assert_close(big(x), small(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["learned", "sinusoidal"])
def test_absolute_kinds(kind):
    model = make("absolute", absolute_kind=kind)
    names = {n for n, _ in model.named_parameters()}
    assert ("pos_emb.weight" in names) == (kind == "learned")
    assert "pos_table" not in model.state_dict()  # sinusoidal table is derived, not saved
    x = tokens(1, 12)
    with torch.no_grad():
        # positions matter: the same token at different positions gives different logits
        same = torch.full((1, 12), 3)
        out = model(same)
        assert not torch.allclose(out[0, 0], out[0, 5])
        assert model(x).shape == (1, 12, VOCAB)


def test_tied_embeddings_and_parameter_count():
    tied, untied = make("skew"), make("skew", tie_embeddings=False)
    assert tied.head.weight is tied.tok_emb.weight
    assert untied.num_parameters() - tied.num_parameters() == VOCAB * 32


def test_too_long_and_bad_shapes_raise():
    model = make("skew")
    with pytest.raises(ValueError, match="max_seq_len"):
        model(tokens(1, 49))
    with pytest.raises(ValueError, match="batch, time"):
        model(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="left_pad"):
        model(tokens(2, 5), left_pad=torch.tensor([1]))


def test_dropout_is_active_only_in_training():
    model = make("skew", dropout=0.5)
    x = tokens(1, 10)
    model.train()
    assert not torch.allclose(model(x), model(x))
    model.eval()
    torch.testing.assert_close(model(x), model(x))


def test_config_from_a_modules_hyper_parameters_new_and_old():
    """MusicLM keeps the config whole (`config`); checkpoints of older runs hold its fields among the
    others, and `musicrel export` reads both."""
    cfg = tiny("skew")
    assert ModelConfig.from_hparams({"config": cfg.to_dict(), "lr": 1e-3, "codec": {}}) == cfg
    assert ModelConfig.from_hparams({**cfg.to_dict(), "lr": 1e-3, "codec": {}}) == cfg
