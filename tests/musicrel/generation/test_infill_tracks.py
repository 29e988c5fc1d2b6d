"""Infilling chosen tracks (`InfillParams.tracks`): only their notes in the span are regenerated, every other
note comes back identical, and each new note goes to a chosen track (`span.route`): the one chosen, by nearest
voice for a model without instruments, by instrument for a model with them (a tiny random model of each)."""

from __future__ import annotations

import pretty_midi
import pytest
import torch

from musicrel.errors import InfillError, MusicrelError
from musicrel.generation.infill import InfillParams, gap_notes, infill, infill_segments
from musicrel.generation.span import route, sounding_into, struck_under, voices
from musicrel.midi.codec import CodecConfig, EventCodec
from musicrel.model.config import ModelConfig
from musicrel.model.transformer import MusicTransformer

PIANO = EventCodec(CodecConfig(infill=True))
BAND = EventCodec(CodecConfig(infill=True, instruments=True))
START, END = 8.0, 13.0


def tiny(codec: EventCodec) -> MusicTransformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=codec.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=256
    )
    return MusicTransformer(cfg).eval()


def three_tracks(programs=(0, 0, 0), seconds: float = 24.0) -> pretty_midi.PrettyMIDI:
    """A melody high, a bridge in the middle, a low piano part: three tracks as POP909 has them."""
    pm = pretty_midi.PrettyMIDI(initial_tempo=90.0)
    for k, (name, low) in enumerate((("MELODY", 72), ("BRIDGE", 60), ("PIANO", 40))):
        inst = pretty_midi.Instrument(program=programs[k], name=name)
        step = 0.5 + 0.25 * k
        t, j = 0.1 * k, 0
        while t < seconds:
            inst.notes.append(pretty_midi.Note(60 + 10 * k, low + (j * 5) % 9, t, t + step * 0.9))
            t, j = t + step, j + 1
        pm.instruments.append(inst)
    return pm


def _key(n):
    return (n.pitch, n.velocity, n.start, n.end)


def check_only_chosen_changed(source, out, chosen, start, end):
    """Tracks not chosen: every note identical; chosen ones: every note outside [start, end) identical and
    nothing else but new notes inside it; names, programs, the track count unchanged."""
    assert len(out.instruments) == len(source.instruments)
    for t, (a, b) in enumerate(zip(source.instruments, out.instruments, strict=True)):
        assert (a.name, a.program, a.is_drum) == (b.name, b.program, b.is_drum)
        if t not in chosen:
            assert [_key(n) for n in b.notes] == [_key(n) for n in a.notes], a.name
            continue
        outside = [_key(n) for n in a.notes if not start <= n.start < end]
        assert [_key(n) for n in b.notes if not start <= n.start < end] == outside, a.name


@pytest.mark.parametrize("chosen", [(1,), (0, 2)])
def test_only_the_chosen_tracks_are_regenerated_and_their_new_notes_land_on_them(chosen):
    model, source = tiny(PIANO), three_tracks()
    params = InfillParams(seed=2, num_samples=2, tracks=chosen)
    result = infill(model, source, START, END, codec=PIANO, params=params)
    assert result.tracks == list(chosen)
    removed = sum(START <= n.start < END for t in chosen for n in source.instruments[t].notes)
    assert result.removed == removed > 0
    assert any(result.notes)
    for out, notes, where in zip(result.midis, result.notes, result.note_tracks, strict=True):
        check_only_chosen_changed(source, out, chosen, START, END)
        assert set(where) <= set(chosen)
        for t in chosen:
            inside = sorted(_key(n) for n in out.instruments[t].notes if START <= n.start < END)
            assert inside == sorted(_key(n) for n, w in zip(notes, where, strict=True) if w == t)
        if len(chosen) == 2:  # nearest voice: the melody (median 76) takes the high notes, the piano the low
            for n, w in zip(notes, where, strict=True):
                assert w == (0 if n.pitch > (76 + 44) / 2 else 2), (n.pitch, w)


def test_every_track_is_the_default_and_the_order_of_tracks_does_not_matter():
    source = three_tracks()
    assert InfillParams(tracks=[2, 0, 2]).tracks == (0, 2)
    seg = infill_segments(PIANO, source, START, END)
    assert seg.tracks == [0, 1, 2]
    assert infill_segments(PIANO, source, START, END, (2, 1)).tracks == [1, 2]


@pytest.mark.parametrize(
    ("tracks", "code"),
    [([], "invalid_tracks"), ("1", "invalid_tracks"), ((-1,), "invalid_tracks"), ((True,), "invalid_tracks"),
     ((1.5,), "invalid_tracks"), (3, "invalid_tracks")],
)  # fmt: skip
def test_bad_tracks_are_refused_with_a_code(tracks, code):
    with pytest.raises(InfillError) as err:
        InfillParams(tracks=tracks)
    assert err.value.code == code and isinstance(err.value, MusicrelError)


def test_a_track_the_file_lacks_or_the_model_cannot_write_is_refused():
    source = three_tracks()
    source.instruments.append(pretty_midi.Instrument(program=0, is_drum=True, name="kit"))
    source.instruments[-1].notes = [pretty_midi.Note(100, 36, 0.5 * k, 0.5 * k + 0.1) for k in range(40)]
    with pytest.raises(InfillError) as err:
        infill_segments(PIANO, source, START, END, (1, 4))
    assert err.value.code == "no_such_track" and "4 instruments" in str(err.value)
    with pytest.raises(InfillError) as err:
        infill_segments(PIANO, source, START, END, (3,))
    assert err.value.code == "track_not_read" and "drum" in str(err.value)
    assert infill_segments(BAND, source, START, END, (3,)).tracks == [
        3
    ]  # a model with instruments plays drums


def test_route_by_voice_and_by_instrument():
    pm = three_tracks(programs=(40, 40, 42))  # two violins and a cello
    notes = [pretty_midi.Note(80, p, 9.0, 9.5) for p in (90, 66, 50, 30)]
    heard = voices(pm, [0, 1, 2], START, END)
    assert heard[0] > heard[1] > heard[2]
    assert route(pm, [1], START, END, notes, None) == [1, 1, 1, 1]
    assert route(pm, [0, 1, 2], START, END, notes, None) == [0, 1, 2, 2]
    # by instrument: the violins' notes to the nearer violin, the cello's to the cello, a flute's nowhere
    assert route(pm, [0, 1, 2], START, END, notes, [40, 40, 42, 73]) == [0, 1, 2, None]
    assert route(pm, [1, 2], START, END, notes, [40, 40, 42, 42]) == [1, 1, 2, 2]
    assert route(pm, [2], START, END, notes, [40, 40, 42, 73]) == [None, None, 2, None]


def test_a_model_with_instruments_writes_only_the_chosen_tracks_instruments():
    """A string trio (violin, viola, cello): tracks=1 keeps 0 and 2 exactly and puts on track 1 exactly the
    notes the model wrote for its instrument (the viola), less those struck under a kept note of their pitch;
    the notes it wrote for the others are dropped."""
    model, source = tiny(BAND), three_tracks(programs=(40, 41, 42))
    params = InfillParams(seed=5, num_samples=3, tracks=(1,))
    result = infill(model, source, START, END, codec=BAND, params=params)
    seg = infill_segments(BAND, source, START, END, (1,))
    sounding = sounding_into(BAND, source, START)
    wrote_others = 0
    for out, notes, where, tokens in zip(
        result.midis, result.notes, result.note_tracks, result.tokens, strict=True
    ):
        check_only_chosen_changed(source, out, (1,), START, END)
        assert set(where) <= {1}
        written, instruments = gap_notes(BAND, seg.past, tokens, START, END)
        viola = [
            _key(n)
            for n, i in zip(written, instruments, strict=True)
            if i == 41 and not struck_under(sounding, n.pitch, n.start)
        ]
        assert sorted(_key(n) for n in notes) == sorted(viola)
        wrote_others += sum(i != 41 for i in instruments)
    assert wrote_others > 0  # the random model wrote other instruments too, and they were dropped
