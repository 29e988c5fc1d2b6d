"""Position terms of the four attention schemes, as pure tensor functions.

Conventions shared by every function here: a block of t queries sits at the END of T keys, i.e. query i
is at absolute position T - t + i (t == T for a full forward; t < T for a cached chunk or a query block of the
chunked path). Relative distance is query position minus key position; causal attention only needs
distances >= 0.

A relative table `E_r` has one row per distance, in the paper's order: row i is distance (rows - 1 - i), so
the LAST row is distance 0. Learned tables hold k + 1 rows (distances 0..k); `clipped_table` stretches them
to T rows, every distance beyond k reusing the row of k.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def clipped_table(E_r: Tensor, T: int) -> Tensor:
    """(..., k+1, D) table -> (..., T, D) with row i = distance T-1-i clipped to k. O(T·D)."""
    rows = E_r.size(-2)
    if rows >= T:
        return E_r[..., rows - T :, :]
    far = E_r[..., :1, :].expand(*E_r.shape[:-2], T - rows, E_r.size(-1))
    return torch.cat([far, E_r], dim=-2)


def skew(x: Tensor) -> Tensor:
    """(..., t, T + 1) contiguous, column c + 1 = distance T-1-c -> (..., t, T) view indexed by key position.

    The paper pads Q·E_rᵀ with a zero column, reshapes and slices; here the padding column is already part of
    x. Row i must shift left by t - 1 - i: in the flat t·(T+1) buffer, entry [i, j] sits at t + i·T + j, so
    dropping the first t entries and reading rows of T does exactly that (t == T: the paper's "drop the first
    row"). Column 0 of x only ever lands on future keys (j = query position + 1), so it may hold anything.
    """
    t, T = x.size(-2), x.size(-1) - 1
    lead = x.shape[:-2]
    return x.view(*lead, t * (T + 1))[..., t:].view(*lead, t, T)


def relative_logits_skew(q: Tensor, E_r: Tensor) -> Tensor:
    """S_rel by skewing (Huang et al. 2018): q (B, H, t, D), E_r (T, D) or (H, T, D) -> (B, H, t, T).

    S_rel[..., i, j] = q_i · E_r[row of distance (T - t + i) - j] for keys j <= T - t + i; entries for later
    keys are garbage (the caller masks them). Memory: one (B, H, t, T + 1) tensor, S_rel is a view into it.
    """
    # Prepending a zero row to E_r yields the padded product directly: the only L x L allocation is the
    # matmul output itself.
    E_pad = F.pad(E_r, (0, 0, 1, 0))  # (..., T + 1, D)
    return skew(q @ E_pad.transpose(-1, -2))  # (B, H, t, T + 1) -> (B, H, t, T)


def relative_logits_one(q: Tensor, E_rT: Tensor, T: int) -> Tensor:
    """S_rel of one query per row after T - 1 keys: q (B, H, D), E_rT (H, D, k + 1), E_r transposed (a
    view) -> (B, H, 1, T).

    Pad-and-skew is pointless for a single query: its relative logit for key j is q · E_r[distance T - 1 - j],
    i.e. q against the table's last T rows in order. So it is one (B, D) x (D, k + 1) product per head
    against E_r itself (never copied per row), and distances past k share one column (row k, E_r's first)."""
    B, H, _ = q.shape
    rows = E_rT.size(-1)
    E = E_rT.narrow(2, rows - T, T) if rows >= T else E_rT  # (H, D, min(T, k + 1))
    # Heads as the bmm batch and rows as its M: a broadcast q @ Eᵀ would copy E once per row.
    S_rel = torch.bmm(q.transpose(0, 1), E).transpose(0, 1).unsqueeze(2)  # (B, H, 1, <= T)
    if rows < T:
        S_rel = torch.cat([S_rel[..., :1].expand(B, H, 1, T - rows), S_rel], dim=-1)  # (B, H, 1, T)
    return S_rel


def relative_distances(t: int, T: int, device=None) -> Tensor:
    """(t, T) long: query position minus key position (t queries at the end of T keys); 0 for future keys."""
    i = torch.arange(T - t, T, device=device)[:, None]
    j = torch.arange(T, device=device)[None, :]
    return (i - j).clamp(min=0)


def relative_logits_naive(q: Tensor, E_r: Tensor) -> Tensor:
    """Same contract as relative_logits_skew, by an explicit gather of E_r by distance: Shaw et al.'s O(L²D)
    intermediate (t, T, D) per head. Reference for tests and the memory benchmark only."""
    t, T = q.size(-2), E_r.size(-2)
    rows = T - 1 - relative_distances(t, T, q.device)  # (t, T)
    E = E_r[..., rows, :]  # (t, T, D) or (H, t, T, D): the O(L²D) tensor
    return (E @ q.unsqueeze(-1)).squeeze(-1)  # (B, H, t, T, 1) -> (B, H, t, T); no second copy of E


def causal_allowed(t: int, T: int, left_pad: Tensor | None, device=None) -> Tensor:
    """Bool mask, True = may attend: (t, T), or (B, 1, t, T) with left padding.

    Keys at positions < left_pad[b] are hidden; every query still sees itself, so rows that are all padding
    (queries inside the padding, whose outputs nobody reads) stay finite instead of becoming NaN.
    """
    i = torch.arange(T - t, T, device=device)[:, None]
    j = torch.arange(T, device=device)[None, :]
    allowed = j <= i  # (t, T)
    if left_pad is None:
        return allowed
    real = j[None] >= left_pad.to(device)[:, None, None]  # (B, 1, T)
    return (allowed[None] & (real | (j == i)[None]))[:, None]  # (B, 1, t, T)


def t5_buckets(distance: Tensor, num_buckets: int, max_distance: int) -> Tensor:
    """Causal T5 buckets for distances >= 0: exact below num_buckets // 2, then log-spaced up to max_distance,
    every farther distance in the last bucket."""
    max_exact = num_buckets // 2
    log_ratio = torch.log(distance.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return torch.where(distance < max_exact, distance, large)


def sinusoidal_positions(n: int, d: int) -> Tensor:
    """(n, d) Vaswani et al. encodings: sin on even, cos on odd channels."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(n, d)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq[: d // 2])
    return table
