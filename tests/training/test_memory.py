"""`musicrel fit-memory` (training.memory): the model's and the memory's probabilities of each token, the
fitted gate, and the command that writes it into a checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from musicrel.cli import main
from musicrel.midi.codec import EventCodec
from musicrel.model.checkpoint import load_model, save_model
from musicrel.model.config import FEATURES, ModelConfig
from musicrel.model.transformer import MusicTransformer
from training.memory import fit_gate, score, score_piece

CODEC = EventCodec()


def tiny(max_seq_len: int = 64) -> MusicTransformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=CODEC.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=max_seq_len
    )
    return MusicTransformer(cfg).eval()


def test_each_token_is_scored_from_half_a_window_and_the_memory_copies_a_loop():
    model = tiny()
    loop = np.array([60, 300, 188, 62, 300, 190, 64, 305, 192])
    tokens = np.concatenate([[CODEC.bos_id], np.tile(loop, 20)])  # 181 tokens: windows at 0, 32, 64, ...
    p_model, p_memory, features, matched = score_piece(model, tokens, window=model.cfg.max_seq_len - 1)
    assert len(p_model) == len(tokens) - 1 and features.shape == (len(tokens) - 1, len(FEATURES))
    with torch.inference_mode():
        # token 100 is scored in the window starting at 64 (the one where it has 36 tokens before it)
        logp = model(torch.from_numpy(tokens[64:127])[None]).log_softmax(-1)[0]
    assert p_model[99] == pytest.approx(float(logp[35, tokens[100]].exp()), rel=1e-5)
    # after the loop's first turn and a token, the memory knows what comes next, and only then
    assert not matched[0] and matched[len(loop) + 1 :].all()
    np.testing.assert_allclose(p_memory[len(loop) + 1 :], 1.0)


def test_the_fitted_gate_trusts_the_memory_on_repeated_music(tiny_data):
    model = tiny()
    scored = score(model, CODEC, tiny_data, "val", max_tokens=400)
    gate = fit_gate(scored)
    for s in scored.values():
        assert s.matched.mean() > 0.5
        # an untrained model knows nothing; the arpeggios repeat: the mixture is far better
        assert s.mixture_nll(gate) < s.model_nll - 2.0


def test_the_command_writes_the_gate_into_the_checkpoint(tiny_data, tmp_path, capsys):
    save_model(tiny(), tmp_path / "ck", codec=CODEC)
    rc = main(
        ["fit-memory", "--checkpoint", str(tmp_path / "ck"), "--data", str(tiny_data),
         "--max-tokens", "300", "--report-split", "val", "--write", "--quiet"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0 and "+memory" in out and "written to" in out
    memory = load_model(tmp_path / "ck").memory
    assert memory is not None and len(memory.gate) == len(FEATURES) + 1
    assert json.loads((tmp_path / "ck" / "config.json").read_text())["memory"]["features"] == list(FEATURES)
    assert main(["fit-memory", "--checkpoint", str(tmp_path / "ck"), "--data", str(tiny_data),
                 "--max-tokens", "1"]) == 2  # fmt: skip
    assert "max-tokens" in capsys.readouterr().err
