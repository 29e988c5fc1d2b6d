"""The accompaniment with a model whose codec has instruments (no melody tokens): the melody track's own note
events are placed into the stream at their times (`placed.PlacedGrammar`), the model writes the other
instruments, and the answer keeps the melody track exactly with a track per instrument written (a tiny random
model: what it writes is noise, but the rules hold for any tokens the grammar lets through)."""

from __future__ import annotations

import numpy as np
import pretty_midi
import pytest
import torch

from musicrel.errors import MusicrelError
from musicrel.generation.accompaniment import (
    AccompanimentParams,
    accompany_midi,
    instruments_job,
)
from musicrel.generation.controls import Controls
from musicrel.midi.codec import CodecConfig, EventCodec
from musicrel.model.config import ModelConfig
from musicrel.model.transformer import MusicTransformer

CODEC = EventCodec(CodecConfig(instruments=True))
VOICE = 68  # an oboe's program: the tune


@pytest.fixture(scope="module")
def model() -> MusicTransformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=CODEC.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=256
    )
    return MusicTransformer(cfg).eval()


def lied(seconds: float = 6.0) -> pretty_midi.PrettyMIDI:
    """A voice (the tune, one note at a time) over a piano part; the voice is track 1."""
    pm = pretty_midi.PrettyMIDI(initial_tempo=84.0)
    piano = pretty_midi.Instrument(program=0, name="Piano")
    piano.notes = [
        pretty_midi.Note(60, 48 + k % 12, 0.25 * k, 0.25 * k + 0.5) for k in range(int(seconds * 4))
    ]
    voice = pretty_midi.Instrument(program=VOICE, name="Voice")
    voice.notes = [
        pretty_midi.Note(90, 67 + (k * 3) % 8, 0.5 * k + 0.1, 0.5 * k + 0.5) for k in range(int(seconds * 2))
    ]
    pm.instruments += [piano, voice]
    return pm


def _key(n):
    return (n.pitch, n.velocity, n.start, n.end)


def test_the_voice_is_kept_exactly_and_the_model_writes_other_instruments_on_tracks_of_their_own(model):
    source = lied()
    result = accompany_midi(model, CODEC, source, track=1, params=AccompanimentParams(seed=3, num_samples=2))
    assert result.melody_track == 1 and len(result.midis) == 2
    wrote = 0
    for out, notes in zip(result.midis, result.notes, strict=True):
        voice, *written = out.instruments
        assert (voice.name, voice.program) == ("Voice", VOICE)
        assert [_key(n) for n in voice.notes] == [_key(n) for n in source.instruments[1].notes]
        programs = [(t.program, t.is_drum) for t in written]
        assert len(set(programs)) == len(programs) and (VOICE, False) not in programs  # one track each
        for t in written:  # named by General MIDI name, the drums on a drum track
            assert t.name == ("Drums" if t.is_drum else pretty_midi.program_to_instrument_name(t.program))
            assert t.notes
        assert sorted(_key(n) for t in written for n in t.notes) == sorted(_key(n) for n in notes)
        wrote += len(notes)
    assert wrote > 0 and result.seconds > 6.0  # it goes on past the voice's last note


def test_the_voice_is_placed_in_each_row_at_its_own_steps(model):
    """The raw rows hold every voice note at its step with the voice's instrument; the answer's notes leave
    them out."""
    from musicrel.generation.decode_batch import DecodeBatch

    source = lied(4.0)
    job = instruments_job(model, CODEC, source, 1, AccompanimentParams(seed=1, num_samples=2))
    batch = DecodeBatch(model, CODEC, max_rows=2)
    batch.admit([job])
    while not (finished := batch.step()):
        pass
    ((_, raw),) = finished
    step = CODEC.config.step_ms / 1000.0
    voice = sorted((n.pitch, round(n.start / step)) for n in source.instruments[1].notes)
    for tokens in raw.tokens:
        heard = CODEC.decode_instrument_notes(np.asarray(tokens))
        placed = sorted(
            (n.pitch, round(n.start / step))
            for n, i in zip(heard.notes, heard.instruments, strict=True)
            if i == VOICE
        )
        assert all(v in placed for v in voice)


def test_the_instruments_control_chooses_what_is_written_and_program_is_refused(model):
    source = lied(4.0)
    params = AccompanimentParams(seed=2, num_samples=2, controls=Controls(instruments="Cello"))
    result = accompany_midi(model, CODEC, source, track=1, params=params)
    for out in result.midis:
        assert {(t.program, t.name) for t in out.instruments[1:]} <= {(42, "Cello")}
    assert result.controls["instruments"] == ["Cello"]
    with pytest.raises(MusicrelError) as err:
        accompany_midi(
            model, CODEC, source, track=1, params=AccompanimentParams(controls=Controls(program=40))
        )
    assert err.value.code == "program_with_instruments"
    with pytest.raises(MusicrelError) as err:
        accompany_midi(model, CODEC, source, track=2)
    assert err.value.code == "no_such_track"


def test_the_tunes_own_instrument_is_never_the_models_and_naming_it_says_so(model):
    """An oboe's tune under "Oboe, Cello": the model may strike only the cello (its oboe notes would go on
    with the tune, and the answer would drop them: the mass goes to the others), and a warning says why;
    "Oboe" alone leaves nothing to write: an error with a code."""
    from musicrel.generation.decode_batch import DecodeBatch

    source = lied(4.0)
    params = AccompanimentParams(seed=4, num_samples=2, controls=Controls(instruments="Oboe, Cello"))
    job = instruments_job(model, CODEC, source, 1, params)
    assert job.controls.instruments[VOICE] == False and job.controls.instruments[42]  # noqa: E712
    assert job.grammar.inst.permitted[:, VOICE].any() == False  # noqa: E712
    batch = DecodeBatch(model, CODEC, max_rows=2)
    batch.admit([job])
    while not (finished := batch.step()):
        pass
    ((_, raw),) = finished
    for tokens in raw.tokens:  # the oboe's notes are the tune's, placed: the model struck none of its own
        heard = CODEC.decode_instrument_notes(np.asarray(tokens))
        assert sum(i == VOICE for i in heard.instruments) == len(source.instruments[1].notes)
    result = accompany_midi(model, CODEC, source, track=1, params=params)
    assert any("Oboe plays the melody" in w for w in result.warnings)
    assert result.controls["instruments"] == ["Cello"]
    for out in result.midis:
        assert {(t.program, t.name) for t in out.instruments[1:]} <= {(42, "Cello")}
    with pytest.raises(MusicrelError) as err:
        accompany_midi(
            model, CODEC, source, track=1, params=AccompanimentParams(controls=Controls(instruments="Oboe"))
        )
    assert err.value.code == "only_the_melodys_instrument"
