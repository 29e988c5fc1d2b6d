"""Accompanying a melody: the melody tokens of the codec, the grammar that places the melody, the library
entry and its errors, the command."""

from __future__ import annotations

import json

import numpy as np
import pretty_midi
import pytest
import torch

from musicrel.cli import main
from musicrel.errors import ConfigError, GenerationError, InvalidMidiError
from musicrel.generation.accompaniment import (
    ACCOMPANIMENT_NAME,
    AccompanimentParams,
    MelodyGrammar,
    accompany_midi,
    accompany_notes,
    melody_notes,
    melody_schedule,
)
from musicrel.midi.codec import CodecConfig, EventCodec, shift_steps
from musicrel.model.config import ModelConfig
from musicrel.model.transformer import MusicTransformer

CODEC = EventCodec(CodecConfig(melody=True, tracks=[0, 1]))

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=CODEC.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=64)
    return MusicTransformer(cfg).eval()


def tune(n: int = 12, start: float = 0.5, step: float = 0.4) -> list:
    return [
        pretty_midi.Note(90, 64 + (k * 5) % 12, start + k * step, start + k * step + 0.3) for k in range(n)
    ]


def song(melody, part=(), extra_track: bool = False) -> pretty_midi.PrettyMIDI:
    pm = pretty_midi.PrettyMIDI(initial_tempo=100)
    mel = pretty_midi.Instrument(0, name="MELODY")
    mel.notes = list(melody)
    pm.instruments.append(mel)
    if part or extra_track:
        piano = pretty_midi.Instrument(0, name="PIANO")
        piano.notes = list(part) or [pretty_midi.Note(60, 48, 0.0, 1.0)]
        pm.instruments.append(piano)
    return pm


def clock(tokens) -> np.ndarray:
    """The step at which each token happens."""
    return np.cumsum(shift_steps(CODEC)[np.asarray(tokens)])


# ---------------------------------------------------------------- codec
def test_melody_tokens_sit_before_the_specials_and_decode_to_nothing():
    plain = EventCodec()
    assert CODEC.melody_on_offset == plain.num_events and CODEC.vocab_size == plain.vocab_size + 256
    assert CODEC.pad_id == CODEC.melody_off_offset + 128  # `token >= pad_id` still means a special
    part = [pretty_midi.Note(70, 48, 0.0, 1.0), pretty_midi.Note(70, 52, 0.5, 1.0)]
    tokens = CODEC.encode_with_melody(tune(3), part)
    assert CODEC.is_melody(tokens).sum() == 6
    assert [(n.pitch, n.start, n.end) for n in CODEC.decode_notes(tokens)] == [(48, 0.0, 1.0), (52, 0.5, 1.0)]


def test_melody_events_come_first_at_their_step_and_transpose_with_the_part():
    melody = [pretty_midi.Note(90, 72, 0.5, 1.0)]
    part = [pretty_midi.Note(70, 48, 0.5, 1.0)]
    tokens = CODEC.encode_with_melody(melody, part)
    at = [t for t, c in zip(tokens, clock(tokens), strict=True) if c == 50 and not CODEC.is_time_shift(t)]
    assert at[0] == CODEC.melody_on_offset + 72  # before the part's velocity and note-on
    up = CODEC.transpose(tokens, 2)
    assert CODEC.melody_on_offset + 74 in up and CODEC.melody_off_offset + 74 in up
    assert [n.pitch for n in CODEC.decode_notes(up)] == [50]


def test_a_melody_lead_places_the_melody_that_far_ahead_and_the_grammar_hears_it_in_real_time():
    lead = EventCodec(CodecConfig(melody=True, tracks=[0, 1], melody_lead_ms=500))
    melody, part = [pretty_midi.Note(90, 72, 1.5, 2.0)], [pretty_midi.Note(70, 48, 1.5, 2.0)]
    tokens = lead.encode_with_melody(melody, part)
    steps = np.cumsum(shift_steps(lead)[tokens])
    assert steps[tokens == lead.melody_on_offset + 72].tolist() == [100]  # sounds at 150, placed at 100
    assert steps[tokens == lead.note_on_offset + 48].tolist() == [150]
    g = MelodyGrammar(lead, [melody_schedule(lead, melody)], [500])
    assert g.tune_start.tolist() == [[150]] and g.tune_end.tolist() == [[200]]


def test_a_melody_codec_reads_the_first_track_as_the_melody():
    melody, part = tune(4), [pretty_midi.Note(70, 48, 0.0, 2.0)]
    encoded = CODEC.encode(song(melody, part))
    assert np.array_equal(encoded, CODEC.encode_with_melody(melody, part))
    with pytest.raises(ConfigError, match="at least two"):
        CodecConfig(melody=True)
    with pytest.raises(ConfigError, match="no melody tokens"):
        EventCodec().encode_with_melody(melody, part)


# ---------------------------------------------------------------- the melody
def test_melody_notes_trims_legato_and_refuses_chords_silence_and_length():
    legato = [pretty_midi.Note(90, 60, 0.0, 0.6), pretty_midi.Note(90, 62, 0.5, 1.0)]
    out = melody_notes(song(legato), 0)
    assert [(n.start, n.end) for n in out] == [(0.0, 0.5), (0.5, 1.0)]
    chords = [pretty_midi.Note(90, p, k * 0.5, k * 0.5 + 0.4) for k in range(4) for p in (60, 64, 67)]
    with pytest.raises(InvalidMidiError) as err:
        melody_notes(song(chords), 0)
    assert err.value.code == "melody_has_chords"
    with pytest.raises(InvalidMidiError) as err:
        melody_notes(song(tune(3, start=5.0)), 0, max_seconds=4.0)
    assert err.value.code == "too_long"


def test_the_melody_track_must_be_named_when_the_file_has_several(model):
    with pytest.raises(InvalidMidiError) as err:
        accompany_midi(model, CODEC, song(tune(), extra_track=True))
    assert err.value.code == "which_track" and "0: MELODY, 1: PIANO" in str(err.value)
    with pytest.raises(InvalidMidiError) as err:
        accompany_midi(model, CODEC, song(tune()), track=5)
    assert err.value.code == "no_such_track"
    with pytest.raises(InvalidMidiError) as err:
        accompany_midi(model, CODEC, pretty_midi.PrettyMIDI())
    assert err.value.code == "no_notes"


# ---------------------------------------------------------------- the grammar
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_melody_event_is_placed_at_its_step_in_order_and_never_drawn_otherwise(model, seed):
    melody = tune(10)
    steps, toks = melody_schedule(CODEC, melody)
    params = AccompanimentParams(seed=seed, num_samples=2, temperature=1.5)
    outputs, used, _, _ = accompany_notes(model, CODEC, melody, params)
    assert used == seed
    end = int(round((max(n.end for n in melody) + 1.0) * 100))
    for tokens in outputs:
        placed = CODEC.is_melody(tokens)
        assert np.array_equal(tokens[placed], toks)
        assert np.array_equal(clock(tokens)[placed], steps)
        assert clock(tokens)[-1] >= end  # the accompaniment lasts past the melody
        assert not ((tokens >= CODEC.pad_id).any())


def test_the_model_cannot_draw_a_melody_token():
    g = MelodyGrammar(CODEC, [melody_schedule(CODEC, tune(2, start=1.5))], [500])
    logits = torch.zeros(1, CODEC.vocab_size)
    logits[0, CODEC.melody_on_offset : CODEC.pad_id] = 50.0  # the model wants to play the melody itself
    out = g.constrain(logits)
    assert torch.isinf(out[0, CODEC.melody_on_offset : CODEC.pad_id]).all()
    # a shift that would cross the melody's first note (step 150) is cut to land on it; it is then the only
    # token allowed
    g.advance(torch.tensor([CODEC.time_shift_offset + 99]))  # 100 steps
    token = g.advance(torch.tensor([CODEC.time_shift_offset + 99]))
    assert int(g.elapsed) == 150 and int(token) == CODEC.time_shift_offset + 49
    allowed = torch.isfinite(g.constrain(torch.zeros(1, CODEC.vocab_size)))[0].nonzero().squeeze(1)
    assert allowed.tolist() == [CODEC.melody_on_offset + 64]


def test_a_melody_note_the_model_guesses_where_none_is_due_becomes_waiting():
    g = MelodyGrammar(CODEC, [melody_schedule(CODEC, tune(2, start=1.5))], [500])
    logits = torch.full((1, CODEC.vocab_size), -30.0)
    logits[0, CODEC.note_on_offset + 60] = 0.0  # a note, or
    logits[0, CODEC.time_shift_offset + 9] = 0.0  # a short wait, or
    logits[0, CODEC.melody_on_offset + 64] = np.log(2.0)  # (twice as likely) the melody's next note now
    probs = g.constrain(logits)[0].softmax(dim=-1)
    # the melody's mass goes to waiting, not to the note: a wait now 3x as likely as the note
    assert probs[CODEC.time_shift_offset + 9] / probs[CODEC.note_on_offset + 60] == pytest.approx(
        3.0, rel=1e-3
    )
    assert probs[CODEC.melody_on_offset : CODEC.pad_id].sum() == 0


def test_the_grammar_hears_the_melody_ahead_without_changing_how_many_notes(monkeypatch):
    from musicrel.generation import accompaniment

    melody = [pretty_midi.Note(90, 64, 0.5, 1.0)]  # E, half a second from now

    def note_ons():
        g = MelodyGrammar(CODEC, [melody_schedule(CODEC, melody)], [500])
        return g, g.constrain(torch.zeros(1, CODEC.vocab_size))[
            0, CODEC.note_on_offset : CODEC.note_on_offset + 128
        ]

    g, on = note_ons()
    assert float(on[52] - on[48]) == pytest.approx(accompaniment.TUNE_BIAS, abs=1e-4)  # E gains over C
    assert float(on[48] - on[53]) == pytest.approx(
        accompaniment.CLASH_BIAS, abs=1e-4
    )  # F, a semitone up, loses
    monkeypatch.setattr(accompaniment, "TUNE_BIAS", 0.0)
    monkeypatch.setattr(accompaniment, "CLASH_BIAS", 0.0)
    _, deaf = note_ons()
    assert float(on.logsumexp(0)) == pytest.approx(float(deaf.logsumexp(0)), abs=1e-4)  # as many notes
    g.advance(torch.tensor([CODEC.time_shift_offset + 99]))  # a 1 s wait is cut where the E comes in
    assert int(g.elapsed) == 50


def test_a_model_without_melody_tokens_cannot_accompany():
    with pytest.raises(GenerationError) as err:
        MelodyGrammar(EventCodec(), [melody_schedule(CODEC, tune(2))], [100])
    assert err.value.code == "no_melody"


# ---------------------------------------------------------------- the decode loop
def _fixed_batch_reference(model, notes, params: AccompanimentParams) -> list[np.ndarray]:
    """The accompaniment as it was decoded before it moved onto DecodeBatch (issue 33): `decode.generate`'s
    fixed batch of rows from bos, the rows dropped by `collect_rows` once the melody is placed and the time
    limit reached. Kept here as the reference the batch decoder is held to."""
    import math

    from musicrel.generation.accompaniment import TAIL_SECONDS
    from musicrel.generation.decode import collect_rows, generate
    from musicrel.generation.grammar import MAX_HOLD_SECONDS
    from musicrel.generation.sampling import TOKENS_PER_SECOND_CAP, row_seed

    B, step_ms, end = params.num_samples, CODEC.config.step_ms, max(n.end for n in notes)
    limit = math.ceil((end + TAIL_SECONDS) * 1000.0 / step_ms)
    schedule = melody_schedule(CODEC, notes)
    controls = None
    if params.controls is not None:
        from musicrel.generation.primer import Primer

        anchor = Primer(np.array([CODEC.bos_id]), 0.0, 0.0, 120.0, 0, [], motif_notes=list(notes))
        controls = [params.controls.resolve(anchor, step_ms)] * B
    hold = round(MAX_HOLD_SECONDS * 1000.0 / step_ms)
    grammar = MelodyGrammar(CODEC, [schedule] * B, [limit] * B, [hold] * B, controls=controls)
    budget = int((end + TAIL_SECONDS) * TOKENS_PER_SECOND_CAP) + len(schedule[1]) + 64
    generators = [torch.Generator().manual_seed(row_seed(params.seed, i)) for i in range(B)]
    gen = generate(
        model, torch.full((B, 1), CODEC.bos_id), budget, temperature=params.temperature, top_k=params.top_k,
        top_p=params.top_p, generators=generators, grammar=grammar,
    )  # fmt: skip
    going = lambda: ~(grammar.melody_done() & (grammar.elapsed >= grammar.limit))  # noqa: E731
    return [np.asarray(r, dtype=np.int64) for r in collect_rows(gen, B, going)]


@pytest.mark.parametrize(
    ("attention", "options"),
    [
        ("skew", {"seed": 0, "num_samples": 2}),
        ("absolute", {"seed": 5, "num_samples": 3, "temperature": 0.8, "top_k": 40, "top_p": 0.9}),
        ("skew", {"seed": 2, "num_samples": 2, "controls": {"density": 4.0, "key": "A:minor"}}),
    ],
)
def test_the_batch_decoder_draws_the_tokens_the_fixed_batch_decoder_drew(attention, options):
    """Same seeds, same tokens: rows leaving at different steps, and (a 64-token window) windows sliding."""
    from musicrel.generation.controls import Controls

    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=CODEC.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=64,
        attention=attention,
    )  # fmt: skip
    m = MusicTransformer(cfg).eval()
    if "controls" in options:
        options = {**options, "controls": Controls(**options["controls"])}
    params = AccompanimentParams(**options)
    melody = tune(24)
    got, seed, _, _ = accompany_notes(m, CODEC, melody, params)
    expected = _fixed_batch_reference(m, melody, params)
    assert seed == params.seed and len(got) == len(expected) == params.num_samples
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    assert max(len(t) for t in got) > cfg.max_seq_len * 3 // 2  # the window slid (twice)
    assert len({len(t) for t in got}) > 1  # the rows left at different steps


def test_accompany_steps_yields_after_every_token_but_the_last(model):
    from musicrel.generation.accompaniment import accompany_notes_steps

    steps = accompany_notes_steps(model, CODEC, tune(6), AccompanimentParams(seed=1, num_samples=2))
    yields = 0
    while True:
        try:
            next(steps)
            yields += 1
        except StopIteration as done:
            tokens = done.value[0]
            break
    assert yields == max(len(t) for t in tokens) - 1


def test_accompaniments_of_different_melodies_share_a_batch_and_draw_what_they_draw_alone(model):
    """MelodyGrammar rows join a running batch (their schedules padded): each job's tokens are its own."""
    from musicrel.generation.accompaniment import accompaniment_job
    from musicrel.generation.decode_batch import DecodeBatch

    melodies = [tune(6), tune(14, start=0.2, step=0.3), tune(3, start=1.0)]
    params = [AccompanimentParams(seed=s, num_samples=n) for s, n in ((3, 2), (4, 1), (5, 2))]
    alone = [accompany_notes(model, CODEC, mel, p)[0] for mel, p in zip(melodies, params, strict=True)]
    jobs = [accompaniment_job(model, CODEC, mel, p) for mel, p in zip(melodies, params, strict=True)]
    batch = DecodeBatch(model, CODEC, max_rows=5)
    ids = batch.admit(jobs[:2])
    results: dict = {}
    for _ in range(10):
        results.update(batch.step())
    ids += batch.admit(jobs[2:])  # joins mid-flight
    while batch.rows:
        results.update(batch.step())
    for tokens, job_id in zip(alone, ids, strict=True):
        assert len(results[job_id].tokens) == len(tokens)
        for a, b in zip(results[job_id].tokens, tokens, strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_melody_grammar_does_not_join_continuation_rows(model):
    from musicrel.generation.accompaniment import accompaniment_job
    from musicrel.generation.decode_batch import DecodeBatch
    from musicrel.generation.primer import Primer
    from musicrel.generation.sampling import SamplingParams

    batch = DecodeBatch(model, CODEC, max_rows=4)
    primer = Primer(np.array([CODEC.bos_id]), 0.0, 0.0, 120.0, 0, [])
    batch.admit([(primer, SamplingParams(seconds=1.0, seed=0, num_samples=1))])
    with pytest.raises(GenerationError) as err:
        batch.admit([accompaniment_job(model, CODEC, tune(4), AccompanimentParams(seed=0))])
    assert err.value.code == "invalid_params" and len(batch.rows) == 1


# ---------------------------------------------------------------- the library and the command
def test_the_answer_keeps_the_melody_track_and_adds_the_accompaniment(model):
    melody = tune(8)
    pm = song(melody, extra_track=True)
    from musicrel.generation.controls import Controls

    result = accompany_midi(
        model, CODEC, pm, track=0, params=AccompanimentParams(seed=4, controls=Controls(program=33))
    )
    (answer,) = result.midis
    assert [i.name for i in answer.instruments] == ["MELODY", ACCOMPANIMENT_NAME]
    assert [(n.pitch, n.start, n.end) for n in answer.instruments[0].notes] == [
        (n.pitch, n.start, n.end) for n in melody
    ]
    assert answer.instruments[1].program == 33
    assert len(answer.instruments[1].notes) == len(result.notes[0]) > 0
    assert result.seconds >= melody[-1].end
    again = accompany_midi(
        model, CODEC, pm, track=0, params=AccompanimentParams(seed=4, controls=Controls(program=33))
    )

    def key(notes):
        return [(n.pitch, n.velocity, n.start, n.end) for n in notes]

    assert key(again.notes[0]) == key(result.notes[0])  # a seed gives the same accompaniment


def test_a_drawn_seed_is_in_range_and_repeats_the_accompaniment(model):
    from musicrel.generation.sampling import MAX_SEED

    pm = song(tune(6))
    first = accompany_midi(model, CODEC, pm, track=0, params=AccompanimentParams(num_samples=2))
    assert 0 <= first.seed <= MAX_SEED
    again = accompany_midi(
        model, CODEC, pm, track=0, params=AccompanimentParams(seed=first.seed, num_samples=2)
    )

    def keys(result):
        return [[(n.pitch, n.velocity, n.start, n.end) for n in notes] for notes in result.notes]

    assert again.seed == first.seed and keys(again) == keys(first)


def test_accompany_command_writes_answers_and_records_bad_files(tmp_path, model, capsys):
    from musicrel.model.checkpoint import save_model

    folder = tmp_path / "model"
    save_model(model, folder, codec=CODEC)
    melodies = tmp_path / "in"
    melodies.mkdir()
    song(tune(6)).write(str(melodies / "tune.mid"))
    (melodies / "broken.mid").write_bytes(b"MThd nonsense")
    out = tmp_path / "out"
    code = main(["accompany", "--checkpoint", str(folder), "--input", str(melodies), "--out", str(out),
                 "--seed", "1", "--threads", "1", "--quiet"])  # fmt: skip
    assert code == 0
    summary = {
        r["input"].rsplit("/", 1)[1]: r for r in json.loads((out / "summary.json").read_text())["files"]
    }
    assert summary["broken.mid"]["error"]["code"] in ("not_midi", "truncated")
    written = pretty_midi.PrettyMIDI(str(out / "tune.sample0.mid"))
    assert [i.name for i in written.instruments] == ["MELODY", ACCOMPANIMENT_NAME]
    assert "accompanied 1 of 2" in capsys.readouterr().out


def test_accompaniment_params_take_sampling_params_defaults_and_checks():
    import dataclasses

    from musicrel.errors import GenerationError
    from musicrel.generation.sampling import MAX_SEED, SamplingParams

    mine, theirs = AccompanimentParams(), SamplingParams()
    for f in dataclasses.fields(AccompanimentParams):
        if f.name != "top_p":  # the accompaniment's own, measured (melody.py)
            assert getattr(mine, f.name) == getattr(theirs, f.name), f.name
    assert mine.top_p == 0.95 != theirs.top_p
    with pytest.raises(GenerationError, match="seed") as info:
        AccompanimentParams(seed=MAX_SEED + 1)
    assert info.value.code == "invalid_params"


def test_chords_in_beats_are_at_the_tempo_that_prevails_over_the_melody(model):
    """A tune whose file starts at 60 bpm for 2 s and goes on at 150: the chords' beats are 150's."""
    import io

    import mido

    from musicrel.generation.controls import Controls

    conductor, tune_track = mido.MidiTrack(), mido.MidiTrack()
    conductor.append(mido.MetaMessage("set_tempo", tempo=mido.bpm2tempo(60)))
    conductor.append(mido.MetaMessage("set_tempo", tempo=mido.bpm2tempo(150), time=2 * 480))  # at 2 s
    for k in range(20):  # an eighth at 150 (0.2 s) every beat, from 2 s to 10 s
        rest = 240 if k else 2 * 480  # the rest of the beat before it
        tune_track.append(mido.Message("note_on", note=64 + k % 5, velocity=90, time=rest))
        tune_track.append(mido.Message("note_off", note=64 + k % 5, time=240))
    out = io.BytesIO()
    mido.MidiFile(ticks_per_beat=480, tracks=[conductor, tune_track]).save(file=out)
    params = AccompanimentParams(seed=0, controls=Controls(chords="C:4b"))
    result = accompany_midi(model, CODEC, out.getvalue(), params=params)
    assert result.controls["chords"][0]["seconds"] == pytest.approx(4 * 60 / 150)
