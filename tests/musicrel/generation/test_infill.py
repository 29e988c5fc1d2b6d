"""`infill_midi`: what lies outside the span comes back unchanged, new notes start inside it, the prompt holds
the music after and before it, and every bad request has its code. A tiny random-weight model with infill
tokens: what it writes is noise, but the rules hold for any tokens the grammar lets through."""

from __future__ import annotations

import copy

import numpy as np
import pretty_midi
import pytest
import torch

from musicrel.errors import InfillError, InvalidMidiError, MusicrelError
from musicrel.generation import fim
from musicrel.generation.infill import (
    MAX_SPAN_SECONDS,
    InfillParams,
    bar_span,
    infill,
    infill_midi,
    infill_prompt,
    infill_segments,
)
from musicrel.midi.codec import CodecConfig, EventCodec, shift_steps
from musicrel.model.config import ModelConfig
from musicrel.model.transformer import MusicTransformer
from tests.musicrel.conftest import midi_bytes

CODEC = EventCodec(CodecConfig(infill=True))


def infill_model(max_seq_len: int = 256, seed: int = 0) -> MusicTransformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=CODEC.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=max_seq_len
    )
    return MusicTransformer(cfg).eval()


@pytest.fixture(scope="module")
def model():
    return infill_model()


def band(seconds: float = 30.0) -> pretty_midi.PrettyMIDI:
    """Drums, a bass and a piano whose notes cross the span's edges, on a tempo that is not 120."""
    pm = pretty_midi.PrettyMIDI(initial_tempo=97.0)
    drums = pretty_midi.Instrument(program=0, is_drum=True, name="kit")
    bass = pretty_midi.Instrument(program=33, name="bass")
    piano = pretty_midi.Instrument(program=0, name="piano")
    t = 0.0
    k = 0
    while t < seconds:
        drums.notes.append(pretty_midi.Note(100, 36 + k % 3, t, t + 0.1))
        bass.notes.append(pretty_midi.Note(70 + k % 20, 36 + (k * 5) % 12, t + 0.013, t + 0.7))
        piano.notes.append(pretty_midi.Note(50 + k % 40, 60 + (k * 7) % 17, t + 0.21, t + 0.21 + 0.3 + k % 5))
        t += 0.5
        k += 1
    for inst in (drums, bass, piano):
        inst.control_changes.append(pretty_midi.ControlChange(7, 100, 0.0))
        pm.instruments.append(inst)
    return pm


def _key(n):
    return (n.pitch, n.velocity, n.start, n.end)


def check_preserved(source: pretty_midi.PrettyMIDI, out: pretty_midi.PrettyMIDI, start: float, end: float):
    """Every note of `source` that starts before `start` or at/after `end` is in `out`, identical, in its own
    track (name, program, drum); drum notes are all kept; nothing else of the source's notes is."""
    assert len(out.instruments) >= len(source.instruments)
    for a, b in zip(source.instruments, out.instruments, strict=False):
        assert (a.program, a.is_drum, a.name) == (b.program, b.is_drum, b.name)
        kept = [_key(n) for n in a.notes if a.is_drum or n.start < start or n.start >= end]
        got = [_key(n) for n in b.notes]
        got_set, kept_set = set(got), set(kept)  # a real track has thousands of notes: no list scans
        for k in kept:
            assert k in got_set, (a.name, k)
        new = [g for g in got if g not in kept_set]
        for pitch, _vel, s, e in new:  # anything else in an original track is new: inside the span
            assert start <= s < end and e <= end + 1e-9, (a.name, pitch, s, e)
        assert a.control_changes == b.control_changes or [
            (c.number, c.value, c.time) for c in a.control_changes
        ] == [(c.number, c.value, c.time) for c in b.control_changes]
    assert out.get_tempo_changes()[1].tolist() == source.get_tempo_changes()[1].tolist()


def test_outside_notes_come_back_unchanged_and_new_notes_start_inside_the_span(model):
    source = band()
    before = copy.deepcopy(source)
    result = infill(model, source, 12.0, 18.0, codec=CODEC, params=InfillParams(seed=0, num_samples=3))
    assert len(result.midis) == 3 and result.seed == 0
    assert [_key(n) for i in source.instruments for n in i.notes] == [
        _key(n) for i in before.instruments for n in i.notes
    ]  # the input object is not touched
    assert result.tracks == [1, 2]  # every track read: the bass and the piano, not the drums
    for out, notes, where in zip(result.midis, result.notes, result.note_tracks, strict=True):
        check_preserved(source, out, 12.0, 18.0)
        # several tracks with notes: the new ones go back to the file's own tracks, none is added
        assert len(out.instruments) == 3 and len(where) == len(notes) and set(where) <= {1, 2}
        for t in (1, 2):
            inside = [_key(n) for n in out.instruments[t].notes if 12.0 <= n.start < 18.0]
            assert sorted(inside) == sorted(_key(n) for n, w in zip(notes, where, strict=True) if w == t)
        assert notes, "a random model writes some notes in 6 s"
        for n in notes:
            assert 12.0 <= n.start < 18.0 and n.start < n.end <= 18.0
    # the notes that started in the gap are gone
    assert result.removed == sum(12.0 <= n.start < 18.0 for i in source.instruments[1:] for n in i.notes)
    # the same seed gives the same music; the samples differ
    again = infill_midi(model, source, 12.0, 18.0, codec=CODEC, params=InfillParams(seed=0, num_samples=3))
    assert [
        sorted(_key(n) for i in m.instruments[1:] for n in i.notes if 12.0 <= n.start < 18.0) for m in again
    ] == [sorted(_key(n) for n in m) for m in result.notes]
    assert len({tuple(_key(n) for n in m) for m in result.notes}) > 1


def test_a_note_sounding_into_the_gap_is_kept_whole_and_not_restruck_while_it_sounds(model):
    pm = pretty_midi.PrettyMIDI()
    piano = pretty_midi.Instrument(program=0)
    piano.notes = [pretty_midi.Note(80, 60 + i % 12, i * 0.25, i * 0.25 + 0.2) for i in range(40)]
    long = pretty_midi.Note(90, 48, 9.0, 14.0)  # across the gap's start
    across = pretty_midi.Note(90, 50, 9.5, 20.0)  # across the whole gap
    late = pretty_midi.Note(70, 72, 11.0, 11.5)  # starts in the gap: regenerated
    tail = [pretty_midi.Note(80, 64 + i % 5, 13.0 + i * 0.3, 13.2 + i * 0.3) for i in range(10)]
    piano.notes += [long, across, late, *tail]
    pm.instruments.append(piano)
    seg = infill_segments(CODEC, pm, 10.0, 12.5)
    # the prompt knows 48 and 50 sound at the gap's start: their note-ons are in the past, their offs are not
    from musicrel.midi.codec import open_pitches

    assert open_pitches(CODEC, seg.past)[[48, 50]].all()
    for seed in range(4):
        (out,) = infill_midi(model, pm, 10.0, 12.5, codec=CODEC, params=InfillParams(seed=seed))
        (inst,) = out.instruments  # one instrument with notes: the new notes join it
        keys = [_key(n) for n in inst.notes]
        assert _key(long) in keys and _key(across) in keys and _key(late) not in keys
        for n in inst.notes:
            if n.pitch in (48, 50) and _key(n) not in (_key(long), _key(across)):
                held = long if n.pitch == 48 else across
                assert not (held.start <= n.start < held.end) and not (n.start < held.start < n.end)


def test_the_prompt_is_future_then_past_then_fill_and_the_gap_ends_at_end():
    pm = band(20.0)
    seg = infill_segments(CODEC, pm, 6.0, 11.0)
    steps = shift_steps(CODEC)
    assert int(steps[seg.past].sum()) == 600 and int(steps[seg.gap].sum()) == 500
    prompt = infill_prompt(CODEC, seg, 256)
    t = prompt.tokens
    assert t[0] == CODEC.future_id and t[-1] == CODEC.fill_id
    assert list(t).count(CODEC.past_id) == 1
    head = fim.shifts(CODEC, seg.gap_steps)
    assert np.array_equal(t[1 : 1 + len(head)], head)
    assert np.flatnonzero(t == CODEC.past_id)[0] <= int(256 * fim.FUTURE_SHARE)
    assert len(t) <= 256 - 256 // 4
    # the past kept is the end of the true past, and the future the start of the true future
    past = t[prompt.roles == fim.PAST]
    assert np.array_equal(past, seg.past[len(seg.past) - len(past) :])
    future = t[prompt.roles == fim.FUTURE]
    assert np.array_equal(future, seg.future[: len(future)])


@pytest.mark.parametrize(
    ("start", "end", "code"),
    [
        (18.0, 12.0, "invalid_span"),
        (12.0, 12.0, "invalid_span"),
        (-1.0, 2.0, "invalid_span"),
        ("12", 18.0, "invalid_span"),
        (12.0, float("nan"), "invalid_span"),
        (True, 18.0, "invalid_span"),
        (12.0, 12.001, "invalid_span"),
        (1.0, 2.0 + MAX_SPAN_SECONDS, "span_too_long"),
        (40.0, 45.0, "span_outside_music"),
        (0.0, 5.0, "nothing_before"),
        (25.0, 29.75, "nothing_after"),
    ],
)
def test_bad_spans_have_their_codes(model, start, end, code):
    with pytest.raises(InfillError) as err:
        infill_midi(model, band(30.0), start, end, codec=CODEC)
    assert err.value.code == code
    assert isinstance(err.value, MusicrelError)


def test_a_model_without_infill_tokens_cannot_infill():
    plain = EventCodec()
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=plain.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=64)
    with pytest.raises(InfillError) as err:
        infill_midi(MusicTransformer(cfg).eval(), band(), 12.0, 18.0, codec=plain)
    assert err.value.code == "model_cannot_infill"


def test_bad_midi_and_bad_params_are_typed(model):
    with pytest.raises(InvalidMidiError):
        infill_midi(model, b"not a midi file at all", 1.0, 2.0, codec=CODEC)
    with pytest.raises(MusicrelError) as err:
        InfillParams(temperature=0)
    assert err.value.code == "invalid_params"


def test_bytes_in_and_a_written_file_reads_back_with_the_outside_notes(model, tmp_path):
    source = band(24.0)
    (out,) = infill_midi(model, midi_bytes(source), 8.0, 14.0, codec=CODEC, params=InfillParams(seed=1))
    out.write(str(tmp_path / "out.mid"))
    back = pretty_midi.PrettyMIDI(str(tmp_path / "out.mid"))
    reread = pretty_midi.PrettyMIDI(__import__("io").BytesIO(midi_bytes(source)))
    for a, b in zip(reread.instruments, back.instruments, strict=False):
        got = {(n.pitch, n.velocity, round(n.start, 2), round(n.end, 2)) for n in b.notes}
        for n in a.notes:
            if a.is_drum or n.start < 8.0 or n.start >= 14.0:
                assert (n.pitch, n.velocity, round(n.start, 2), round(n.end, 2)) in got


def test_real_files_keep_every_outside_note(model, real_midi_files, read_real_midi):
    for path in real_midi_files[:4]:
        source = read_real_midi(path)
        notes = CODEC.to_notes(source)
        length = max(n.end for n in notes)
        start, end = min(12.0, length / 3), min(18.0, length / 3 + 6.0)
        (out,) = infill_midi(model, path, start, end, codec=CODEC, params=InfillParams(seed=0))
        check_preserved(source, out, start, end)


def test_infill_steps_yields_after_each_token_and_ends_with_infills_result(model):
    """The engine's form: a step per token, each sample's tokens so far at each yield; run to its end it is
    `infill` (same seed, same tokens, same files)."""
    from musicrel.generation.infill import infill_steps

    source = band(20.0)
    params = InfillParams(seed=3, num_samples=2)
    steps = infill_steps(model, source, 6.0, 9.0, codec=CODEC, params=params)
    sizes = []
    while True:
        try:
            rows = next(steps)
        except StopIteration as done:
            result = done.value
            break
        sizes.append([len(r) for r in rows])
    assert len(sizes) > 10
    for before, after in zip(sizes, sizes[1:], strict=False):  # one token per live row per step
        assert all(0 <= b - a <= 1 for a, b in zip(before, after, strict=True))
    assert max(len(t) for t in result.tokens) == max(sizes[-1]) + 1  # the last token comes after the yield
    whole = infill(model, source, 6.0, 9.0, codec=CODEC, params=params)
    assert [t.tolist() for t in whole.tokens] == [t.tolist() for t in result.tokens]
    assert [[_key(n) for n in m] for m in whole.notes] == [[_key(n) for n in m] for m in result.notes]


def test_infill_steps_raises_a_bad_span_at_its_first_step(model):
    from musicrel.generation.infill import infill_steps

    steps = infill_steps(model, band(30.0), 0.0, 5.0, codec=CODEC)  # nothing checked yet
    with pytest.raises(InfillError) as err:
        next(steps)
    assert err.value.code == "nothing_before"


# ---------------------------------------------------------------- the decode loop
def _fixed_batch_reference(model, source, start, end, params: InfillParams) -> list[np.ndarray]:
    """The gap as it was decoded before infilling moved onto DecodeBatch (issue 33): `decode.generate`'s fixed
    batch of rows reading the infill prompt under the continuation grammar (its state the past's, its limit
    the gap's length), the rows dropped by `collect_rows` once their gap is written. Kept here as the
    reference the batch decoder is held to."""
    from musicrel.generation.decode import collect_rows, generate
    from musicrel.generation.grammar import Grammar
    from musicrel.generation.infill import _hold_steps
    from musicrel.generation.sampling import TOKENS_PER_SECOND_CAP, row_seed

    B = params.num_samples
    seg = infill_segments(CODEC, source, start, end)
    prompt = infill_prompt(CODEC, seg, model.cfg.max_seq_len)
    grammar = Grammar(CODEC, [seg.past] * B, [seg.gap_steps] * B, [_hold_steps(CODEC, seg.notes)] * B)
    budget = int(seg.gap_steps * CODEC.config.step_ms / 1000.0 * TOKENS_PER_SECOND_CAP) + 64
    tokens = torch.as_tensor(prompt.tokens, dtype=torch.long)[None].expand(B, -1).contiguous()
    generators = [torch.Generator().manual_seed(row_seed(params.seed, i)) for i in range(B)]
    gen = generate(
        model, tokens, budget, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
        generators=generators, grammar=grammar,
    )  # fmt: skip
    going = lambda: grammar.elapsed < grammar.limit  # noqa: E731
    return [np.asarray(r, dtype=np.int64) for r in collect_rows(gen, B, going)]


@pytest.mark.parametrize(
    ("window", "attention", "span", "options"),
    [
        (256, "skew", (12.0, 18.0), {"seed": 0, "num_samples": 3}),
        (256, "absolute", (10.0, 14.5), {"seed": 7, "num_samples": 2, "temperature": 0.8, "top_p": 0.9}),
        (64, "skew", (8.0, 16.0), {"seed": 1, "num_samples": 2}),
        (64, "absolute", (5.0, 12.0), {"seed": 11, "num_samples": 3, "temperature": 1.2}),
        (64, "t5", (8.0, 15.0), {"seed": 5, "num_samples": 2, "top_k": 20}),
    ],
)  # fmt: skip
def test_the_batch_decoder_draws_the_gap_the_fixed_batch_decoder_drew(window, attention, span, options):
    """Same seeds, same tokens: rows leaving at different steps, and (a 64-token window, whose prompt takes
    half of it) windows sliding while the gap is written."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=CODEC.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=window,
        attention=attention,
    )  # fmt: skip
    m = MusicTransformer(cfg).eval()
    source, params = band(30.0), InfillParams(**options)
    result = infill(m, source, *span, codec=CODEC, params=params)
    expected = _fixed_batch_reference(m, source, *span, params)
    assert result.seed == params.seed and len(result.tokens) == len(expected) == params.num_samples
    for a, b in zip(result.tokens, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    assert len({len(t) for t in result.tokens}) > 1  # the rows left at different steps
    slid = result.prompt_tokens + max(len(t) for t in result.tokens) > window
    assert slid == (window == 64) and bool(result.warnings) == slid  # the small window slid, and says so


def test_infill_job_is_a_decode_job_of_the_prompt_under_the_pasts_grammar(model):
    """The job: the infill prompt, a row per sample whose grammar starts from the past (its sounding notes)
    with the gap's length as its time limit; the same seed as asked, or a drawn one."""
    from musicrel.generation.decode_job import DecodeJob
    from musicrel.generation.infill import infill_job
    from musicrel.midi.codec import open_pitches

    seg = infill_segments(CODEC, band(20.0), 6.0, 11.0)
    job = infill_job(model, CODEC, seg, InfillParams(seed=4, num_samples=3, top_k=30))
    assert isinstance(job, DecodeJob) and job.num_samples == 3 and job.seed == 4 and job.top_k == 30
    assert (
        np.array_equal(job.tokens, infill_prompt(CODEC, seg, 256).tokens) and job.tokens[-1] == CODEC.fill_id
    )
    assert job.grammar.limit.tolist() == [seg.gap_steps] * 3 and job.grammar.elapsed.tolist() == [0] * 3
    assert np.array_equal(job.grammar.open[0].numpy(), open_pitches(CODEC, seg.past))
    drawn = infill_job(model, CODEC, seg, InfillParams(num_samples=1)).seed
    assert isinstance(drawn, int)


def _in_key(pitch_classes, tonic_pcs) -> pretty_midi.PrettyMIDI:
    """A piano part on `pitch_classes` around the span 10-14 s and on `tonic_pcs` inside it: 'auto' must read
    the key of the music around the gap, not of the notes the gap replaces."""
    pm = pretty_midi.PrettyMIDI()
    piano = pretty_midi.Instrument(program=0)
    for k in range(48):
        t = 0.5 * k
        pcs = tonic_pcs if 10.0 <= t < 14.0 else pitch_classes
        piano.notes.append(pretty_midi.Note(80, 60 + pcs[k % len(pcs)], t, t + 0.45))
    pm.instruments.append(piano)
    return pm


def test_controls_steer_the_new_notes_and_auto_reads_the_music_around_the_gap(model):
    from musicrel.generation.controls import Controls, scale_pitch_classes

    c_major = [0, 4, 7, 0, 2, 5, 9, 11]  # C major around the gap, F# major (its tritone) inside
    source = _in_key(c_major, [6, 10, 1, 3, 5, 8])
    params = InfillParams(seed=3, num_samples=3, controls=Controls(key="auto", key_strength="only"))
    result = infill(model, source, 10.0, 14.0, codec=CODEC, params=params)
    assert result.controls == {"key": "C:major", "key_strength": "only", "key_detected": True}
    scale = scale_pitch_classes((0, "major"))
    new = [n for notes in result.notes for n in notes]
    assert new and all(n.pitch % 12 in scale for n in new)
    free = infill(model, source, 10.0, 14.0, codec=CODEC, params=InfillParams(seed=3, num_samples=3))
    assert free.controls is None  # and the random model, unsteered, strays outside the key
    assert any(n.pitch % 12 not in scale for notes in free.notes for n in notes)

    ranged = InfillParams(seed=4, num_samples=2, controls=Controls(low_note=60, high_note=64))
    result = infill(model, source, 10.0, 14.0, codec=CODEC, params=ranged)
    assert all(60 <= n.pitch <= 64 for notes in result.notes for n in notes)
    assert result.controls == {"low_note": 60, "high_note": 64}
    check_preserved(source, result.midis[0], 10.0, 14.0)


def test_infill_controls_refuse_program_and_an_empty_controls_steers_nothing():
    from musicrel.generation.controls import ControlError, Controls

    with pytest.raises(ControlError) as err:
        InfillParams(controls=Controls(program=40))
    assert err.value.code == "invalid_controls" and "program" in str(err.value)
    assert InfillParams(controls=Controls()).controls is None
    # as SamplingParams and AccompanimentParams take them: a dict is Controls' JSON form, nothing else
    assert InfillParams(controls={"key": "C:major"}).controls == Controls(key="C:major")
    with pytest.raises(MusicrelError) as err:
        InfillParams(controls="C:major")
    assert err.value.code == "invalid_params"


def test_bar_span_counts_bars_by_the_files_tempo_and_time_signatures():
    pm = pretty_midi.PrettyMIDI(initial_tempo=100)  # a 4/4 bar is 2.4 s, a 3/4 bar 1.8 s
    inst = pretty_midi.Instrument(program=0)
    inst.notes = [pretty_midi.Note(80, 60, 0.5 * k, 0.5 * k + 0.4) for k in range(40)]  # to 19.9 s
    pm.instruments.append(inst)
    assert bar_span(pm, 2, 3) == pytest.approx((2.4, 7.2), abs=1e-4)
    assert bar_span(pm, 4, 4) == pytest.approx((7.2, 9.6), abs=1e-4)
    # the last bar that starts in the music (9, at 19.2 s) has no bar after it: nothing left to end on
    assert bar_span(pm, 5, 8)[1] == pytest.approx(19.2, abs=1e-4)
    with pytest.raises(InfillError, match="has 9 bars") as exc:
        bar_span(pm, 5, 9)
    assert exc.value.code == "span_outside_music"
    pm.time_signature_changes = [pretty_midi.TimeSignature(4, 4, 0.0), pretty_midi.TimeSignature(3, 4, 4.8)]
    assert bar_span(pm, 3, 4) == pytest.approx((4.8, 8.4), abs=1e-4)  # bars 3 and 4 are in 3/4
    for first, last in ((0, 2), (3, 2), (1.5, 2), ("2", 3)):
        with pytest.raises(InfillError) as exc:
            bar_span(pm, first, last)
        assert exc.value.code == "invalid_span", (first, last)


def test_the_controls_read_the_tempo_the_gap_is_at():
    """Chords in beats inside a gap at 150 bpm of a file that starts at 60: the gap's tempo."""
    from musicrel.generation.controls import Controls
    from musicrel.generation.infill import around_gap
    from tests.musicrel.midi.test_files import tempo_map_file

    data = tempo_map_file(notes_every=0.5)
    assert around_gap(CODEC, infill_segments(CODEC, data, 10.2, 11.8)).tempo == pytest.approx(150.0)
    around = around_gap(CODEC, infill_segments(CODEC, data, 4.0, 8.0))
    assert around.tempo == pytest.approx(60.0)
    chords = Controls(chords="C:2b").resolve(around, CODEC.config.step_ms).applied["chords"]
    assert chords[0]["seconds"] == pytest.approx(2.0)
