"""Incremental decoding with the preallocated KV cache equals the full forward, for every scheme."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.musicrel.model.conftest import SCHEMES, VOCAB, make, tokens


def decode(model, x, sizes, left_pad=None, max_len=None):
    cache = model.new_cache(x.size(0), max_len or x.size(1), left_pad=left_pad)
    ptr = cache.k.data_ptr()
    outs, s = [], 0
    for n in sizes:
        outs.append(model(x[:, s : s + n], cache=cache))
        s += n
        assert cache.length == s
    assert cache.k.data_ptr() == ptr  # written in place, never reallocated
    return torch.cat(outs, dim=1), cache


@pytest.mark.parametrize("attention", SCHEMES)
@pytest.mark.parametrize("left_pad", [None, [0, 3, 11]])
def test_token_by_token_equals_full(attention, left_pad):
    model = make(attention)
    x = tokens(3, 14)  # longer than max_relative_distance + 1 = 10: clipping is exercised
    lp = None if left_pad is None else torch.tensor(left_pad)
    with torch.inference_mode():
        full = model(x, left_pad=lp)
        step, _ = decode(model, x, [1] * 14, left_pad=lp)
    torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attention", SCHEMES)
@pytest.mark.parametrize("left_pad", [None, [0, 3, 11]])
def test_the_decoder_steps_equal_full(attention, left_pad):
    """`decoder()`, the step generation calls (DecodeStep for skew: its own code path), after a prefill."""
    model = make(attention)
    x = tokens(3, 14)  # past max_relative_distance + 1 = 10 positions: the clipped distances are exercised
    lp = None if left_pad is None else torch.tensor(left_pad)
    decode = model.decoder()
    with torch.inference_mode():
        full = model(x, left_pad=lp)
        cache = model.new_cache(3, 14, left_pad=lp)
        steps = [model(x[:, :2], cache=cache)[:, -1]] + [decode(x[:, t], cache) for t in range(2, 14)]
        assert cache.length == 14
        with pytest.raises(ValueError, match="fit"):
            decode(x[:, 0], cache)  # the cache is full
    torch.testing.assert_close(torch.stack(steps, dim=1), full[:, 1:], rtol=1e-5, atol=1e-5)


def test_the_decoder_sees_weights_changed_in_place():
    """A decoder holds the model's tensors, not copies: a training step between two samplings is heard."""
    model = make("skew")
    decode = model.decoder()
    x = tokens(1, 6)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)  # as an optimizer's step would, in place
        cache = model.new_cache(1, 6)
        model(x[:, :5], cache=cache)
        torch.testing.assert_close(decode(x[:, 5], cache), model(x)[:, 5], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attention", SCHEMES)
@pytest.mark.parametrize("left_pad", [None, [5, 0]])
def test_prefill_then_uneven_chunks_equals_full(attention, left_pad):
    model = make(attention)
    x = tokens(2, 40)
    lp = None if left_pad is None else torch.tensor(left_pad)
    with torch.no_grad():
        full = model(x, left_pad=lp)
        chunks, _ = decode(model, x, [7, 1, 1, 12, 3, 1, 15], left_pad=lp, max_len=48)
    torch.testing.assert_close(chunks, full, rtol=1e-5, atol=1e-5)


@settings(max_examples=15, deadline=None)
@given(
    attention=st.sampled_from(SCHEMES),
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=5),
    pad=st.integers(0, 6),
    chunk=st.sampled_from([None, 2, 5]),
)
def test_any_chunking_equals_full(attention, sizes, pad, chunk):
    model = make(attention, query_chunk_size=chunk)
    T = sum(sizes)
    x = tokens(2, T, seed=T)
    lp = torch.tensor([0, min(pad, T - 1)])
    with torch.no_grad():
        full = model(x, left_pad=lp)
        chunks, _ = decode(model, x, sizes, left_pad=lp)
    torch.testing.assert_close(chunks, full, rtol=1e-5, atol=1e-5)


def test_reset_crop_and_select():
    model = make("skew")
    x = tokens(3, 20)
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache(3, 20)
        model(x[:, :12], cache=cache)
        cache.crop(8)  # forget positions 8..11, decode them again in one chunk
        torch.testing.assert_close(model(x[:, 8:14], cache=cache), full[:, 8:14], rtol=1e-5, atol=1e-5)
        kept = cache.select(torch.tensor([2, 0]))  # drop row 1, reorder
        assert kept.length == 14 and kept.batch_size == 2
        torch.testing.assert_close(model(x[[2, 0], 14:], cache=kept), full[[2, 0], 14:], rtol=1e-5, atol=1e-5)
        cache.reset()  # re-prefill the same buffers with another batch
        y = tokens(3, 20, seed=9)
        torch.testing.assert_close(model(y, cache=cache), model(y), rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match="crop"):
            cache.crop(21)


def test_left_pad_given_at_prefill_is_kept():
    model = make("t5")
    x = tokens(2, 12)
    lp = torch.tensor([4, 0])
    with torch.no_grad():
        full = model(x, left_pad=lp)
        cache = model.new_cache(2, 12)
        a = model(x[:, :10], cache=cache, left_pad=lp)
        b = model(x[:, 10:], cache=cache)  # left_pad remembered by the cache
    assert torch.equal(cache.left_pad, lp)
    torch.testing.assert_close(torch.cat([a, b], 1), full, rtol=1e-5, atol=1e-5)
    cache.reset([4, 0])  # a plain list is accepted too, as generation code may pass one
    with torch.no_grad():
        torch.testing.assert_close(model(x, cache=cache), full, rtol=1e-5, atol=1e-5)


def test_cache_limits():
    model = make("absolute")
    with pytest.raises(ValueError, match="max_len"):
        model.new_cache(1, 49)  # max_seq_len is 48
    cache = model.new_cache(2, 6)
    assert cache.k.shape == (2, 2, 4, 6, 8)  # (n_layers, B, H, max_len, D)
    with torch.no_grad():
        model(tokens(2, 5), cache=cache)
        with pytest.raises(ValueError, match="do not fit"):
            model(tokens(2, 2), cache=cache)
        with pytest.raises(ValueError, match="rows"):
            model(tokens(3, 1), cache=cache)
    assert cache.length == 5


def test_decode_logits_are_not_affected_by_stale_cache_entries():
    """Positions beyond cache.length hold leftovers from an earlier, longer run; they must be invisible."""
    model = make("shaw")
    x, y = tokens(1, 30, seed=5), tokens(1, 10, seed=6)
    with torch.no_grad():
        cache = model.new_cache(1, 30)
        model(x, cache=cache)
        cache.reset()
        out = torch.cat([model(y[:, i : i + 1], cache=cache) for i in range(10)], 1)
        torch.testing.assert_close(out, model(y), rtol=1e-5, atol=1e-5)
    assert out.size(-1) == VOCAB


@pytest.mark.parametrize("left_pad", [None, [0, 3, 11]])
def test_the_static_step_equals_the_cached_one(left_pad):
    """`decode_static` (the shapes a CUDA graph replays: the whole cache, `pos` a tensor) gives the logits
    `forward` gives one token at a time, K/V written at the same places, with clipping and left padding."""
    model = make("skew").eval()
    assert model.supports_static and not make("absolute").supports_static
    x = tokens(3, 14)
    lp = torch.tensor(left_pad) if left_pad is not None else torch.zeros(3, dtype=torch.long)
    with torch.inference_mode():
        step, cache = decode(model, x, [1] * 14, left_pad=lp, max_len=20)
        static = model.new_cache(3, 20, left_pad=lp)
        ptr = static.k.data_ptr()
        pos = torch.zeros(1, dtype=torch.long)
        outs = []
        for i in range(14):
            outs.append(model.decode_static(x[:, i], static, pos))
            pos += 1
    assert static.k.data_ptr() == ptr and static.length == 0  # the position is the caller's, not the cache's
    torch.testing.assert_close(torch.stack(outs, dim=1), step, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(static.k[:, :, :, :14], cache.k[:, :, :, :14])
    torch.testing.assert_close(static.v[:, :, :, :14], cache.v[:, :, :, :14])


def test_kv_bytes_per_row_is_the_cache_of_one_row_at_the_window():
    model = make("skew")
    cache = model.new_cache(1)
    assert model.kv_bytes_per_row() == cache.k.nbytes + cache.v.nbytes
    assert model.kv_bytes_per_row(torch.bfloat16) == (cache.k.nbytes + cache.v.nbytes) // 2
