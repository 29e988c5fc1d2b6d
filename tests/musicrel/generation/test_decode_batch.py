"""Jobs through decode_batch: determinism and seeds, a job the same alone or batched, lengths, stopping, and
continuous batching (DecodeBatch: admission mid-flight, departures, the primer cache)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from musicrel.errors import GenerationError
from musicrel.generation.continuation import continue_midi
from musicrel.generation.decode import generate
from musicrel.generation.decode_batch import DecodeBatch, generate_batch
from musicrel.generation.grammar import Grammar, max_hold_seconds
from musicrel.generation.primer import Primer, prepare_primer, render_result
from musicrel.generation.sampling import SamplingParams, row_seed
from musicrel.midi.codec import open_pitches, shift_steps
from musicrel.model.config import ModelConfig
from musicrel.model.transformer import MusicTransformer
from tests.musicrel.conftest import (
    CODEC,
    STEP,
    check_grammar,
    make_motif,
    midi_bytes,
    notes_of,
    tiny_model,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_same_seed_identical_and_different_seeds_differ(model):
    motif = make_motif()
    a = continue_midi(model, motif, seconds=2.0, seed=7, num_samples=2, codec=CODEC)
    b = continue_midi(model, motif, seconds=2.0, seed=7, num_samples=2, codec=CODEC)
    c = continue_midi(model, motif, seconds=2.0, seed=8, num_samples=2, codec=CODEC)
    assert len(a) == 2
    assert [midi_bytes(x) for x in a] == [midi_bytes(x) for x in b]
    assert notes_of(a[0]) != notes_of(c[0])
    assert notes_of(a[0]) != notes_of(a[1])  # the samples of one job differ from each other
    assert any(t.text == "musicrel seed=7 sample=1" for t in a[1].text_events)


def test_random_seed_is_drawn_reported_and_reproduces(model):
    primer = prepare_primer(CODEC, make_motif(), 10.0)
    first = generate_batch(model, CODEC, [(primer, SamplingParams(seconds=1.5, seed=None))])[0]
    again = generate_batch(model, CODEC, [(primer, SamplingParams(seconds=1.5, seed=first.seed))])[0]
    assert isinstance(first.seed, int) and first.seed >= 0
    np.testing.assert_array_equal(first.tokens[0], again.tokens[0])
    text_events = render_result(CODEC, primer, first)[0].text_events
    assert any(t.text == f"musicrel seed={first.seed} sample=0" for t in text_events)


def test_job_is_the_same_alone_or_batched(model):
    short = prepare_primer(CODEC, make_motif(8), 1.0)
    long = prepare_primer(CODEC, make_motif(24, program=40), 30.0)
    assert len(short.tokens) < len(long.tokens)  # rows of the batch are left-padded differently
    p_short = SamplingParams(seconds=2.0, seed=11, num_samples=2, temperature=0.9, top_k=50)
    p_long = SamplingParams(seconds=3.0, seed=5, num_samples=1, top_p=0.8)
    alone_short = generate_batch(model, CODEC, [(short, p_short)])[0]
    alone_long = generate_batch(model, CODEC, [(long, p_long)])[0]
    both = generate_batch(model, CODEC, [(long, p_long), (short, p_short)])
    for x, y, primer in ((alone_short, both[1], short), (alone_long, both[0], long)):
        assert len(x.tokens) == len(y.tokens)
        for a, b in zip(x.tokens, y.tokens, strict=True):
            np.testing.assert_array_equal(a, b)
        rendered = [render_result(CODEC, primer, r) for r in (x, y)]
        assert [notes_of(m) for m in rendered[0]] == [notes_of(m) for m in rendered[1]]


@settings(max_examples=8, deadline=None)
@given(seconds=st.floats(0.05, 4.0), seed=st.integers(0, 2**31))
def test_requested_seconds_met_within_one_time_step(model, seconds, seed):
    primer = prepare_primer(CODEC, make_motif(), 5.0)
    res = generate_batch(model, CODEC, [(primer, SamplingParams(seconds=seconds, seed=seed, num_samples=2))])[
        0
    ]
    for tokens, pm in zip(res.tokens, render_result(CODEC, primer, res), strict=True):
        length = shift_steps(CODEC)[tokens].sum() * STEP
        assert seconds - 1e-9 <= length < seconds + STEP + 1e-9
        assert pm.get_end_time() == pytest.approx(length)
        assert all(n.end <= length + 1e-9 for n in pm.instruments[0].notes)
    assert seconds - 1e-9 <= res.seconds < seconds + STEP + 1e-9


def test_generation_past_the_context_window():
    m = tiny_model(max_seq_len=32)
    primer = prepare_primer(CODEC, make_motif(30), 30.0, max_tokens=24)
    assert 0 < len(primer.tokens) <= 24
    res = generate_batch(m, CODEC, [(primer, SamplingParams(seconds=1000.0, max_new_tokens=200, seed=3))])[0]
    assert len(res.tokens[0]) == 200
    check_grammar(res.tokens[0], open_pitches(CODEC, primer.tokens))


def test_should_stop_stops_only_that_job(model):
    primer = prepare_primer(CODEC, make_motif(), 4.0)
    params = SamplingParams(seconds=3.0, seed=2, num_samples=2)
    steps = {"n": 0}

    def should_stop(job: int) -> bool:
        if job == 1:
            steps["n"] += 1
            return steps["n"] > 5  # the client of job 1 goes away after a few steps
        return False

    alone = generate_batch(model, CODEC, [(primer, params)])[0]
    kept, cut = generate_batch(model, CODEC, [(primer, params), (primer, params)], should_stop=should_stop)
    assert cut.stopped and not kept.stopped
    assert all(len(t) <= 5 for t in cut.tokens)
    for a, b in zip(alone.tokens, kept.tokens, strict=True):
        np.testing.assert_array_equal(a, b)
    stopped_at_once = generate_batch(model, CODEC, [(primer, params)], should_stop=lambda j: True)[0]
    assert stopped_at_once.stopped and stopped_at_once.new_tokens == 0


# ---- continuous batching: DecodeBatch ------------------------------------------------------------


def _scheme_model(attention: str, max_seq_len: int) -> MusicTransformer:
    torch.manual_seed(1)
    cfg = ModelConfig(
        vocab_size=CODEC.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=max_seq_len,
        attention=attention, max_relative_distance=16 if attention == "shaw" else None,
    )  # fmt: skip
    return MusicTransformer(cfg).eval()


def _mixed_jobs(max_tokens: int) -> list:
    """Primers of different lengths (left padding, right shifts on admission) and stopping rules."""
    short = prepare_primer(CODEC, make_motif(3), 0.5, max_tokens=max_tokens)
    long = prepare_primer(CODEC, make_motif(40, program=40), 30.0, max_tokens=max_tokens)
    mid = prepare_primer(CODEC, make_motif(12), 1.0, max_tokens=max_tokens)
    assert len(short.tokens) < len(mid.tokens) < len(long.tokens)
    return [
        (short, SamplingParams(seconds=1000.0, max_new_tokens=70, seed=11, num_samples=2, top_k=40)),
        (long, SamplingParams(seconds=1.5, seed=5, temperature=1.2, top_p=0.8)),
        (mid, SamplingParams(seconds=1000.0, max_new_tokens=45, seed=3, num_samples=2, temperature=0.8)),
    ]


def _assert_same(a, b) -> None:
    assert len(a.tokens) == len(b.tokens) and a.seed == b.seed
    for x, y in zip(a.tokens, b.tokens, strict=True):
        np.testing.assert_array_equal(x, y)
    assert a.controls == b.controls  # with the tokens and seed: everything the rendered MIDI is made of


@pytest.mark.parametrize("attention", ["skew", "absolute", "t5", "shaw"])
@pytest.mark.parametrize("max_seq_len", [128, 32])
def test_job_is_the_same_alone_batched_or_admitted_mid_flight(attention, max_seq_len):
    """Each sample's tokens depend on its job only: not on batch-mates, nor on the step it joined at. With a
    32-token window the rows also slide (and shift) while others join and leave."""
    m = _scheme_model(attention, max_seq_len)
    jobs = _mixed_jobs(max_tokens=max_seq_len - 8)
    alone = [generate_batch(m, CODEC, [job])[0] for job in jobs]
    together = generate_batch(m, CODEC, jobs)

    batch = DecodeBatch(m, CODEC, max_rows=5)
    results: dict = {}
    ids = batch.admit(jobs[:1])
    for _ in range(7):
        results.update(batch.step())
    ids += batch.admit(jobs[1:2])  # a longer primer than the cache holds: the running rows shift right
    while ids[1] not in results:
        results.update(batch.step())
    assert len(batch.rows) == 2 and batch.free_rows == 3
    ids += batch.admit(jobs[2:])  # joins rows that have slid (32-token window) and a job that has left
    while batch.rows:
        results.update(batch.step())
    assert batch.length == 0 and batch.free_rows == 5
    for a, b, c in zip(alone, together, [results[i] for i in ids], strict=True):
        _assert_same(a, b)
        _assert_same(a, c)
    assert [len(t) for t in alone[0].tokens] == [70, 70]


def test_decode_batch_equals_full_recompute_past_the_window():
    """Admission (primer prefilled without its last token), slides and packing change speed, never tokens:
    the reference recomputes the whole window for every token."""
    m = tiny_model(max_seq_len=32)
    primer = prepare_primer(CODEC, make_motif(30), 30.0, max_tokens=24)
    params = SamplingParams(seconds=1000.0, max_new_tokens=100, seed=9, num_samples=2, top_p=0.9)
    batch = DecodeBatch(m, CODEC, max_rows=2)
    (job,) = batch.admit([(primer, params)])
    results: dict = {}
    while batch.rows:
        results.update(batch.step())
    tokens = torch.as_tensor(np.asarray(primer.tokens, dtype=np.int64))
    hold = round(max_hold_seconds(primer) / STEP)  # the cap DecodeBatch gives the job's rows
    reference = generate(
        m, tokens[None].repeat(2, 1), 100, top_p=0.9, use_cache=False,
        generators=[torch.Generator().manual_seed(row_seed(9, i)) for i in range(2)],
        grammar=Grammar(CODEC, [primer.tokens] * 2, [10**9] * 2, [hold] * 2),
    )  # fmt: skip
    expected = torch.stack(list(reference), dim=1).numpy()  # (2, 100)
    np.testing.assert_array_equal(np.stack(results[job].tokens), expected)


def test_admission_that_fails_leaves_the_batch_as_it_was(model):
    primer = prepare_primer(CODEC, make_motif(), 4.0)
    params = SamplingParams(seconds=1.0, seed=2, num_samples=2)
    alone = generate_batch(model, CODEC, [(primer, params)])[0]
    batch = DecodeBatch(model, CODEC, max_rows=3)
    (job,) = batch.admit([(primer, params)])
    results = dict(batch.step())
    bad = Primer(np.array([0, CODEC.vocab_size]), 0.0, 1.0, 120.0, 0, [])
    with pytest.raises(GenerationError) as info:
        batch.admit([(primer, SamplingParams(seconds=1.0)), (bad, SamplingParams(seconds=1.0))])
    assert info.value.code == "invalid_primer"
    with pytest.raises(GenerationError) as info:
        batch.admit([(primer, SamplingParams(seconds=1.0, num_samples=2))])  # one row is free
    assert info.value.code == "batch_full"
    assert len(batch.rows) == 2 and batch.live_jobs == [job]
    while batch.rows:
        results.update(batch.step())
    _assert_same(alone, results[job])


def test_primer_cache_skips_the_prefill_of_a_primer_seen_again():
    m = tiny_model()
    prefills: list = []
    m.register_forward_pre_hook(
        lambda _, args: prefills.append(args[0].shape) if args[0].size(1) > 1 else None
    )
    x, y, z = (prepare_primer(CODEC, make_motif(n), 3.0) for n in (8, 10, 12))
    params = [SamplingParams(seconds=0.5, seed=s, num_samples=2) for s in range(5)]
    alone = [generate_batch(m, CODEC, [(x, p)])[0] for p in params]
    prefills.clear()
    batch = DecodeBatch(m, CODEC, max_rows=4, primer_cache=2)
    results: dict = {}

    def run(primer, p) -> int:
        (job,) = batch.admit([(primer, p)])
        while batch.rows:
            results.update(batch.step())
        return job

    first = run(x, params[0])
    assert len(prefills) == 1  # one forward pass for both samples
    again = run(x, params[1])  # the same motif with another seed: no prefill
    assert len(prefills) == 1
    run(y, params[2])
    run(z, params[3])  # the cache holds 2 primers: x is forgotten
    assert len(prefills) == 3
    last = run(x, params[4])
    assert len(prefills) == 4
    for job, expected in ((first, alone[0]), (again, alone[1]), (last, alone[4])):
        _assert_same(results[job], expected)


def test_decode_batch_stops_a_job_between_steps(model):
    primer = prepare_primer(CODEC, make_motif(), 4.0)
    batch = DecodeBatch(model, CODEC, max_rows=4)
    keep, cut = batch.admit([(primer, SamplingParams(seconds=3.0, seed=1)), (primer, SamplingParams(seed=2))])
    for _ in range(3):
        assert batch.step() == []
    ((job, result),) = batch.step(should_stop=lambda j: j == cut)  # checked before the step's token
    assert job == cut and result.stopped and len(result.tokens[0]) == 3
    assert batch.live_jobs == [keep] and len(batch.rows) == 1


@pytest.mark.parametrize("attention", ["skew", "absolute"])
@pytest.mark.parametrize("max_seq_len", [128, 32])
def test_jobs_leaving_in_scrambled_order_are_the_same_as_alone(attention, max_seq_len):
    """Rows leave in an order unrelated to their place in the batch (the longest primer first, a middle job
    stopped, a job admitted into a hole): the rows that fill the holes carry their K/V, padding, pending
    token, sampling settings, generator and grammar state with them, so every job is as it is alone."""
    m = _scheme_model(attention, max_seq_len)
    crop = max_seq_len - 8

    def job(n: int, **params):
        return (
            prepare_primer(CODEC, make_motif(n), 30.0, max_tokens=crop),
            SamplingParams(seconds=1000.0, **params),
        )

    jobs = [
        job(20, max_new_tokens=12, seed=1),  # the longest primer leaves first: the others' padding goes
        job(4, max_new_tokens=60, seed=2, num_samples=2, top_k=30),
        job(10, max_new_tokens=1000, seed=3, num_samples=2, temperature=0.8),  # stopped after 25 tokens
        job(6, max_new_tokens=20, seed=4),
        job(12, max_new_tokens=35, seed=5, temperature=1.3, top_p=0.8),
        job(5, max_new_tokens=40, seed=6),  # admitted into a hole
    ]
    # job 2 alone stops where it is stopped in the batch (asked once a step, before the step's token): the
    # 975 tokens after those would be compared with nothing
    steps_alone = itertools.count()
    alone = [
        generate_batch(m, CODEC, [j], should_stop=(lambda _: next(steps_alone) >= 25) if i == 2 else None)[0]
        for i, j in enumerate(jobs)
    ]
    batch = DecodeBatch(m, CODEC, max_rows=7)
    ids = batch.admit(jobs[:5])
    results: dict = {}
    steps, scrambled, shifted = 0, False, False
    while batch.rows:
        if steps == 15:
            ids += batch.admit(jobs[5:])
        before = batch.length
        victim = ids[2] if steps >= 25 else None
        results.update(batch.step(should_stop=lambda j, victim=victim: j == victim))
        steps += 1
        order = [(row.job.id, row.sample) for row in batch.rows]
        scrambled |= order != sorted(order)
        shifted |= bool(batch.rows) and before < max_seq_len and batch.length <= before
    assert scrambled, "no row ever moved into a hole"
    assert shifted or max_seq_len == 32, "no departure dropped shared padding"
    assert batch.length == 0 and batch.free_rows == 7
    stopped = results[ids[2]]
    assert stopped.stopped and [len(t) for t in stopped.tokens] == [25, 25]
    for a, t in zip(alone[2].tokens, stopped.tokens, strict=True):
        np.testing.assert_array_equal(a, t)
    for j in (0, 1, 3, 4, 5):
        _assert_same(alone[j], results[ids[j]])


def test_a_departure_moves_only_the_last_row(model):
    """A middle row leaves: the last row takes its place with its K/V (its real positions only), nothing else
    in the cache is written, and the shared padding left (less than a quarter of the length) stays."""
    primers = [prepare_primer(CODEC, make_motif(n), 30.0) for n in (8, 9, 7, 8)]
    assert [len(p.tokens) for p in primers] == [40, 45, 35, 40]  # row 1 is the only one without padding
    batch = DecodeBatch(model, CODEC, max_rows=4)
    ids = batch.admit([(p, SamplingParams(seconds=1000.0, seed=s)) for s, p in enumerate(primers)])
    for _ in range(3):
        batch.step()
    L, rows = batch.length, list(batch.rows)
    k, v, left_pad = batch._cache.k.clone(), batch._cache.v.clone(), batch.left_pad.clone()
    pad = int(left_pad[3])
    assert L == 47 and left_pad[:4].tolist() == [5, 0, 10, 5]
    ((job, _),) = batch.step(should_stop=lambda j: j == ids[1])
    assert job == ids[1] and batch.rows == [rows[0], rows[3], rows[2]]
    assert batch.length == L + 1 and batch.left_pad[:3].tolist() == [5, 5, 10]  # no shift: 5 < 47 / 4
    for new, old in ((batch._cache.k, k), (batch._cache.v, v)):
        torch.testing.assert_close(new[:, [0, 2], :, :L], old[:, [0, 2], :, :L], rtol=0, atol=0)
        torch.testing.assert_close(new[:, 1, :, pad:L], old[:, 3, :, pad:L], rtol=0, atol=0)
        torch.testing.assert_close(new[:, 1, :, :pad], old[:, 1, :, :pad], rtol=0, atol=0)  # padding: as was
    assert batch.live_jobs == [ids[0], ids[2], ids[3]]


def test_include_primer_puts_motif_then_continuation_and_keeps_tempo_program(model):
    motif = make_motif(12, tempo=84.0, program=33, offset=1.0)
    end = max(n.end for n in motif.instruments[1].notes)
    (cont,) = continue_midi(model, motif, seconds=2.0, seed=4, num_samples=1, codec=CODEC)
    (full,) = continue_midi(
        model, motif, seconds=2.0, seed=4, num_samples=1, include_primer=True, codec=CODEC
    )
    for pm in (cont, full):
        assert len(pm.instruments) == 1 and pm.instruments[0].program == 33
        assert pm.get_tempo_changes()[1][0] == pytest.approx(84.0, abs=0.01)
    motif_notes = sorted(notes_of(motif)[4:])  # without the drums
    full_notes = notes_of(full)
    assert sorted(n for n in full_notes if n[2] < end - 1e-6) == motif_notes
    shifted = sorted((p, v, round(s + end, 3), round(e + end, 3)) for p, v, s, e in notes_of(cont))
    assert sorted((p, v, round(s, 3), round(e, 3)) for p, v, s, e in full_notes if s >= end - 1e-6) == shifted
    assert full.get_end_time() == pytest.approx(end + cont.get_end_time())


def test_the_batched_grammar_and_sampler_draw_each_row_s_tokens_alone(model):
    """The grammar's rules, the controls and the sampler run batched, once per step for every row: each row
    still draws what it draws decoding alone (its own seed's stream, its own controls), with rows of other
    controls and settings beside it, joining mid-flight and leaving at other lengths."""
    motif = prepare_primer(CODEC, make_motif(16), 30.0)
    every = dict(key="C:major", chords="C:1 G:1 Am:1 F:1", density=8.0, low_note=40, high_note=90,
                 max_polyphony=3)  # fmt: skip
    jobs = [
        (motif, SamplingParams(seconds=1000.0, max_new_tokens=60, seed=1, num_samples=2, controls=every)),
        (motif, SamplingParams(seconds=1000.0, max_new_tokens=40, seed=2, controls=dict(density=2.0))),
        (
            motif,
            SamplingParams(
                seconds=1000.0,
                max_new_tokens=50,
                seed=3,
                top_k=20,
                top_p=0.9,
                controls=dict(key="A:minor", key_strength="only", max_polyphony=2),
            ),
        ),  # fmt: skip
        (motif, SamplingParams(seconds=1000.0, max_new_tokens=30, seed=4, shift_temperature=0.7)),
        (
            motif,
            SamplingParams(
                seconds=1.0,
                seed=5,
                num_samples=2,
                temperature=1.3,
                controls=dict(chords="Dm:0.5 G:0.5", chord_strength="only"),
            ),
        ),  # fmt: skip
    ]
    alone = [generate_batch(model, CODEC, [job])[0] for job in jobs]
    batch = DecodeBatch(model, CODEC, max_rows=8)
    ids = batch.admit(jobs[:3])
    results: dict = {}
    for step in range(200):
        if step == 10:
            ids += batch.admit(jobs[3:])  # rows join a batch of other controls mid-flight
        results.update(batch.step())
        if not batch.rows:
            break
    assert set(results) == set(ids)
    for job_id, expected in zip(ids, alone, strict=True):
        _assert_same(expected, results[job_id])


@pytest.mark.parametrize("mode", ["eager", "static"])
def test_generated_streams_each_jobs_tokens_so_far(model, mode):
    """What a streaming engine reads after every step: each sample's tokens so far (a prefix of its result),
    through jobs joining and leaving (the index by job is made again each time); None once a job is done."""
    short = prepare_primer(CODEC, make_motif(8), 1.0)
    jobs = [
        (short, SamplingParams(seconds=1000.0, max_new_tokens=12, seed=1, num_samples=2)),
        (short, SamplingParams(seconds=1000.0, max_new_tokens=30, seed=2)),
    ]
    batch = DecodeBatch(model, CODEC, max_rows=4, step_mode=mode)
    (first,) = batch.admit(jobs[:1])
    seen: dict = {}
    results: dict = {}
    for step in range(40):
        if step == 3:
            seen[batch.admit(jobs[1:])[0]] = []
        results.update(batch.step())
        for job_id in batch.live_jobs:
            seen.setdefault(job_id, [])
            seen[job_id].append([t.copy() for t in batch.generated(job_id)])
        if not batch.rows:
            break
    assert batch.generated(first) is None and set(results) == set(seen)
    for job_id, snapshots in seen.items():
        final = results[job_id].tokens
        for snap in snapshots:
            for part, whole in zip(snap, final, strict=True):
                np.testing.assert_array_equal(part, whole[: len(part)])
        # eager: all but the ending step's; static reads the ends a step late: every token, none past them
        assert [len(s) for s in snapshots[-1]] == [len(t) - (mode == "eager") for t in final]
