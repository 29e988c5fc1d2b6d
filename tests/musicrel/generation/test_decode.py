"""Decoding (generation.decode): the KV cache changes speed, never the tokens; `sample` keeps to top-k,
top-p and temperature."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from musicrel.generation.decode import flatten_block, generate, sample
from musicrel.generation.grammar import Grammar
from musicrel.generation.primer import prepare_primer
from musicrel.generation.row_random import AHEAD, RowRandom
from tests.musicrel.conftest import (
    CODEC,
    make_motif,
    tiny_model,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("max_seq_len", [128, 32])
def test_cached_generation_equals_full_recompute(max_seq_len):
    """The KV cache (and the sliding window past max_seq_len) changes speed, never the tokens."""
    m = tiny_model(max_seq_len)
    primer = np.asarray(prepare_primer(CODEC, make_motif(), 2.0, max_tokens=max_seq_len - 8).tokens)
    prompt = torch.as_tensor(primer)[None].repeat(3, 1)

    def run(use_cache: bool) -> tuple[torch.Tensor, torch.Tensor]:
        grammar = Grammar(CODEC, [primer] * 3, [10_000] * 3)
        gens = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
        it = generate(
            m, prompt, 100, temperature=torch.tensor([1.0, 0.7, 1.3]), top_k=torch.tensor([391, 20, 391]),
            top_p=torch.tensor([0.9, 1.0, 0.8]), generators=gens, grammar=grammar, use_cache=use_cache,
        )  # fmt: skip
        all_rows = [next(it) for _ in range(60)]
        # Row 1 is done: drop it; rows 0 and 2 go on with their own generators and state.
        rest = [it.send(torch.tensor([True, False, True]))] + list(it)
        return torch.stack(all_rows, dim=1), torch.stack(rest, dim=1)

    (cached, cached_rest), (full, full_rest) = run(True), run(False)
    assert cached.shape == (3, 60) and cached_rest.shape == (2, 40)
    torch.testing.assert_close(cached, full, rtol=0, atol=0)
    torch.testing.assert_close(cached_rest, full_rest, rtol=0, atol=0)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    top_k=st.integers(1, 20),
    top_p=st.floats(0.01, 1.0),
    temperature=st.floats(0.05, 3.0),
)
def test_sample_respects_top_k_and_top_p(seed, top_k, top_p, temperature):
    torch.manual_seed(seed)
    logits = torch.randn(4, 50) * 3
    logits[1, 10:] = float("-inf")  # masked tokens are never drawn
    gens = [torch.Generator().manual_seed(seed + i) for i in range(4)]
    k = torch.full((4,), top_k)
    tokens = sample(logits, torch.full((4,), temperature), k, torch.full((4,), top_p), gens)
    probs = (logits / temperature).softmax(-1)
    for row, tok in enumerate(tokens.tolist()):
        order = probs[row].argsort(descending=True).tolist()
        assert order.index(tok) < top_k
        mass_before = probs[row][order[: order.index(tok)]].sum().item()
        assert mass_before < top_p + 1e-5
        assert torch.isfinite(logits[row, tok])
    greedy = sample(logits, torch.ones(4), torch.ones(4, dtype=torch.long), torch.ones(4), gens)
    assert greedy.tolist() == logits.argmax(-1).tolist()


@pytest.mark.parametrize(
    ("temperature", "top_p"), [(5e-324, 0.95), (1e-45, 0.95), (1e-38, 0.95), (1e-7, 0.95), (1.0, 1e-46)]
)
def test_a_vanishing_temperature_or_top_p_samples_greedily(temperature, top_p):
    """Any positive temperature and top_p are valid input; under float32's range they used to turn the
    logits into inf/NaN or keep no token, and the sampler's index into -1 (a RuntimeError for the whole
    batch)."""
    torch.manual_seed(0)
    logits = torch.randn(3, 50) * 40
    logits[2, 5:] = float("-inf")
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    k, p = torch.full((3,), 50), torch.full((3,), top_p)
    tokens = sample(logits, torch.full((3,), temperature), k, p, gens)  # float32, as the batch holds it
    assert tokens.tolist() == logits.argmax(-1).tolist()


def test_a_shift_temperature_reshapes_the_time_shifts_alone():
    """Within the time shifts a temperature flattens (> 1) or sharpens (< 1) their shape and leaves their
    mass, and every other token's probability, as they were; 1 draws exactly the tokens it drew without it."""
    torch.manual_seed(0)
    shifts = slice(CODEC.time_shift_offset, CODEC.velocity_offset)
    logits = torch.randn(3, CODEC.vocab_size) * 3
    logits[2, shifts] = float("-inf")  # a row whose shifts the grammar masked: left as it is
    t = torch.tensor([1.5, 0.5, 2.0])
    before, after = logits.softmax(-1), flatten_block(logits, shifts, t).softmax(-1)
    assert torch.allclose(before[:, shifts].sum(-1), after[:, shifts].sum(-1), atol=1e-5)
    outside = torch.ones(CODEC.vocab_size, dtype=torch.bool)
    outside[shifts] = False
    assert torch.allclose(before[:, outside], after[:, outside], atol=1e-6)
    entropy = lambda p: -(p * p.clamp_min(1e-30).log()).sum(-1)  # noqa: E731
    within_before = before[:2, shifts] / before[:2, shifts].sum(-1, keepdim=True)
    within_after = after[:2, shifts] / after[:2, shifts].sum(-1, keepdim=True)
    assert entropy(within_after)[0] > entropy(within_before)[0]  # flatter
    assert entropy(within_after)[1] < entropy(within_before)[1]  # sharper
    assert torch.equal(after[2], before[2])
    # 1 is no reshaping at all: the same draws, generator for generator
    ones = torch.ones(3)
    k, p = torch.full((3,), CODEC.vocab_size), torch.ones(3)
    plain = sample(logits, ones, k, p, [torch.Generator().manual_seed(i) for i in range(3)])
    same = sample(logits, ones, k, p, [torch.Generator().manual_seed(i) for i in range(3)], ones, shifts)
    assert torch.equal(plain, same)


def test_row_streams_depend_on_their_own_seed_alone():
    """A row's draws are a function of its seed and how many it has drawn: the same alone, in any batch,
    after rows leave (`select`) or join (`extend`); seeds give different streams."""
    alone = RowRandom([5])
    expected = torch.stack([alone.uniform() for _ in range(50)], dim=1)[0]  # (50,)
    batch = RowRandom([9, 5, 2**62 + 3])
    first = torch.stack([batch.uniform() for _ in range(20)], dim=1)
    assert torch.equal(first[1], expected[:20])
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[2], first[1])
    batch.select(torch.tensor([1]))
    batch.extend(RowRandom([7]))  # a row joins mid-stream
    rest = torch.stack([batch.uniform() for _ in range(30)], dim=1)
    assert torch.equal(rest[0], expected[20:])
    late = RowRandom([7])
    assert torch.equal(rest[1], torch.stack([late.uniform() for _ in range(30)], dim=1)[0])


def test_draws_made_ahead_are_the_streams_own():
    """`ahead()` (the eager step's: AHEAD draws made at once) gives each row the numbers `uniform()` gives,
    across its blocks' ends, rows leaving and joining mid-block, and `uniform()` after it (a static step
    after eager ones) going on where it stopped."""
    plain, blocked = RowRandom([3, 5, 2**40 + 1]), RowRandom([3, 5, 2**40 + 1])
    for n in (AHEAD + 7, 2 * AHEAD + 1):  # past a block's end and mid-block when rows change
        expected = torch.stack([plain.uniform() for _ in range(n)], dim=1)
        assert torch.equal(torch.stack([blocked.ahead() for _ in range(n)], dim=1), expected)
        for random in (plain, blocked):
            random.select(torch.tensor([2, 0]))
            random.extend(RowRandom([11]))
    assert torch.equal(
        torch.stack([blocked.ahead() for _ in range(5)], dim=1),
        torch.stack([plain.uniform() for _ in range(5)], dim=1),
    )
    assert torch.equal(blocked.uniform(), plain.uniform())


def test_row_streams_are_uniform():
    """Draws lie in [0, 1) and fill it evenly (16 bins, 4,096 rows x 16 draws: a chi-square far inside
    what a uniform source gives), with no correlation between a row's consecutive draws or between rows of
    consecutive seeds."""
    random = RowRandom(range(4096))
    u = torch.stack([random.uniform() for _ in range(16)], dim=1)  # (rows, draws)
    assert u.dtype == torch.float32 and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    counts = torch.bincount((u * 16).long().flatten(), minlength=16).double()
    expected = u.numel() / 16
    assert float(((counts - expected) ** 2 / expected).sum()) < 60  # 15 dof: p < 1e-6 above 60
    x = u - 0.5
    assert abs(float((x[:, 1:] * x[:, :-1]).mean()) / float((x * x).mean())) < 0.03
    assert abs(float((x[1:] * x[:-1]).mean()) / float((x * x).mean())) < 0.03


def test_the_sampler_draws_a_row_s_token_whatever_the_batch():
    """A row's token depends on its logits, settings and stream only: top-k/top-p on another row (the
    sorting path) or a shift temperature on another row leaves it as it was alone."""
    torch.manual_seed(3)
    shifts = slice(CODEC.time_shift_offset, CODEC.velocity_offset)
    V = CODEC.vocab_size
    logits = torch.randn(3, V) * 2
    logits[:, :5] = float("-inf")
    settings = dict(
        temperature=torch.tensor([1.0, 0.8, 1.2]), top_k=torch.tensor([V, 20, V]),
        top_p=torch.tensor([1.0, 1.0, 0.9]), shift_temperature=torch.tensor([1.0, 1.0, 0.5]),
    )  # fmt: skip
    for _ in range(20):
        batch = RowRandom([11, 12, 13])
        together = sample(
            logits, settings["temperature"], settings["top_k"], settings["top_p"], batch,
            settings["shift_temperature"], shifts,
        )  # fmt: skip
        for r, seed in enumerate([11, 12, 13]):
            alone = sample(
                logits[r : r + 1], *(settings[k][r : r + 1] for k in ("temperature", "top_k", "top_p")),
                RowRandom([seed]), settings["shift_temperature"][r : r + 1], shifts,
            )  # fmt: skip
            assert alone.item() == together[r].item()
        logits = logits.roll(7, dims=1)
