"""The evaluation tests' world (a tiny random checkpoint, pieces to continue, a prepared folder for the
n-gram), which the continuation and sweep tests both run on, and `N`, a note in one call."""

from __future__ import annotations

import pretty_midi
import pytest
import torch

from musicrel.midi.codec import EventCodec
from musicrel.model.checkpoint import save_model
from musicrel.model.config import ModelConfig
from musicrel.model.transformer import MusicTransformer

CODEC = EventCodec()


@pytest.fixture(scope="module", autouse=True)
def one_blas_thread():
    """The classifier's logistic regressions and forests on a few dozen rows, with OpenBLAS's default of a
    thread per core: on a busy machine (make test's two workers on two cores) each small solve waits on a
    spinning second thread, 5x the CPU time of one thread. The torch threads are set in tests/conftest.py."""
    try:
        import sklearn.linear_model  # noqa: F401  (loads scipy's OpenBLAS: only loaded libraries are limited)
        from threadpoolctl import threadpool_limits  # scikit-learn's own dependency
    except ImportError:  # no scikit-learn: the tests that need it say so themselves
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def N(pitch, start, end, velocity=80):
    return pretty_midi.Note(velocity, pitch, start, end)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny random checkpoint; pieces that repeat a 3 s pattern (two long enough for the real-music row, one
    not, one too short to score, one unreadable); a prepared data folder of other pieces for the n-gram."""
    from training.prepare import prepare

    threads = torch.get_num_threads()
    torch.set_num_threads(
        1
    )  # a tiny model on a shared machine: thread hand-offs cost more than the arithmetic
    tmp = tmp_path_factory.mktemp("evaluation")
    torch.manual_seed(1)
    cfg = ModelConfig(
        vocab_size=CODEC.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=128
    )
    save_model(MusicTransformer(cfg), tmp / "ckpt", codec=CODEC)

    def write(path, k, seconds):
        pm = pretty_midi.PrettyMIDI()
        inst = pretty_midi.Instrument(program=0)
        inst.notes = [N(60 + (i * (k + 2)) % 12, 0.25 * i, 0.25 * i + 0.2) for i in range(int(seconds * 4))]
        pm.instruments.append(inst)
        pm.write(str(path))

    pieces = tmp / "pieces"
    pieces.mkdir()
    # motif 3 s + reference 2 s + 2 s of real music; the third lacks the real music, the fourth the reference
    for k, seconds in enumerate((9.0, 9.0, 6.0, 4.5)):
        write(pieces / f"p{k}.mid", k, seconds)
    (pieces / "short.mid").write_bytes(b"MThd\x00\x00\x00\x06")
    corpus = tmp / "corpus"
    corpus.mkdir()
    for k in range(6):
        write(corpus / f"c{k}.mid", k + 3, 12.0)
    prepare([corpus], tmp / "data", codec=CODEC, workers=1, progress=False)
    yield tmp
    torch.set_num_threads(threads)
