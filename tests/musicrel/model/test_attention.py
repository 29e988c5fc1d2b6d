"""The position terms against explicit references: skew == naive gather, clipping, T5 buckets, masks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from musicrel.model.attention import (
    causal_allowed,
    clipped_table,
    relative_distances,
    relative_logits_naive,
    relative_logits_skew,
    t5_buckets,
)


def _causal(t: int, T: int) -> torch.Tensor:
    return torch.arange(T)[None, :] <= torch.arange(T - t, T)[:, None]


@pytest.mark.parametrize("L", [1, 2, 3, 16, 33, 100])
@pytest.mark.parametrize("per_head", [False, True])
def test_skew_equals_naive_square(L, per_head):
    g = torch.Generator().manual_seed(L)
    q = torch.randn(2, 3, L, 8, generator=g)
    E_r = torch.randn(*((3,) if per_head else ()), L, 8, generator=g)
    skew, naive = relative_logits_skew(q, E_r), relative_logits_naive(q, E_r)
    assert skew.shape == naive.shape == (2, 3, L, L)
    mask = _causal(L, L)
    torch.testing.assert_close(skew[..., mask], naive[..., mask], rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(t=st.integers(1, 20), extra=st.integers(0, 20), per_head=st.booleans(), seed=st.integers(0, 2**16))
def test_skew_equals_naive_rectangular(t, extra, per_head, seed):
    """t queries at the end of T = t + extra keys (a cached chunk or a query block)."""
    T = t + extra
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, t, 4, generator=g)
    E_r = torch.randn(*((2,) if per_head else ()), T, 4, generator=g)
    skew, naive = relative_logits_skew(q, E_r), relative_logits_naive(q, E_r)
    mask = _causal(t, T)
    torch.testing.assert_close(skew[..., mask], naive[..., mask], rtol=1e-5, atol=1e-5)


def test_skew_matches_definition_elementwise():
    """S_rel[i, j] = q_i · E_r[row of distance i - j]; distance d is row L - 1 - d (last row = distance 0)."""
    L, D = 6, 5
    q, E_r = torch.randn(1, 1, L, D), torch.randn(L, D)
    S = relative_logits_skew(q, E_r)[0, 0]
    for i in range(L):
        for j in range(i + 1):
            assert S[i, j].item() == pytest.approx((q[0, 0, i] @ E_r[L - 1 - (i - j)]).item(), abs=1e-5)


@pytest.mark.parametrize("per_head", [False, True])
def test_clipping_beyond_max_relative_distance(per_head):
    """L > k + 1: every distance >= k uses the row of k, and skewing the clipped table is still exact."""
    k, L = 4, 23
    table = torch.randn(*((2,) if per_head else ()), k + 1, 8)
    E = clipped_table(table, L)
    assert E.shape[-2] == L
    for d in range(L):
        torch.testing.assert_close(E[..., L - 1 - d, :], table[..., k - min(d, k), :])
    q = torch.randn(2, 2, L, 8)
    mask = _causal(L, L)
    torch.testing.assert_close(
        relative_logits_skew(q, E)[..., mask], relative_logits_naive(q, E)[..., mask], rtol=1e-5, atol=1e-5
    )
    assert clipped_table(table, 3).shape[-2] == 3  # shorter than the table: the last (nearest) rows


def test_skew_gradients_match_naive():
    L = 12
    q = torch.randn(1, 2, L, 4, requires_grad=True)
    E_r = torch.randn(2, L, 4, requires_grad=True)
    mask = _causal(L, L)
    w = torch.randn(1, 2, int(mask.sum()))
    (relative_logits_skew(q, E_r)[..., mask] * w).sum().backward()
    gq, gE = q.grad.clone(), E_r.grad.clone()
    q.grad = E_r.grad = None
    (relative_logits_naive(q, E_r)[..., mask] * w).sum().backward()
    torch.testing.assert_close(gq, q.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gE, E_r.grad, rtol=1e-5, atol=1e-5)


def test_relative_distances():
    d = relative_distances(2, 5)
    assert d.tolist() == [[3, 2, 1, 0, 0], [4, 3, 2, 1, 0]]


def test_t5_buckets_exact_then_logarithmic():
    n, max_d = 32, 128
    dist = torch.arange(0, 1000)
    b = t5_buckets(dist, n, max_d)
    assert b[:16].tolist() == list(range(16))  # exact buckets for small distances
    assert (b.diff() >= 0).all()  # monotone
    assert b.max().item() == n - 1 and b.min().item() == 0
    assert (b[max_d:] == n - 1).all()  # everything beyond max_distance shares the last bucket
    assert (b[16:max_d] < n - 1).any()  # the log range is actually used


def test_causal_allowed_with_left_pad():
    allowed = causal_allowed(4, 4, torch.tensor([0, 2]))
    assert allowed.shape == (2, 1, 4, 4)
    assert torch.equal(allowed[0, 0], torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    # row 1: keys 0, 1 are padding; padded queries still see themselves (no all-masked row -> no NaN)
    assert allowed[1, 0].tolist() == [
        [True, False, False, False],
        [False, True, False, False],
        [False, False, True, False],
        [False, False, True, True],
    ]
