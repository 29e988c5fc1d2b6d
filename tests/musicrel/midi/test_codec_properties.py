"""Hypothesis properties of EventCodec: notes survive encode -> decode; any integers decode to valid MIDI."""

from __future__ import annotations

import io

import numpy as np
import pretty_midi
from hypothesis import given, settings
from hypothesis import strategies as st

from musicrel.midi.codec import CodecConfig, EventCodec

CODEC = EventCodec()
PEDAL = EventCodec(CodecConfig(pedal="events"))

_note = st.tuples(
    st.floats(0, 30, allow_nan=False),  # start
    st.floats(0.02, 5, allow_nan=False),  # duration: at least two steps
    st.integers(0, 127),
    st.integers(1, 127),
)


def _separated(raw):
    """Drop notes that start or end within 20 ms of another note of the same pitch (so the expected result is
    unambiguous after rounding)."""
    kept, by_pitch = [], {}
    for start, dur, pitch, vel in raw:
        end = start + dur
        if all(end + 0.02 <= s or start >= e + 0.02 for s, e in by_pitch.get(pitch, [])):
            by_pitch.setdefault(pitch, []).append((start, end))
            kept.append(pretty_midi.Note(velocity=vel, pitch=pitch, start=start, end=end))
    return kept


@settings(max_examples=60, deadline=None)
@given(st.lists(_note, max_size=60))
def test_notes_survive_round_trip(raw):
    notes = _separated(raw)
    decoded = CODEC.decode_notes(CODEC.encode_notes(notes))
    assert len(decoded) == len(notes)
    # The codec rounds half up (floor(x + 0.5)), so ties at 5 ms sort as it does.
    expected = sorted(notes, key=lambda n: (int(np.floor(n.start / CODEC.step + 0.5)), n.pitch))
    for want, got in zip(expected, decoded, strict=True):
        assert got.pitch == want.pitch
        assert abs(got.start - want.start) <= 0.005 + 1e-9
        assert abs(got.end - want.end) <= 0.005 + 1e-9
        assert got.velocity * 32 // 128 == want.velocity * 32 // 128


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 10, allow_nan=False), st.floats(0, 2), st.integers(0, 127), st.integers(1, 127)
        ),
        max_size=60,
    )
)
def test_overlapping_notes_never_overlap_after_round_trip(raw):
    notes = [pretty_midi.Note(velocity=v, pitch=p, start=s, end=s + d) for s, d, p, v in raw]
    decoded = CODEC.decode_notes(CODEC.encode_notes(notes))
    assert {n.pitch for n in decoded} == {n.pitch for n in notes}
    onsets = {(n.pitch, int(np.floor(n.start * 100 + 0.5))) for n in notes}
    last_end = {}
    for n in decoded:
        assert n.end > n.start
        assert (n.pitch, round(n.start * 100)) in onsets  # every decoded note is an input note's onset
        assert n.start >= last_end.get(n.pitch, 0) - 1e-9  # one sounding note per pitch
        last_end[n.pitch] = n.end


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-50, 450), max_size=300), st.booleans())
def test_any_integers_decode_to_valid_midi(tokens, pedal):
    codec = PEDAL if pedal else CODEC
    pm = codec.decode(tokens)
    assert len(pm.instruments) == 1
    notes = pm.instruments[0].notes
    assert all(n.end > n.start >= 0 and 0 <= n.pitch <= 127 and 1 <= n.velocity <= 127 for n in notes)
    buf = io.BytesIO()
    pm.write(buf)
    back = pretty_midi.PrettyMIDI(io.BytesIO(buf.getvalue()))
    assert sum(len(i.notes) for i in back.instruments) == len(notes)
    # what decodes also re-encodes, and decodes to the same notes
    if notes:
        again = codec.decode_notes(codec.encode(buf.getvalue()))
        assert [(n.pitch, round(n.start, 3)) for n in again] == [(n.pitch, round(n.start, 3)) for n in notes]


@settings(max_examples=40, deadline=None)
@given(st.lists(_note, min_size=1, max_size=40), st.integers(-12, 12), st.floats(0.5, 2.0))
def test_augmentations_keep_structure(raw, semitones, factor):
    notes = _separated(raw)
    tokens = CODEC.encode_notes(notes)
    moved = CODEC.decode_notes(CODEC.transpose(tokens, semitones))
    assert sorted(n.pitch for n in moved) == sorted(
        n.pitch + semitones for n in notes if 0 <= n.pitch + semitones <= 127
    )
    stretched = CODEC.decode_notes(CODEC.stretch(tokens, factor))
    assert len(stretched) == len(CODEC.decode_notes(tokens))
    end = CODEC.time_advance[CODEC.stretch(tokens, factor)].sum()
    assert abs(end - CODEC.time_advance[tokens].sum() * factor) <= 0.005 + 1e-9
