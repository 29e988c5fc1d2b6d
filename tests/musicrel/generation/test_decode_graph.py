"""The decode step at fixed shapes (`decode_graph`, DecodeBatch's "static" and "graph" modes) where no GPU
is: the same tokens as the CPU's eager step for the same seeds, with jobs joining, leaving and sliding, the
controls on; padding rows that never change a live row's tokens; the buckets, the memory rule, the modes."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import numpy as np
import pytest
import torch

from musicrel.bench.generate import every_control
from musicrel.errors import GenerationError
from musicrel.generation import decode_graph
from musicrel.generation.decode_batch import DecodeBatch
from musicrel.generation.decode_graph import bucket, resolve_mode, rows_that_fit, slots
from musicrel.generation.primer import prepare_primer
from musicrel.generation.sampling import SamplingParams
from musicrel.model.transformer import MusicTransformer
from tests.musicrel.conftest import CODEC, make_motif, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_buckets_are_powers_of_two_up_to_the_batch():
    assert [bucket(n, 1024) for n in (1, 2, 3, 4, 5, 8, 9, 600, 1024)] == [1, 2, 4, 4, 8, 8, 16, 1024, 1024]
    assert bucket(5, 6) == 6 and bucket(6, 6) == 6 and bucket(1, 1) == 1
    with pytest.raises(ValueError):
        bucket(0, 8)


def test_rows_that_fit_the_memory_rule():
    model = tiny_model()
    per_row = model.kv_bytes_per_row()  # 2 x 1 layer x 32 x 128 positions x 4 bytes
    assert per_row == 2 * 1 * 32 * 128 * 4
    assert rows_that_fit(model, 16, free_bytes=100 * per_row) == 16
    assert rows_that_fit(model, 1024, free_bytes=100 * per_row) == 50  # half the free memory
    assert rows_that_fit(model, 1024, free_bytes=100 * per_row, share=0.25) == 25
    assert rows_that_fit(model, 8, free_bytes=0) == 1  # one row, whatever: the batch must take a job


def test_modes_resolve_by_device_and_model(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    skew = tiny_model()
    absolute = MusicTransformer(replace(skew.cfg, attention="absolute"))
    assert resolve_mode("auto", skew, cpu) == "eager"  # the CPU's step is unchanged
    assert resolve_mode("auto", skew, cuda) == "graph"
    assert resolve_mode("graph", skew, cpu) == "static"  # nothing to capture on a CPU
    assert resolve_mode("static", skew, cpu) == "static"
    assert resolve_mode("auto", absolute, cuda) == resolve_mode("static", absolute, cpu) == "eager"
    with pytest.raises(ValueError):
        resolve_mode("fast", skew, cpu)
    monkeypatch.setenv(decode_graph.STEP_MODE_ENV, "eager")  # what "auto" means in this process
    assert resolve_mode("auto", skew, cuda) == "eager" and resolve_mode("static", skew, cpu) == "static"
    monkeypatch.setenv(decode_graph.STEP_MODE_ENV, "fast")
    with pytest.raises(ValueError):
        resolve_mode("auto", skew, cpu)
    monkeypatch.delenv(decode_graph.STEP_MODE_ENV)
    with pytest.raises(GenerationError) as info:
        DecodeBatch(skew, CODEC, 2, step_mode="fast")
    assert info.value.code == "invalid_params"
    static = DecodeBatch(skew, CODEC, 3, step_mode="static")
    assert static._cache.max_len == skew.cfg.max_seq_len and static._cache.batch_size == 3  # preallocated
    assert DecodeBatch(skew, CODEC, 3)._cache.max_len < skew.cfg.max_seq_len  # eager: grows as needed


def _jobs(max_tokens: int):
    short = prepare_primer(CODEC, make_motif(8), 1.0, max_tokens=max_tokens)
    long = prepare_primer(CODEC, make_motif(24, program=40), 30.0, max_tokens=max_tokens)
    mid = prepare_primer(CODEC, make_motif(14, program=0), 5.0, max_tokens=max_tokens)
    steer = every_control()
    return [
        (short, SamplingParams(seconds=1000.0, max_new_tokens=70, seed=11, num_samples=2, top_k=40)),
        (long, SamplingParams(seconds=1.5, seed=5, temperature=1.2, top_p=0.8, controls=steer)),
        (
            mid,
            SamplingParams(seconds=1000.0, max_new_tokens=45, seed=3, num_samples=2, shift_temperature=0.7),
        ),
        (short, SamplingParams(seconds=2.0, seed=8, controls=steer)),
    ]


def _run(model, mode: str, jobs, max_rows: int = 8, corrupt: bool = False):
    """Every job through one batch: the first alone for 7 steps, the second joining, the rest once it left."""
    batch = DecodeBatch(model, CODEC, max_rows=max_rows, step_mode=mode)
    results: dict = {}

    def step():
        results.update(batch.step())
        if corrupt:
            _corrupt_padding(batch)

    ids = batch.admit(jobs[:1])
    for _ in range(7):
        step()
    ids += batch.admit(jobs[1:2])
    while ids[1] not in results:
        step()
    ids += batch.admit(jobs[2:])
    while batch.rows:
        step()
    return [results[i] for i in ids], batch


@torch.inference_mode()
def _corrupt_padding(batch) -> None:
    """Every padding row of every bucket's buffers set to the state of some live row (padding holds a real
    row's state, or a departed one's: states the step takes), its cache rows to noise."""
    n = len(batch.rows)
    if not n:
        return
    g = torch.Generator().manual_seed(n)
    for static in batch._static.values():
        if n >= static.rows:
            continue
        source = torch.randint(0, n, (static.rows - n,), generator=g)
        for buf in static.buffers:
            buf[n:] = buf[source]
        static.cache.k[:, n:].normal_(generator=g)
        static.cache.v[:, n:].normal_(generator=g)


@pytest.mark.parametrize("max_seq_len", [128, 32])
def test_the_static_step_draws_the_eager_tokens(max_seq_len):
    """The same seeds, the same tokens: rows joining mid-flight, leaving, sliding (a 32-token window), every
    control on some rows, top-k, top-p and a shift temperature on others; buckets of 2, 4 and 8 rows."""
    model = tiny_model(max_seq_len=max_seq_len)
    jobs = _jobs(max_tokens=max_seq_len - 8)
    eager, _ = _run(model, "eager", jobs)
    static, batch = _run(model, "static", jobs)
    assert batch.step_mode == "static"
    assert {key[0] for key in batch._static} >= {2, 4, 8}  # several buckets were used
    for a, b in zip(eager, static, strict=True):
        assert len(a.tokens) == len(b.tokens) and a.seed == b.seed
        for x, y in zip(a.tokens, b.tokens, strict=True):
            np.testing.assert_array_equal(x, y)
        assert a.controls == b.controls


def test_padding_rows_never_change_the_live_rows_tokens():
    """Other rows' states in every padding row and noise in its cache, after every step: the live rows draw
    what they drew."""
    model = tiny_model(max_seq_len=64)
    jobs = _jobs(max_tokens=56)
    clean, _ = _run(model, "static", jobs, max_rows=8)
    dirty, batch = _run(model, "static", jobs, max_rows=8, corrupt=True)
    assert any(static.rows > 1 for static in batch._static.values())
    for a, b in zip(clean, dirty, strict=True):
        for x, y in zip(a.tokens, b.tokens, strict=True):
            np.testing.assert_array_equal(x, y)


def test_the_slots_are_every_per_row_tensor():
    """`slots` names every tensor that follows the rows (what `select` cuts), so a bucket's buffers hold the
    whole state a step reads."""
    model = tiny_model()
    jobs = _jobs(max_tokens=100)
    batch = DecodeBatch(model, CODEC, max_rows=8)
    batch.admit(jobs)
    live = batch.live
    n = len(batch.rows)
    objects = {"rows": live, "random": live.random, "grammar": live.grammar, "density": live.grammar.density}
    before = {
        (key, name): value.shape[0]
        for key, obj in objects.items()
        for name, value in vars(obj).items()
        if isinstance(value, torch.Tensor)
    }
    live.select(list(range(n - 1)))
    cut = {
        (key, name)
        for key, obj in objects.items()
        for name, value in vars(obj).items()
        if isinstance(value, torch.Tensor) and value.shape[0] != before[(key, name)]
    }
    names = {id(obj): key for key, obj in objects.items()}
    assert cut == {(names[id(obj)], name) for obj, name in slots(live)}
    assert decode_graph.supported(live)
    from musicrel.generation.accompaniment import MelodyGrammar

    live.grammar.__class__ = MelodyGrammar  # a subclass's own state is not in the slots: an eager step
    assert not decode_graph.supported(live)


class _FakeGraphs:
    """torch.cuda's graph API as the CPU can play it: a capture records `StaticStep._body` without running
    it (what it computed is undone: a real capture runs nothing), a replay runs the recorded body on the same
    buffers and writes its flags into the captured output, leaving the Python objects as they were (a real
    replay touches no Python state). So the "graph" mode's bookkeeping runs as it would on a GPU."""

    def __init__(self, monkeypatch):
        self.capturing: _FakeGraphs.Graph | None = None
        self.captures = self.replays = 0
        original = decode_graph.StaticStep._body
        fakes = self

        class Graph:
            def __init__(self):
                self.recorded = None

            def capture_begin(self, pool=None, capture_error_mode="global"):
                assert capture_error_mode == "thread_local"
                fakes.capturing = self

            def capture_end(self):
                fakes.capturing = None
                fakes.captures += self.recorded is not None

            def replay(self):
                step, batch, done = self.recorded
                held = [getattr(o, n) for o, n in slots(batch.live)]
                done.copy_(original(step, batch))
                for (o, n), value in zip(slots(batch.live), held, strict=True):
                    setattr(o, n, value)
                fakes.replays += 1

        def body(step, batch):
            if fakes.capturing is None:
                return original(step, batch)
            before = [b.clone() for b in step.buffers], step.pos.clone()
            done = original(step, batch)
            for buf, old in zip(step.buffers, before[0], strict=True):
                buf.copy_(old)
            step.pos.copy_(before[1])
            fakes.capturing.recorded = (step, batch, done)
            return done

        class Stream:
            def __init__(self, device=None):
                pass

            def wait_stream(self, other):
                pass

        monkeypatch.setattr(decode_graph.StaticStep, "_body", body)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)


def test_the_graph_modes_bookkeeping_draws_the_eager_tokens(monkeypatch):
    """The "graph" mode's path (warm-up, capture, replays, rows joining and leaving, buckets and signatures
    changing) with torch.cuda's graph API played on the CPU (`_FakeGraphs`): the eager step's tokens."""
    model = tiny_model(max_seq_len=32)
    jobs = _jobs(max_tokens=24)
    eager, _ = _run(model, "eager", jobs)
    fakes = _FakeGraphs(monkeypatch)
    real_init = DecodeBatch.__init__

    def graph_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.step_mode = "graph"  # what "auto" is on a GPU; on a CPU it resolves to "static"

    monkeypatch.setattr(DecodeBatch, "__init__", graph_init)
    graphed, batch = _run(model, "static", jobs)
    assert batch.step_mode == "graph" and fakes.captures >= 3 and fakes.replays > 50
    assert sum(s.graph is not None for s in batch._static.values()) == fakes.captures
    for a, b in zip(eager, graphed, strict=True):
        for x, y in zip(a.tokens, b.tokens, strict=True):
            np.testing.assert_array_equal(x, y)


def test_a_capture_that_fails_goes_on_uncaptured(monkeypatch, caplog):
    model = tiny_model(max_seq_len=32)
    jobs = _jobs(max_tokens=24)
    eager, _ = _run(model, "eager", jobs)
    fakes = _FakeGraphs(monkeypatch)

    def broken(self, *a, **k):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", broken)
    real_init = DecodeBatch.__init__

    def graph_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.step_mode = "graph"

    monkeypatch.setattr(DecodeBatch, "__init__", graph_init)
    with caplog.at_level("ERROR"):
        fallback, batch = _run(model, "static", jobs)
    assert batch.step_mode == "static" and fakes.replays == 0
    assert "capturing the decode step at" in caplog.text
    for a, b in zip(eager, fallback, strict=True):
        for x, y in zip(a.tokens, b.tokens, strict=True):
            np.testing.assert_array_equal(x, y)


def test_the_least_recently_used_steps_go_past_the_bound(monkeypatch):
    """A batch keeps at most MAX_STATIC_STEPS StaticSteps (each holds buffers, on a GPU a graph's memory); a
    step dropped and needed again is made again, the tokens the same."""
    from musicrel.generation import decode_batch

    model = tiny_model(max_seq_len=32)
    jobs = _jobs(max_tokens=24)
    kept, _ = _run(model, "static", jobs)
    monkeypatch.setattr(decode_batch, "MAX_STATIC_STEPS", 1)
    made = []
    real_init = decode_graph.StaticStep.__init__

    def counted(self, batch, rows):
        made.append(rows)
        real_init(self, batch, rows)

    monkeypatch.setattr(decode_graph.StaticStep, "__init__", counted)
    bounded, batch = _run(model, "static", jobs)
    assert len(batch._static) == 1 and len(made) > len(set(made))  # a bucket made twice
    for a, b in zip(kept, bounded, strict=True):
        for x, y in zip(a.tokens, b.tokens, strict=True):
            np.testing.assert_array_equal(x, y)


def test_warm_buckets_capture_every_batch_size_before_the_requests(monkeypatch):
    """The service's warm-up on a GPU: one job per bucket, each step captured; later requests of that kind
    (no controls, or empty ones: the same operations) replay without a capture of their own."""
    from musicrel.generation.controls import Controls

    fakes = _FakeGraphs(monkeypatch)
    model = tiny_model(max_seq_len=64)
    primer = prepare_primer(CODEC, make_motif(8), 1.0, max_tokens=40)
    assert DecodeBatch(model, CODEC, 2, step_mode="static").warm_buckets(primer, SamplingParams()) == []
    batch = DecodeBatch(model, CODEC, max_rows=6, step_mode="static")
    batch.step_mode = "graph"  # what "auto" is on a GPU
    assert batch.warm_buckets(primer, SamplingParams(seed=0)) == [1, 2, 4, 6]
    assert fakes.captures == 4 and not batch.rows and batch.length == 0
    batch.admit([(primer, SamplingParams(seconds=1.0, seed=3, num_samples=3, controls=Controls()))])
    batch.admit([(primer, SamplingParams(seconds=0.5, seed=4))])
    while batch.rows:
        batch.step()
    assert fakes.captures == 4 and fakes.replays > 4 * 2


def test_a_bfloat16_model_the_gpus_weights_runs_the_static_step():
    """The weights a GPU holds (bfloat16, its KV cache too) through both steps on the CPU: no dtype the step
    does not take; on this tiny model, the same tokens."""
    model = tiny_model(max_seq_len=32).to(torch.bfloat16)
    jobs = _jobs(max_tokens=24)
    eager, _ = _run(model, "eager", jobs)
    static, batch = _run(model, "static", jobs)
    assert batch._cache.k.dtype == torch.bfloat16
    for a, b in zip(eager, static, strict=True):
        for x, y in zip(a.tokens, b.tokens, strict=True):
            np.testing.assert_array_equal(x, y)


def test_a_static_step_reads_which_rows_ended_one_step_late():
    """No question to the device while no row ends: a row that ends is seen on the next step, and leaves
    then with the tokens it had (the one it drew past its end dropped); a stop leaves the ended rows first."""
    model = tiny_model()
    primer = prepare_primer(CODEC, make_motif(8), 1.0)
    params = SamplingParams(seconds=1000.0, max_new_tokens=5, seed=1)
    for mode in ("eager", "static"):
        batch = DecodeBatch(model, CODEC, max_rows=2, step_mode=mode)
        (job,) = batch.admit([(primer, params)])
        finished = [batch.step() for _ in range(5)]
        if mode == "eager":
            assert finished[-1] and not batch.rows
            expected = finished[-1][0][1].tokens[0]
            continue
        assert not any(finished) and len(batch.rows) == 1 and batch._ended is not None
        assert len(batch.generated(job)[0]) == 5  # the stream hears its 5 tokens, no more
        ((done, result),) = batch.step()
        assert done == job and not batch.rows
        np.testing.assert_array_equal(result.tokens[0], expected)
        # a stop: the row that ended on the last step leaves as ended (not stopped), before the stop
        (a,) = batch.admit([(primer, params)])
        (b,) = batch.admit([(primer, replace(params, max_new_tokens=50, seed=2))])
        for _ in range(5):
            assert batch.step() == []
        out = dict(batch.step(should_stop=lambda job_id, stop=b: job_id == stop))
        assert set(out) == {a, b} and not out[a].stopped and out[b].stopped
        np.testing.assert_array_equal(out[a].tokens[0], expected)
