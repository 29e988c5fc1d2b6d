"""Infilling chosen tracks (`InfillParams.tracks`): only their notes in the span are regenerated, every other
note comes back identical, and each new note goes to a chosen track (`span.route`): the one chosen, by nearest
voice for a model without instruments, by instrument for a model with them (a tiny random model of each)."""

from __future__ import annotations

import numpy as np
import pretty_midi
import pytest
import torch

from musicrel.errors import InfillError, MusicrelError
from musicrel.generation.infill import InfillParams, gap_notes, infill, infill_segments
from musicrel.generation.span import route, sounding_into, struck_under
from musicrel.midi.codec import CodecConfig, EventCodec
from musicrel.midi.tracks import voices
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
    # one rule (midi.tracks): a piano model's notes go to the violin a model's violin notes go to
    violins = [pretty_midi.Note(80, p, 9.0, 9.5) for p in range(40, 100, 3)]
    by_voice = route(pm, [0, 1], START, END, violins, None)
    assert by_voice == route(pm, [0, 1], START, END, violins, [40] * len(violins))
    assert set(by_voice) == {0, 1}


@pytest.mark.parametrize("who", [None, "any"])
def test_a_model_with_instruments_writes_only_the_chosen_tracks_instruments(who):
    """A string trio (violin, viola, cello): tracks=1 keeps 0 and 2 exactly and puts on track 1 exactly the
    notes the model wrote for its instrument (the viola), less those struck under a kept note of their pitch.
    By default the model writes the viola only (`infill.chosen_instruments`: what the density loop counts is
    what the file gets); with `instruments=any` it writes others too, and they are dropped."""
    from musicrel.generation.controls import Controls

    model, source = tiny(BAND), three_tracks(programs=(40, 41, 42))
    controls = None if who is None else Controls(instruments=who)
    params = InfillParams(seed=6, num_samples=3, tracks=(1,), controls=controls)
    result = infill(model, source, START, END, codec=BAND, params=params)
    seg = infill_segments(BAND, source, START, END, (1,))
    # the prompt names each note's instrument (read as piano, the model could write the trio's none)
    heard = BAND.decode_instrument_notes(np.concatenate([seg.past, seg.future])).instruments
    assert set(heard) == {40, 41, 42}
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
    if who is None:
        assert any(result.notes) and wrote_others == 0
    else:
        assert wrote_others > 0  # the random model wrote other instruments too, and they were dropped


def test_the_model_hears_the_kept_tracks_in_the_gap_and_only_its_own_notes_come_back():
    """tracks=1: the kept tracks' note events in the gap are placed in each row at their steps (PlacedGrammar,
    the accompaniment's melody mechanism on plain note tokens), so the raw rows decode to every kept note that
    starts in the gap, at its step; the rows the library returns leave exactly those note events out."""
    from musicrel.generation.decode_batch import DecodeBatch
    from musicrel.generation.infill import _gap_steps, infill_job
    from musicrel.generation.placed import PlacedGrammar
    from musicrel.generation.span import past_velocity

    model, source = tiny(PIANO), three_tracks()
    seg = infill_segments(PIANO, source, START, END, (1,))
    assert len(seg.kept[0]) and (seg.kept[0] >= 0).all() and (seg.kept[0] < seg.gap_steps).all()
    job = infill_job(model, PIANO, seg, InfillParams(seed=4, num_samples=2, tracks=(1,)))
    assert isinstance(job.grammar, PlacedGrammar)
    batch = DecodeBatch(model, PIANO, max_rows=2)
    batch.admit([job])
    while not (finished := batch.step()):
        pass
    ((_, raw),) = finished
    step = PIANO.config.step_ms / 1000.0
    kept = sorted(
        (n.pitch, round(n.start / step))
        for t in (0, 2)
        for n in source.instruments[t].notes
        if START <= n.start < END
    )
    job = infill_job(model, PIANO, seg, InfillParams(seed=4, num_samples=2, tracks=(1,)))
    own = _gap_steps(model, PIANO, job, seg.kept)
    while True:
        try:
            next(own)
        except StopIteration as done:
            rows = done.value
            break
    for tokens, mine in zip(raw.tokens, rows, strict=True):
        decoded = PIANO.decode_notes(np.concatenate([past_velocity(PIANO, seg.past), tokens]))
        heard = sorted((n.pitch, round(n.start / step) + seg.start_step) for n in decoded)
        assert all(k in heard for k in kept)  # every kept note struck in the gap, at its own step
        ons = lambda t: int(PIANO.is_note_on(np.asarray(t)).sum())  # noqa: E731
        assert ons(tokens) - ons(mine) == len(kept)  # and exactly those note-ons are left out
    # a default infill (every track) places nothing: the plain grammar, the decoding of before
    everything = infill_segments(PIANO, source, START, END)
    assert not len(everything.kept[0])
    assert type(infill_job(model, PIANO, everything, InfillParams(seed=4)).grammar).__name__ == "Grammar"


def test_a_gap_written_beside_kept_tracks_holds_the_chosen_tracks_density_unless_one_is_asked():
    from musicrel.generation.controls import Controls
    from musicrel.generation.infill import chosen_density

    model, source = tiny(PIANO), three_tracks()
    seg = infill_segments(PIANO, source, START, END, (1,))
    rate = chosen_density(PIANO, seg)
    around = [
        n for n in source.instruments[1].notes if START - 10 <= n.start < START or END <= n.start < END + 10
    ]
    assert rate == pytest.approx(
        len(around) / (START + 10.0), rel=1e-6
    )  # 8 s before (the file's start), 10 after
    result = infill(model, source, START, END, codec=PIANO, params=InfillParams(seed=1, tracks=(1,)))
    assert result.controls == {"density": round(rate, 3)}
    asked = InfillParams(seed=1, tracks=(1,), controls=Controls(density=3.0))
    assert infill(model, source, START, END, codec=PIANO, params=asked).controls == {"density": 3.0}
    assert infill(model, source, START, END, codec=PIANO, params=InfillParams(seed=1)).controls is None


def test_the_music_around_a_gap_says_which_notes_are_drum_hits():
    """`key=auto` reads pitches: around a band's gap, its drum hits are marked as such (as a continuation's
    motif marks them); a piano model's reading has no instruments."""
    from musicrel.generation.controls import _pitched
    from musicrel.generation.infill import around_gap
    from musicrel.midi.instruments import DRUMS

    pm = three_tracks(programs=(40, 41, 42))
    kit = pretty_midi.Instrument(program=0, is_drum=True, name="kit")
    kit.notes = [pretty_midi.Note(100, 42, 0.5 * k, 0.5 * k + 0.1) for k in range(40)]
    pm.instruments.append(kit)
    around = around_gap(BAND, infill_segments(BAND, pm, START, END))
    assert len(around.motif_instruments) == len(around.motif_notes)
    hits = sum(i == DRUMS for i in around.motif_instruments)
    assert hits == sum(START - 10 <= n.start < START or END <= n.start < END + 10 for n in kit.notes)
    assert len(_pitched(around)) == len(around.motif_notes) - hits
    assert around_gap(PIANO, infill_segments(PIANO, pm, START, END)).motif_instruments is None


def test_an_infill_writes_back_the_key_signatures_every_staff_carries():
    """MuseScore writes a key signature on each staff, not on track 0: the filled file keeps them."""
    from tests.musicrel.midi.test_notes import musescore_like

    result = infill(tiny(BAND), musescore_like(), 2.0, 5.0, codec=BAND, params=InfillParams(seed=0))
    out = result.midis[0]
    assert [(k.key_number, round(k.time, 6)) for k in out.key_signature_changes] == [(2, 0.0), (5, 4.0)]
    assert [(t.numerator, round(t.time, 6)) for t in out.time_signature_changes] == [(4, 0.0), (3, 8.0)]


def unison_flutes(seconds: float = 24.0) -> pretty_midi.PrettyMIDI:
    """Flute I and Flute II (program 73) in unison over a cello."""
    pm = pretty_midi.PrettyMIDI(initial_tempo=90.0)
    line = [pretty_midi.Note(80, 72 + (j * 5) % 9, 0.5 * j, 0.5 * j + 0.45) for j in range(int(seconds * 2))]
    for name in ("Flute I", "Flute II"):
        flute = pretty_midi.Instrument(program=73, name=name)
        flute.notes = [pretty_midi.Note(n.velocity, n.pitch, n.start, n.end) for n in line]
        pm.instruments.append(flute)
    cello = pretty_midi.Instrument(program=42, name="Cello")
    cello.notes = [pretty_midi.Note(70, 40 + j % 5, 1.0 * j, 1.0 * j + 0.9) for j in range(int(seconds))]
    pm.instruments.append(cello)
    return pm


def test_a_chosen_track_in_unison_with_another_chosen_one_gets_the_same_new_notes():
    model, source = tiny(BAND), unison_flutes()
    result = infill(
        model, source, START, END, codec=BAND, params=InfillParams(seed=0, num_samples=2, tracks=(0, 1))
    )
    for out, notes, where in zip(result.midis, result.notes, result.note_tracks, strict=True):
        check_only_chosen_changed(source, out, (0, 1), START, END)
        first, second = (
            [_key(n) for n in out.instruments[t].notes if START <= n.start < END] for t in (0, 1)
        )
        assert first == second and first  # Flute II keeps doubling Flute I in the gap
        assert sorted(where) == [0] * len(first) + [1] * len(first)  # each copy is a note of the answer
        assert sorted(map(_key, notes)) == sorted(first + second)
    # chosen alone, Flute II writes notes of its own, and Flute I stays exactly as it was
    alone = infill(model, source, START, END, codec=BAND, params=InfillParams(seed=0, tracks=(1,)))
    check_only_chosen_changed(source, alone.midis[0], (1,), START, END)
    assert set(alone.note_tracks[0]) == {1}


def with_markers(pm: pretty_midi.PrettyMIDI) -> bytes:
    """`pm`'s file with a copyright, a GS reset (SysEx) and a marker on track 0, and a port on each
    instrument's track: what pretty_midi's own writing drops."""
    import io

    import mido

    buffer = io.BytesIO()
    pm.write(buffer)
    mf = mido.MidiFile(file=io.BytesIO(buffer.getvalue()))
    extra = [
        mido.MetaMessage("copyright", text="(c) the band"),
        mido.Message("sysex", data=[0x41, 0x10, 0x42, 0x12, 0x40, 0x00, 0x7F, 0x00, 0x41]),
        mido.MetaMessage("marker", text="bridge"),
    ]
    mf.tracks[0][0:0] = extra
    for port, track in enumerate(mf.tracks[1:]):
        track.insert(0, mido.MetaMessage("midi_port", port=port))
    buffer = io.BytesIO()
    mf.save(file=buffer)
    return buffer.getvalue()


def test_an_infill_edits_the_uploads_own_bytes():
    """The files of an infill given bytes (`InfillResult.files`) are the upload with the span's notes of the
    chosen track edited: every other message as sent, the notes those of `midis`."""
    import io

    import mido

    source = with_markers(three_tracks(programs=(40, 41, 42)))
    result = infill(
        tiny(BAND), source, START, END, codec=BAND, params=InfillParams(seed=3, num_samples=2, tracks=(1,))
    )
    assert result.source == source and any(result.notes)
    sent = mido.MidiFile(file=io.BytesIO(source)).tracks
    for data, out in zip(result.files(), result.midis, strict=True):
        tracks = mido.MidiFile(file=io.BytesIO(data)).tracks
        assert len(tracks) == len(sent)
        for t in (0, 1, 3):  # the conductor and the tracks not chosen: byte for byte
            assert tracks[t] == sent[t], t
        others = [m for m in tracks[2] if m.type not in ("note_on", "note_off")]
        assert others[0] == sent[2][0] and others[0].type == "midi_port"
        back = BAND.read(data)
        for a, b in zip(back.instruments, out.instruments, strict=True):  # on the file's ticks (3 ms)
            assert len(a.notes) == len(b.notes)
            for x, y in zip(sorted(map(_key, a.notes)), sorted(map(_key, b.notes)), strict=True):
                assert x[:2] == y[:2] and np.allclose(x[2:], y[2:], atol=0.002)
    # given a PrettyMIDI there are no bytes to edit: pretty_midi writes the file
    given = infill(
        tiny(BAND), BAND.read(source), START, END, codec=BAND, params=InfillParams(seed=3, tracks=(1,))
    )
    assert given.source is None
    kinds = {m.type for t in mido.MidiFile(file=io.BytesIO(given.files()[0])).tracks for m in t}
    assert "marker" not in kinds and "note_on" in kinds
