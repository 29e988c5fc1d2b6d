"""A continuation with a model whose codec has instruments keeps the motif's tracks (issue 42): a quartet (two
tracks of one program and a cello), a Lied (voice and piano), a band with drums, drums alone, 17+
instruments and a program change inside a track; rendering from hand-written token streams (each note on its
track, new instruments on new tracks, the stream's notes the file's) and from a tiny model (`continue_midi`);
`program` refused. The piano models' path is tests/musicrel/generation/test_primer.py's, unchanged."""

from __future__ import annotations

import io

import numpy as np
import pretty_midi
import pytest
import torch

from musicrel.errors import InvalidMidiError
from musicrel.generation.continuation import continue_midi
from musicrel.generation.controls import ControlError, Controls
from musicrel.generation.primer import prepare_primer, render
from musicrel.generation.streaming import NoteStream
from musicrel.midi.codec import CodecConfig, EventCodec
from musicrel.midi.instruments import DRUMS
from musicrel.model.config import ModelConfig
from musicrel.model.transformer import MusicTransformer

CODEC = EventCodec(CodecConfig(instruments=True))
N = pretty_midi.Note


def _track(name, program, notes, is_drum=False):
    inst = pretty_midi.Instrument(program=program, is_drum=is_drum, name=name)
    inst.notes = [N(velocity=80, pitch=p, start=s, end=e) for s, e, p in notes]
    return inst


def _line(pitches, step=0.5, length=0.45, start=0.0):
    return [(start + k * step, start + k * step + length, p) for k, p in enumerate(pitches)]


def quartet() -> pretty_midi.PrettyMIDI:
    """Violin I (high) and Violin II (lower), both program 40, a viola and a cello."""
    pm = pretty_midi.PrettyMIDI(initial_tempo=90)
    pm.instruments = [
        _track("Violin I", 40, _line([76, 79, 81, 79, 77, 76, 74, 76])),
        _track("Violin II", 40, _line([67, 64, 65, 67, 69, 67, 65, 64])),
        _track("Viola", 41, _line([60, 60, 62, 60, 57, 59, 60, 55], step=1.0, length=0.9)[:4]),
        _track("Violoncello", 42, _line([48, 43, 45, 41], step=1.0, length=0.95)),
    ]
    return pm


def lied() -> pretty_midi.PrettyMIDI:
    """A voice (Voice Oohs) over a piano in two tracks (both program 0: right and left hand)."""
    pm = pretty_midi.PrettyMIDI(initial_tempo=72)
    pm.instruments = [
        _track("Voice", 53, _line([72, 74, 76, 77, 76, 74, 72], step=0.5)),
        _track("Piano RH", 0, _line([64, 67, 64, 67, 65, 69, 64, 67], step=0.4)),
        _track("Piano LH", 0, _line([48, 43, 48, 43], step=0.8, length=0.7)),
    ]
    return pm


def band() -> pretty_midi.PrettyMIDI:
    """Drums (kit program 25), an electric bass and a guitar."""
    pm = pretty_midi.PrettyMIDI(initial_tempo=120)
    kicks = [(k * 0.5, k * 0.5 + 0.1, 36 if k % 2 == 0 else 38) for k in range(8)]
    hats = [(k * 0.25, k * 0.25 + 0.05, 42) for k in range(16)]
    pm.instruments = [
        _track("Drums", 25, sorted(kicks + hats), is_drum=True),
        _track("Bass", 33, _line([40, 40, 43, 45, 40, 40, 47, 45], step=0.5, length=0.4)),
        _track("Guitar", 29, _line([64, 67, 71, 64, 67, 71, 64, 67], step=0.5, length=0.4)),
    ]
    return pm


def drums_only() -> pretty_midi.PrettyMIDI:
    pm = pretty_midi.PrettyMIDI(initial_tempo=100)
    notes = [(k * 0.25, k * 0.25 + 0.1, (36, 42, 38, 42)[k % 4]) for k in range(16)]
    pm.instruments = [_track("Kit", 0, notes, is_drum=True)]
    return pm


def many_instruments(n: int = 17) -> pretty_midi.PrettyMIDI:
    """n pitched instruments (programs 0, 3, 6, ...) and drums: more than MIDI's 15 pitched channels."""
    pm = pretty_midi.PrettyMIDI()
    for k in range(n):
        pm.instruments.append(_track(f"Part {k}", 3 * k, _line([50 + k, 52 + k], start=0.05 * k)))
    pm.instruments.append(_track("Drums", 0, _line([36, 38, 36, 38]), is_drum=True))
    return pm


def as_bytes(pm: pretty_midi.PrettyMIDI) -> bytes:
    buffer = io.BytesIO()
    pm.write(buffer)
    return buffer.getvalue()


def program_change_inside_a_track() -> bytes:
    """One track (one channel) that plays a flute (73), then changes to an oboe (68): as pretty_midi counts
    tracks, two (one per program), both named "Winds"."""
    import mido

    mid = mido.MidiFile(ticks_per_beat=480)
    track = mido.MidiTrack()
    track.append(mido.MetaMessage("track_name", name="Winds", time=0))
    track.append(mido.Message("program_change", program=73, time=0))
    for k in range(4):
        track.append(mido.Message("note_on", note=72 + k, velocity=80, time=0))
        track.append(mido.Message("note_off", note=72 + k, velocity=0, time=240))
    track.append(mido.Message("program_change", program=68, time=0))
    for k in range(4):
        track.append(mido.Message("note_on", note=65 + k, velocity=80, time=0))
        track.append(mido.Message("note_off", note=65 + k, velocity=0, time=240))
    mid.tracks.append(track)
    buffer = io.BytesIO()
    mid.save(file=buffer)
    return buffer.getvalue()


ENSEMBLES = {"quartet": quartet, "lied": lied, "band": band, "drums": drums_only}


def instruments_model(max_seq_len: int = 256, seed: int = 0) -> MusicTransformer:
    """A tiny random model with the instruments codec (its tokens are noise, its streams valid)."""
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=CODEC.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=max_seq_len
    )
    return MusicTransformer(cfg).eval()


def layout(pm) -> list[tuple[str, int, bool]]:
    return [(i.name, int(i.program), bool(i.is_drum)) for i in pm.instruments]


def written(pm) -> pretty_midi.PrettyMIDI:
    """A file as a player (or the page) reads it back."""
    return pretty_midi.PrettyMIDI(io.BytesIO(as_bytes(pm)))


def tokens(*events) -> np.ndarray:
    """Hand-written events: ("inst", i), ("on", pitch), ("off", pitch), ("shift", steps)."""
    out = []
    for kind, value in events:
        if kind == "inst":
            out.append(CODEC.instrument_offset + value)
        elif kind == "on":
            out.append(CODEC.note_on_offset + value)
        elif kind == "off":
            out.append(CODEC.note_off_offset + value)
        else:
            out.append(CODEC.time_shift_offset + value - 1)
    return np.asarray(out, dtype=np.int64)


@pytest.fixture(scope="module")
def model():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model on a shared machine
    yield instruments_model()
    torch.set_num_threads(threads)


# ---------------------------------------------------------------- rendering from hand-written tokens


def test_quartet_new_notes_go_to_their_tracks_by_nearest_voice():
    primer = prepare_primer(CODEC, as_bytes(quartet()))
    assert [t.name for t in primer.tracks.tracks] == ["Violin I", "Violin II", "Viola", "Violoncello"]
    new = tokens(
        ("inst", 40), ("on", 77), ("on", 66), ("inst", 42), ("on", 45),
        ("shift", 50), ("inst", 40), ("off", 77), ("off", 66), ("inst", 42), ("off", 45), ("shift", 10),
    )  # fmt: skip
    pm = render(CODEC, primer, new)
    assert layout(pm) == [("Violin I", 40, False), ("Violin II", 40, False), ("Viola", 41, False),
                          ("Violoncello", 42, False)]  # fmt: skip
    pitches = [[n.pitch for n in i.notes] for i in pm.instruments]
    assert pitches == [[77], [66], [], [45]]  # voices: Violin I 76.5, Violin II 66 (their median pitches)
    assert pm.instruments[0].notes[0].start == pytest.approx(0.0, abs=1e-6)


def test_new_instruments_get_new_tracks_after_the_motifs():
    primer = prepare_primer(CODEC, as_bytes(lied()))
    new = tokens(
        ("shift", 1), ("inst", DRUMS), ("on", 36), ("inst", 33), ("on", 40), ("shift", 20),
        ("off", 40), ("inst", DRUMS), ("off", 36), ("inst", 0), ("on", 50), ("shift", 20),
    )  # fmt: skip
    # with the motif: a track without notes is written, but pretty_midi drops it when it reads a file back
    pm = written(render(CODEC, primer, new, include_primer=True))
    assert layout(pm) == [("Voice", 53, False), ("Piano RH", 0, False), ("Piano LH", 0, False),
                          ("Drums", 0, True), ("Electric Bass (finger)", 33, False)]  # fmt: skip
    new_notes = [[n.pitch for n in i.notes if n.start >= primer.end_time - 1e-3] for i in pm.instruments]
    assert new_notes == [[], [], [50], [36], [40]]  # the left hand's last note was 43, the right hand's 67


def test_include_primer_keeps_every_motif_note_on_its_own_track():
    for name, make in ENSEMBLES.items():
        upload = written(make())  # the times the file holds (on its ticks)
        primer = prepare_primer(CODEC, as_bytes(upload))
        pm = render(CODEC, primer, tokens(("shift", 30)), include_primer=True)
        assert layout(pm)[: len(upload.instruments)] == layout(upload), name
        for original, out in zip(upload.instruments, pm.instruments, strict=False):
            want = sorted((n.pitch, round(n.start, 3)) for n in original.notes)
            assert sorted((n.pitch, round(n.start, 3)) for n in out.notes) == want, (name, original.name)


def test_the_stream_reports_each_notes_track_as_the_file_has_it():
    primer = prepare_primer(CODEC, as_bytes(band()))
    rng = np.random.default_rng(0)
    events = []
    for _ in range(60):  # random instruments (the band's and others), pitches, chords, shifts
        events += [("inst", int(rng.choice([DRUMS, 33, 29, 0, 56]))), ("on", int(rng.integers(30, 90)))]
        if rng.random() < 0.5:
            events.append(("shift", int(rng.integers(1, 30))))
    new = tokens(*events)
    pm = render(CODEC, primer, new)
    stream = NoteStream(CODEC, primer.tokens, primer.tail_steps, placer=primer.tracks.placer())
    notes: dict[int, list] = {}
    for e in stream.feed(new[:37]) + stream.feed(new[37:]) + stream.close():
        if e.kind == "on":
            notes[e.id] = [e.track, e.instrument, e.pitch, e.time, None]
        elif e.kind == "off":
            notes[e.id][4] = e.time
        else:
            del notes[e.id]
    from_stream = sorted((t, p, round(s, 4), round(end, 4)) for t, _, p, s, end in notes.values())
    from_file = sorted(
        (k, n.pitch, round(n.start, 4), round(n.end, 4))
        for k, i in enumerate(pm.instruments)
        for n in i.notes
    )
    assert from_stream == from_file and len(from_file) > 20
    for track, instrument, *_ in notes.values():
        inst = pm.instruments[track]
        assert instrument == (DRUMS if inst.is_drum else inst.program)


def test_a_track_in_unison_with_another_of_its_instrument_keeps_doubling_it_in_file_and_stream():
    """Flute II doubles Flute I (the codec hears their line once): each new flute note is on both, a note
    of its own on each (its own id in the stream); an included motif gives each flute exactly its notes."""
    melody, intro = [72, 74, 76, 77, 79, 77, 76, 74], [67, 69, 71, 72]  # Flute I alone first, then both
    pm = pretty_midi.PrettyMIDI(initial_tempo=100)
    pm.instruments = [
        _track("Flute I", 73, _line(intro) + _line(melody, start=2.0)),
        _track("Flute II", 73, _line(melody, start=2.0)),
        _track("Violoncello", 42, _line([48, 43, 45, 41, 48, 43], step=1.0, length=0.95)),
    ]
    primer = prepare_primer(CODEC, as_bytes(pm))
    new = tokens(
        ("inst", 73), ("on", 81), ("inst", 42), ("on", 40), ("shift", 30),
        ("inst", 73), ("off", 81), ("on", 79), ("shift", 30), ("inst", 42), ("off", 40), ("shift", 5),
    )  # fmt: skip
    out = render(CODEC, primer, new)
    pitches = [[n.pitch for n in i.notes] for i in out.instruments]
    assert pitches == [[81, 79], [81, 79], [40]]
    stream = NoteStream(CODEC, primer.tokens, primer.tail_steps, placer=primer.tracks.placer())
    ons = [e for e in stream.feed(new) + stream.close() if e.kind == "on"]
    assert [(e.id, e.track, e.pitch) for e in ons] == [
        (0, 0, 81),
        (1, 1, 81),
        (2, 2, 40),
        (3, 0, 79),
        (4, 1, 79),
    ]
    whole = written(render(CODEC, primer, new, include_primer=True))
    motif = [sorted(n.pitch for n in i.notes if n.start < primer.end_time - 1e-3) for i in whole.instruments]
    assert motif[0] == sorted(intro + melody) and motif[1] == sorted(melody)  # each its own motif, exactly


def test_a_program_change_inside_a_track_is_two_tracks_each_with_its_program():
    data = program_change_inside_a_track()
    primer = prepare_primer(CODEC, data)
    assert [(t.name, t.program) for t in primer.tracks.tracks] == [("Winds", 73), ("Winds", 68)]
    pm = render(
        CODEC, primer, tokens(("shift", 1), ("inst", 73), ("on", 80), ("shift", 30)), include_primer=True
    )
    assert layout(written(pm)) == [("Winds", 73, False), ("Winds", 68, False)]
    assert [n.pitch for n in pm.instruments[0].notes] == [72, 73, 74, 75, 80]


def test_seventeen_instruments_and_drums_keep_their_tracks_and_programs():
    upload = many_instruments(17)
    primer = prepare_primer(CODEC, as_bytes(upload))
    pm = written(render(CODEC, primer, tokens(("shift", 10)), include_primer=True))
    assert layout(pm) == layout(written(upload))
    assert len(pm.instruments) == 18 and pm.instruments[-1].is_drum


def test_a_track_selection_keeps_the_selected_tracks_in_order():
    primer = prepare_primer(CODEC, as_bytes(band()), tracks=[0, 2])
    pm = render(CODEC, primer, tokens(("shift", 10)), include_primer=True)
    assert layout(pm) == [("Drums", 25, True), ("Guitar", 29, False)]
    assert [t.source for t in primer.tracks.tracks] == [0, 2]


# ---------------------------------------------------------------- continue_midi with a tiny model


@pytest.mark.parametrize("name", sorted(ENSEMBLES))
def test_continue_midi_keeps_the_tracks(model, name):
    upload = ENSEMBLES[name]()
    out = continue_midi(model, as_bytes(upload), codec=CODEC, seconds=2.0, num_samples=2, seed=1)
    upload_instruments = {DRUMS if i.is_drum else i.program for i in upload.instruments}
    for pm in out:
        back = written(pm)
        assert layout(pm)[: len(upload.instruments)] == layout(upload)
        added = [DRUMS if i.is_drum else i.program for i in pm.instruments[len(upload.instruments) :]]
        assert len(set(added)) == len(added) and not set(added) & upload_instruments
        assert sum(len(i.notes) for i in pm.instruments) > 0
        assert sum(len(i.notes) for i in back.instruments) == sum(len(i.notes) for i in pm.instruments)
        assert all(n.end <= 2.0 + 1e-6 for i in pm.instruments for n in i.notes)


def test_continue_midi_refuses_program_with_instruments(model):
    with pytest.raises(ControlError) as err:
        continue_midi(model, as_bytes(band()), codec=CODEC, seconds=1.0, controls=Controls(program=40))
    assert err.value.code == "program_with_instruments"


def test_drums_only_continues_the_drums_and_a_piano_model_says_no_notes(model):
    out = continue_midi(model, as_bytes(drums_only()), codec=CODEC, seconds=2.0, num_samples=1, seed=0)
    assert layout(out[0])[0] == ("Kit", 0, True)
    with pytest.raises(InvalidMidiError) as err:
        prepare_primer(EventCodec(), as_bytes(drums_only()))
    assert err.value.code == "no_notes"


def test_the_pedal_of_an_events_codec_goes_on_every_track_but_the_drums():
    codec = EventCodec(CodecConfig(instruments=True, pedal="events"))
    primer = prepare_primer(codec, as_bytes(band()))
    new = [codec.pedal_on_id, codec.instrument_offset + 33, codec.note_on_offset + 40]
    new += [codec.time_shift_offset + 49, codec.pedal_off_id, codec.time_shift_offset + 9]
    pm = render(codec, primer, np.asarray(new))
    for inst in pm.instruments:
        changes = [(c.number, c.value, round(c.time, 3)) for c in inst.control_changes]
        assert changes == ([] if inst.is_drum else [(64, 127, 0.0), (64, 0, 0.5)]), inst.name
    assert [n.pitch for n in pm.instruments[1].notes] == [40]


def test_new_tracks_come_only_where_the_instruments_control_lets_them(model):
    upload = ENSEMBLES["quartet"]()
    motif = len(upload.instruments)
    plain = continue_midi(model, as_bytes(upload), codec=CODEC, seconds=3.0, num_samples=2, seed=4)
    assert all(len(pm.instruments) == motif for pm in plain)  # the motif's instruments by default
    free = continue_midi(
        model, as_bytes(upload), codec=CODEC, seconds=3.0, num_samples=2, seed=4,
        controls=Controls(instruments="any"),
    )  # fmt: skip
    own = {i.program for i in upload.instruments}
    added = [[DRUMS if i.is_drum else i.program for i in pm.instruments[motif:]] for pm in free]
    assert any(added)  # the random model brings in others once it may
    for new in added:  # each new instrument on a track of its own
        assert len(set(new)) == len(new) and not set(new) & own


def mixed_band() -> pretty_midi.PrettyMIDI:
    """`band` with a mix: the bass turned down at 2 s (and again after the 3 s cut), its bend range set to an
    octave (RPN 0) and bent; the guitar panned right with reverb, a modulation gesture, the sustain pedal down
    and a bend held at the cut; the kit's volume and a reset of all controllers."""
    pm = band()
    cc = pretty_midi.ControlChange
    drums, bass, guitar = pm.instruments
    drums.control_changes = [cc(121, 0, 0.0), cc(7, 100, 0.0)]
    octave = [cc(101, 0, 0.0), cc(100, 0, 0.0), cc(6, 12, 0.0), cc(101, 127, 0.0), cc(100, 127, 0.0)]
    bass.control_changes = [*octave, cc(7, 90, 0.0), cc(10, 30, 0.0), cc(7, 60, 2.0), cc(7, 20, 3.5)]
    bass.pitch_bends = [pretty_midi.PitchBend(4096, 1.0), pretty_midi.PitchBend(0, 1.5)]
    guitar.control_changes = [cc(10, 100, 0.0), cc(91, 40, 0.0), cc(1, 64, 1.0), cc(64, 127, 2.5)]
    guitar.pitch_bends = [pretty_midi.PitchBend(2000, 1.0), pretty_midi.PitchBend(4000, 2.5)]
    return pm


def _controls(inst) -> list[tuple[int, int, float]]:
    return [(c.number, c.value, round(c.time, 2)) for c in inst.control_changes]


def test_a_continuation_starts_each_track_with_its_mix_at_the_cut():
    primer = prepare_primer(CODEC, as_bytes(mixed_band()), motif_end=3.0)
    # every track plays, so that each is read back; the piano is a new track
    new = tokens(
        ("shift", 30), ("inst", DRUMS), ("on", 36), ("inst", 33), ("on", 40), ("inst", 29), ("on", 64),
        ("inst", 0), ("on", 60), ("shift", 20), ("off", 60), ("inst", 29), ("off", 64), ("inst", 33),
        ("off", 40), ("inst", DRUMS), ("off", 36),
    )  # fmt: skip
    pm = written(render(CODEC, primer, new))
    drums, bass, guitar, piano = pm.instruments
    assert _controls(drums) == [(7, 100, 0.0)]
    assert _controls(bass) == [(7, 60, 0.0), (10, 30, 0.0)]  # the volume at the cut, not the first or later
    assert _controls(guitar) == [(10, 100, 0.0), (91, 40, 0.0)]  # no modulation gesture, no pedal
    assert piano.name == "Acoustic Grand Piano" and _controls(piano) == [] and piano.pitch_bends == []
    assert guitar.pitch_bends == []  # the continuation plays in tune


def test_include_primer_brings_back_the_motifs_controllers_and_bends_up_to_the_cut():
    primer = prepare_primer(CODEC, as_bytes(mixed_band()), motif_end=3.0)
    pm = written(render(CODEC, primer, tokens(("shift", 30)), include_primer=True))
    drums, bass, guitar = pm.instruments
    assert _controls(drums) == [(7, 100, 0.0)]  # no reset
    assert _controls(bass) == [(7, 90, 0.0), (10, 30, 0.0), (7, 60, 2.0)]  # none after the cut, no RPN
    assert bass.pitch_bends == []  # its bend range (an octave) cannot be written back: in tune only without
    assert _controls(guitar) == [(10, 100, 0.0), (91, 40, 0.0), (1, 64, 1.0)]  # the pedal never
    assert [(b.pitch, round(b.time, 2)) for b in guitar.pitch_bends] == [(2000, 1.0), (4000, 2.5), (0, 3.0)]
