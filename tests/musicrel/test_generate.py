"""Generation: determinism, cache == recompute, batch independence, lengths, grammar, rendering."""

from __future__ import annotations

import io

import numpy as np
import pretty_midi
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from musicrel.batch import DecodeBatch, continue_midi, generate_batch
from musicrel.codec import CodecConfig, EventCodec, open_pitches, shift_steps
from musicrel.config import ModelConfig
from musicrel.errors import GenerationError
from musicrel.generate import generate, sample
from musicrel.grammar import HOLD_FACTOR, MAX_HOLD_SECONDS, MIN_HOLD_SECONDS, Grammar, max_hold_seconds
from musicrel.model import MusicTransformer
from musicrel.primer import Primer, prepare_primer, primer_at_cut, render
from musicrel.sampling import SamplingParams, row_seed

CODEC = EventCodec()
STEP = CODEC.config.step_ms / 1000.0


def tiny_model(max_seq_len: int = 128, seed: int = 0) -> MusicTransformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=CODEC.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=max_seq_len
    )
    return MusicTransformer(cfg).eval()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Tiny models on a shared machine: thread hand-offs cost more than the arithmetic.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model() -> MusicTransformer:
    return tiny_model()


def make_motif(
    n_notes: int = 16, tempo: float = 96.0, program: int = 24, offset: float = 0.0, drums: bool = True
):
    pm = pretty_midi.PrettyMIDI(initial_tempo=tempo)
    if drums:  # a drum track first: the kept program must be the first NON-drum one
        kit = pretty_midi.Instrument(program=0, is_drum=True)
        kit.notes = [pretty_midi.Note(100, 36, offset + k * 0.5, offset + k * 0.5 + 0.1) for k in range(4)]
        pm.instruments.append(kit)
    inst = pretty_midi.Instrument(program=program)
    for k in range(n_notes):
        start = offset + k * 0.25
        inst.notes.append(pretty_midi.Note(70 + k % 5 * 5, 60 + (k * 7) % 12, start, start + 0.35))
    pm.instruments.append(inst)
    return pm


def midi_bytes(pm: pretty_midi.PrettyMIDI) -> bytes:
    buf = io.BytesIO()
    pm.write(buf)
    return buf.getvalue()


def notes_of(pm):
    return [
        (n.pitch, n.velocity, round(n.start, 4), round(n.end, 4)) for i in pm.instruments for n in i.notes
    ]


def check_grammar(tokens: np.ndarray, start_open: np.ndarray | None = None) -> None:
    """Replays a generated stream: note-offs only for sounding pitches, no specials (a note-on of a sounding
    pitch is a legal re-strike)."""
    sounding = np.zeros(128, bool) if start_open is None else start_open.copy()
    for t in tokens:
        t = int(t)
        assert t not in (CODEC.pad_id, CODEC.bos_id, CODEC.eos_id)
        if CODEC.note_on_offset <= t < CODEC.note_on_offset + 128:
            sounding[t - CODEC.note_on_offset] = True
        elif CODEC.note_off_offset <= t < CODEC.note_off_offset + 128:
            assert sounding[t - CODEC.note_off_offset], "orphan note-off"
            sounding[t - CODEC.note_off_offset] = False


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
    assert any(t.text == f"musicrel seed={first.seed} sample=0" for t in first.midis[0].text_events)


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


def test_job_is_the_same_alone_or_batched(model):
    short = prepare_primer(CODEC, make_motif(8), 1.0)
    long = prepare_primer(CODEC, make_motif(24, program=40), 30.0)
    assert len(short.tokens) < len(long.tokens)  # rows of the batch are left-padded differently
    p_short = SamplingParams(seconds=2.0, seed=11, num_samples=2, temperature=0.9, top_k=50)
    p_long = SamplingParams(seconds=3.0, seed=5, num_samples=1, top_p=0.8)
    alone_short = generate_batch(model, CODEC, [(short, p_short)])[0]
    alone_long = generate_batch(model, CODEC, [(long, p_long)])[0]
    both = generate_batch(model, CODEC, [(long, p_long), (short, p_short)])
    for x, y in ((alone_short, both[1]), (alone_long, both[0])):
        assert len(x.tokens) == len(y.tokens)
        for a, b in zip(x.tokens, y.tokens, strict=True):
            np.testing.assert_array_equal(a, b)
        assert [notes_of(m) for m in x.midis] == [notes_of(m) for m in y.midis]


@settings(max_examples=8, deadline=None)
@given(seconds=st.floats(0.05, 4.0), seed=st.integers(0, 2**31))
def test_requested_seconds_met_within_one_time_step(model, seconds, seed):
    primer = prepare_primer(CODEC, make_motif(), 5.0)
    res = generate_batch(model, CODEC, [(primer, SamplingParams(seconds=seconds, seed=seed, num_samples=2))])[
        0
    ]
    for tokens, pm in zip(res.tokens, res.midis, strict=True):
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


def test_grammar_of_generated_streams(model):
    primer = prepare_primer(CODEC, make_motif(), 4.0)
    jobs = [(primer, SamplingParams(seconds=3.0, seed=s, num_samples=3, temperature=1.5)) for s in range(2)]
    for res in generate_batch(model, CODEC, jobs):
        for tokens, pm in zip(res.tokens, res.midis, strict=True):
            check_grammar(tokens, open_pitches(CODEC, primer.tokens))
            length = shift_steps(CODEC)[tokens].sum() * STEP
            notes = pm.instruments[0].notes
            assert notes, "a random tiny model still plays notes in 3 s"
            assert all(0 <= n.start < n.end <= length + 1e-9 for n in notes)  # closed, never backwards
            assert [n.start for n in notes] == sorted(n.start for n in notes)


@settings(max_examples=40, deadline=None)
@given(tokens=st.lists(st.integers(-5, CODEC.vocab_size + 5), max_size=200), include=st.booleans())
def test_garbage_token_streams_render_to_valid_files(tokens, include):
    primer = prepare_primer(CODEC, make_motif(6), 2.0)
    pm = render(
        CODEC, primer, np.array(tokens, dtype=np.int64), include_primer=include, seed=1, sample_index=0
    )
    back = pretty_midi.PrettyMIDI(io.BytesIO(midi_bytes(pm)))
    for n in back.instruments[0].notes if back.instruments else []:
        assert 0 <= n.start < n.end


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
    assert [notes_of(m) for m in a.midis] == [notes_of(m) for m in b.midis]


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
    alone = [generate_batch(m, CODEC, [j])[0] for j in jobs]
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
        np.testing.assert_array_equal(a[:25], t)
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


def test_primer_window_clips_notes_sounding_at_the_cut():
    pm = pretty_midi.PrettyMIDI()
    inst = pretty_midi.Instrument(program=0)
    inst.notes = [
        pretty_midi.Note(80, 60, 0.0, 1.0),
        pretty_midi.Note(80, 62, 1.5, 4.0),  # sounding at the cut (end - 2 s = 2.0)
        pretty_midi.Note(80, 64, 3.0, 3.5),
    ]
    pm.instruments.append(inst)
    primer = prepare_primer(CODEC, pm, primer_seconds=2.0)
    assert primer.start_time == pytest.approx(2.0) and primer.end_time == pytest.approx(4.0)
    assert [(n.pitch, n.start, n.end) for n in primer.notes] == [(62, 2.0, 4.0), (64, 3.0, 3.5)]
    decoded = CODEC.decode_notes(primer.tokens)
    assert [(n.pitch, round(n.start, 2), round(n.end, 2)) for n in decoded] == [
        (62, 0.0, 2.0),
        (64, 1.0, 1.5),
    ]


def test_primer_at_cut_leaves_sounding_notes_open_and_ends_at_the_cut():
    notes = [
        pretty_midi.Note(80, 60, 0.0, 1.0),
        pretty_midi.Note(80, 62, 1.5, 4.0),  # sounding at the cut (3.0): stays open
        pretty_midi.Note(80, 64, 2.0, 2.5),
        pretty_midi.Note(80, 65, 3.5, 4.0),  # after the cut: not in the primer
    ]
    primer = primer_at_cut(CODEC, notes, cut=3.0, primer_seconds=30.0)
    assert primer.end_time == 3.0 and primer.tokens[0] == CODEC.bos_id
    assert np.flatnonzero(open_pitches(CODEC, primer.tokens)).tolist() == [62]
    assert shift_steps(CODEC)[primer.tokens].sum() * STEP == pytest.approx(3.0)  # trailing shifts reach it
    assert CODEC.note_on_offset + 65 not in primer.tokens.tolist()
    check_grammar(primer.tokens[1:])
    # A cut inside the last gap: the tokens still end at the cut, after the last note-off.
    primer = primer_at_cut(CODEC, notes[:1], cut=2.75, primer_seconds=30.0)
    assert shift_steps(CODEC)[primer.tokens].sum() * STEP == pytest.approx(2.75)
    assert not open_pitches(CODEC, primer.tokens).any()


def test_long_primer_is_cropped_at_an_event_boundary():
    motif = make_motif(200, drums=False)
    full = prepare_primer(CODEC, motif, 1000.0)
    cropped = prepare_primer(CODEC, motif, 1000.0, max_tokens=40)
    assert len(full.tokens) > 40 >= len(cropped.tokens) > 20
    assert cropped.start_time > full.start_time and cropped.end_time == full.end_time
    check_grammar(cropped.tokens)  # re-encoded: it opens every note it closes
    assert not open_pitches(CODEC, cropped.tokens).any()


@pytest.mark.parametrize(
    "field, value",
    [
        ("seconds", 0),
        ("seconds", float("nan")),
        ("temperature", 0.0),
        ("temperature", -1),
        ("top_k", 0),
        ("top_k", 2.5),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("num_samples", 0),
        ("seed", -1),
        ("max_new_tokens", 0),
        ("include_primer", "yes"),
    ],
)
def test_sampling_params_are_validated(field, value):
    with pytest.raises(GenerationError, match=field) as info:
        SamplingParams(**{field: value})
    assert info.value.code == "invalid_params"


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


def test_render_keeps_the_pedal_of_an_events_codec_and_releases_it():
    from musicrel.codec import CodecConfig

    codec = EventCodec(CodecConfig(pedal="events"))
    primer = prepare_primer(codec, make_motif(4), 2.0)
    shift = codec.time_shift_offset
    tokens = [
        codec.pedal_on_id,
        codec.note_on_offset + 60,
        shift + 49,
        codec.note_off_offset + 60,
        shift + 49,
    ]
    pm = render(codec, primer, tokens)
    cc = [(c.number, c.value, round(c.time, 3)) for c in pm.instruments[0].control_changes]
    assert cc == [(64, 127, 0.0), (64, 0, 1.0)]
    assert [(n.pitch, n.start, n.end) for n in pm.instruments[0].notes] == [(60, 0.0, 0.5)]


def test_tracks_select_notes_and_program():
    pm = make_motif(8, program=24)  # [drums, program 24]
    other = pretty_midi.Instrument(program=56)
    other.notes = [pretty_midi.Note(100, 40, 0.0, 3.0)]
    pm.instruments.append(other)
    merged = prepare_primer(CODEC, pm, 30.0)
    only = prepare_primer(CODEC, pm, 30.0, tracks=[2])
    assert merged.program == 24 and only.program == 56
    assert {n.pitch for n in only.notes} == {40} and 40 in {n.pitch for n in merged.notes}


# ---------------------------------------------------------------------------------------------------------
# The grammar on constructed streams

ON, OFF, SHIFT = CODEC.note_on_offset, CODEC.note_off_offset, CODEC.time_shift_offset


def _peaked(*tokens: int, codec=CODEC) -> torch.Tensor:
    """(len(tokens), V) logits putting almost all mass of row r on tokens[r]."""
    logits = torch.zeros(len(tokens), codec.vocab_size)
    for r, t in enumerate(tokens):
        logits[r, t] = 30.0
    return logits


def test_grammar_keeps_a_restrike_legal():
    grammar = Grammar(CODEC, [np.array([ON + 60, SHIFT + 9])], [10**6])
    logits = grammar.constrain(_peaked(ON + 60))
    assert logits.argmax().item() == ON + 60  # the model's re-strike is what it gets
    assert grammar.advance(torch.tensor([ON + 60])).item() == ON + 60
    assert grammar.open[0, 60] and grammar.onset[0, 60] == 0  # the re-strike restarts the note's clock
    decoded = CODEC.decode_notes([ON + 60, SHIFT + 9, ON + 60, SHIFT + 4])
    assert [(n.pitch, n.start, n.end) for n in decoded] == [
        (60, 0.0, 0.1),
        (60, 0.1, pytest.approx(0.2)),
    ]  # the codec closes and restarts it


def test_grammar_repairs_an_orphan_note_off_to_the_nearest_sounding_pitch():
    prompt = np.array([ON + 60, ON + 72, SHIFT + 9])
    grammar = Grammar(CODEC, [prompt] * 3, [10**6] * 3)
    logits = grammar.constrain(_peaked(OFF + 61, OFF + 70, OFF + 66))  # 66: as near to 60 as to 72
    probs = logits.softmax(-1)
    assert probs[0, OFF + 60] > 0.99 and probs[1, OFF + 72] > 0.99 and probs[2, OFF + 60] > 0.99
    assert torch.isinf(logits[:, OFF + 61]).all() and torch.isinf(logits[:, OFF + 66]).all()
    # nothing sounding: an orphan note-off is masked and the rest keeps its proportions
    silent = Grammar(CODEC, [np.array([SHIFT + 9])], [10**6])
    raw = torch.randn(1, CODEC.vocab_size)
    out = silent.constrain(raw.clone())
    assert torch.isinf(out[0, OFF : OFF + 128]).all()
    keep = torch.isfinite(out[0])
    torch.testing.assert_close(out[0, keep].softmax(-1), raw[0, keep].softmax(-1))


def test_grammar_knows_the_notes_open_at_the_primers_cut():
    notes = [pretty_midi.Note(80, 60, 0.0, 5.0), pretty_midi.Note(80, 64, 0.5, 1.0)]
    primer = primer_at_cut(CODEC, notes, cut=2.0)
    grammar = Grammar(CODEC, [primer.tokens], [10**6], [300])
    assert grammar.open[0].nonzero().flatten().tolist() == [60]
    assert grammar.onset[0, 60].item() == -200  # struck 2 s before the cut
    logits = grammar.constrain(_peaked(OFF + 60))
    assert logits.argmax().item() == OFF + 60  # its note-off is legal, not an orphan


def test_grammar_closes_a_note_held_past_max_hold():
    grammar = Grammar(CODEC, [np.array([ON + 60, ON + 64])], [10**6], [150])
    grammar.advance(torch.tensor([OFF + 64]))
    # a 1 s shift would carry note 60 past its 1.5 s hold: it is cut to land on it
    assert grammar.advance(torch.tensor([SHIFT + 99])).item() == SHIFT + 99
    assert grammar.advance(torch.tensor([SHIFT + 99])).item() == SHIFT + 49
    assert grammar.elapsed.item() == 150 and grammar.overdue()[0].nonzero().flatten().tolist() == [60]
    logits = grammar.constrain(_peaked(SHIFT + 20))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [OFF + 60]  # forced note-off
    grammar.advance(torch.tensor([OFF + 60]))
    assert not grammar.open.any() and torch.isfinite(grammar.constrain(_peaked(SHIFT + 20))[0, SHIFT + 20])


def test_grammar_leaves_pedal_events_to_the_model():
    codec = EventCodec(CodecConfig(pedal="events"))
    grammar = Grammar(codec, [np.array([codec.note_on_offset + 60])], [10**6])
    for token in (codec.pedal_on_id, codec.pedal_off_id):
        assert grammar.constrain(_peaked(token, codec=codec)).argmax().item() == token
    assert torch.isinf(grammar.constrain(_peaked(codec.eos_id, codec=codec))[0, codec.eos_id])


def test_max_hold_follows_the_motif_within_the_corpus_bounds():
    def primer(length: float) -> Primer:
        return Primer(np.array([0]), 0.0, 1.0, 120.0, 0, [], [pretty_midi.Note(80, 60, 0.0, length)])

    assert max_hold_seconds(primer(0.2)) == MIN_HOLD_SECONDS
    assert max_hold_seconds(primer(2.0)) == pytest.approx(HOLD_FACTOR * 2.0)
    assert max_hold_seconds(primer(60.0)) == MAX_HOLD_SECONDS  # a pedal held through the motif


def test_no_note_is_held_longer_than_its_cap_in_a_generated_piece(model):
    primer = prepare_primer(CODEC, make_motif(), 4.0)
    res = generate_batch(model, CODEC, [(primer, SamplingParams(seconds=12.0, seed=3, num_samples=2))])[0]
    cap = max_hold_seconds(primer)
    for midi in res.midis:
        assert max(n.end - n.start for n in midi.instruments[0].notes) <= cap + 1e-6
