"""musicrel.primer: the primer window at the cut, cropping, tracks, and rendering any token stream."""

from __future__ import annotations

import io

import numpy as np
import pretty_midi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musicrel.codec import CodecConfig, EventCodec, open_pitches, shift_steps
from musicrel.primer import prepare_primer, primer_at_cut, render
from tests.musicrel.fixtures_generation import (
    CODEC,
    STEP,
    check_grammar,
    make_motif,
    midi_bytes,
)

pytestmark = pytest.mark.usefixtures("one_thread")


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


def test_render_keeps_the_pedal_of_an_events_codec_and_releases_it():

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
