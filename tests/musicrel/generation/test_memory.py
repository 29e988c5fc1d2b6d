"""The copy memory (generation.memory): its match lengths against a brute-force count, the mixture it makes,
rows joining and leaving, a checkpoint carrying its gate, and a row decoding the same alone or batched."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from musicrel.errors import CheckpointError
from musicrel.generation.decode_batch import generate_batch
from musicrel.generation.memory import CopyMemory, suffix_matches
from musicrel.generation.primer import prepare_primer
from musicrel.generation.sampling import SamplingParams
from musicrel.model.checkpoint import load_model, save_model
from musicrel.model.config import FEATURES, MAX_MATCH, MemoryConfig
from tests.musicrel.conftest import CODEC, make_motif, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

OFF = MemoryConfig(gate=(0.0,) * (len(FEATURES) + 1))
# trusts a long match almost wholly: sigmoid(-4 + 3 log 32) = 0.9999
TRUSTING = MemoryConfig(gate=(-4.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0))


def brute(history: np.ndarray, window: int) -> np.ndarray:
    """Each window column's common-suffix length with the whole history, counted one token at a time."""
    end = len(history) - 1
    out = np.zeros(window + 1, dtype=np.int64)
    for c in range(window):
        i = end - (window - c)
        k = 0
        while i >= 0 and k < MAX_MATCH and i - k >= 0 and history[i - k] == history[end - k]:
            k += 1
        out[c] = k
    return out


@pytest.mark.parametrize("seed", range(6))
def test_match_lengths_follow_the_history_token_by_token(seed):
    rng = np.random.default_rng(seed)
    window = 20
    # three symbols make long matches common; histories shorter and longer than the window
    history = rng.integers(0, 3, 90)
    primer = int(rng.integers(1, window))
    memory = CopyMemory(OFF, [history[:primer]], window)
    np.testing.assert_array_equal(memory.match[0].numpy(), brute(history[:primer], window))
    longest = 0
    for n in range(primer, len(history)):
        memory.advance(torch.tensor([history[n]]))
        np.testing.assert_array_equal(memory.match[0].numpy(), brute(history[: n + 1], window))
        longest = max(longest, int(memory.match.max()))
    assert longest >= 4  # matches longer than a token or two were checked


def test_a_fresh_memory_reads_the_matches_within_its_window():
    tokens = torch.tensor([[-1, -1, 5, 6, 7, 5, 6, 7, 5, 6]])
    # the row ends "5 6 7 5 6": column 6 matches all five, column 3 "5 6" (the history starts before its 7)
    np.testing.assert_array_equal(suffix_matches(tokens)[0].numpy(), [0, 0, 0, 2, 0, 0, 5, 0, 0, 0])


def test_without_a_match_the_model_is_left_alone():
    logits = torch.randn(2, CODEC.vocab_size)
    memory = CopyMemory(TRUSTING, [np.array([1, 2, 3]), np.array([4, 4, 9])], 16)
    mixed = memory.mix(logits)
    # row 0's latest token (3) never came before: the model's distribution as it was
    torch.testing.assert_close(mixed[0], logits[0].log_softmax(-1))
    # row 1's latest (9) neither; "4 4" matched once, but only a match ending at the row's end counts
    torch.testing.assert_close(mixed[1], logits[1].log_softmax(-1))


def test_a_long_match_votes_for_what_followed_it():
    pattern = [10, 300, 40, 310, 11, 305]
    history = np.array(pattern * 8 + pattern[:3])  # ends inside the pattern: next comes 310
    logits = torch.zeros(1, CODEC.vocab_size)
    trusting = CopyMemory(TRUSTING, [history], 64).mix(logits).exp()[0]
    assert float(trusting.sum()) == pytest.approx(1.0, abs=1e-5)
    assert float(trusting[310]) > 0.99
    # a gate that trusts it half (sigmoid(0) = 0.5) gives the vote half the mass
    half = CopyMemory(OFF, [history], 64).mix(logits).exp()[0]
    assert float(half[310]) == pytest.approx(0.5 + 0.5 / CODEC.vocab_size, rel=1e-4)
    # past the window the pattern is forgotten: a window of 2 holds no earlier match
    far = CopyMemory(TRUSTING, [history], 2).mix(logits).exp()[0]
    assert float(far[310]) == pytest.approx(1 / CODEC.vocab_size, rel=1e-4)


def test_rows_leave_and_join_with_their_windows():
    a, b, c = np.array([1, 2, 1, 2]), np.array([7, 8, 9]), np.array([3, 3, 3])
    memory = CopyMemory(OFF, [a, b], 8)
    memory.extend(CopyMemory(OFF, [c], 8))
    memory.select(torch.tensor([2, 0]))
    alone = [CopyMemory(OFF, [h], 8) for h in (c, a)]
    for r, one in enumerate(alone):
        torch.testing.assert_close(memory.tokens[r], one.tokens[0])
        torch.testing.assert_close(memory.match[r], one.match[0])


def test_a_checkpoint_carries_its_gate(tmp_path):
    model = tiny_model()
    model.memory = TRUSTING
    save_model(model, tmp_path / "ck", codec=CODEC)
    assert load_model(tmp_path / "ck").memory == TRUSTING
    model.memory = None
    save_model(model, tmp_path / "plain", codec=CODEC)
    assert load_model(tmp_path / "plain").memory is None
    config = json.loads((tmp_path / "ck" / "config.json").read_text())
    config["memory"]["gate"] = [1.0, 2.0]
    (tmp_path / "ck" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="memory gate"):
        load_model(tmp_path / "ck")


def test_a_row_with_memory_decodes_the_same_alone_or_batched():
    model = tiny_model()
    model.memory = TRUSTING
    primer = prepare_primer(CODEC, make_motif(24), 10.0)
    other = prepare_primer(CODEC, make_motif(8, tempo=130.0), 10.0)
    params = SamplingParams(seconds=2.0, seed=5)
    alone = generate_batch(model, CODEC, [(primer, params)])[0].tokens[0]
    batched = generate_batch(model, CODEC, [(other, SamplingParams(seconds=1.0, seed=1)), (primer, params)])
    np.testing.assert_array_equal(batched[1].tokens[0], alone)
    model.memory = None
    plain = generate_batch(model, CODEC, [(primer, params)])[0].tokens[0]
    assert not np.array_equal(plain, alone)  # the memory changed what was drawn
