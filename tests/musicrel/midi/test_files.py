"""musicrel.midi.files: which files count as MIDI, and copy_midi (what infills and accompaniments answer)."""

from __future__ import annotations

import io

import pretty_midi
import pytest

from musicrel.midi.files import DEFAULT_BPM, Timeline, copy_midi, find_midi_files, prevailing_tempo


def _song() -> pretty_midi.PrettyMIDI:
    pm = pretty_midi.PrettyMIDI(initial_tempo=96)
    pm.time_signature_changes.append(pretty_midi.TimeSignature(3, 4, 0.0))
    pm.key_signature_changes.append(pretty_midi.KeySignature(2, 0.0))
    pm.lyrics.append(pretty_midi.Lyric("la", 0.5))
    piano = pretty_midi.Instrument(program=0, name="piano")
    piano.notes = [pretty_midi.Note(80, 60 + k, 0.3 * k, 0.3 * k + 0.25) for k in range(12)]
    piano.control_changes = [pretty_midi.ControlChange(64, 127, 0.1), pretty_midi.ControlChange(64, 0, 1.9)]
    piano.pitch_bends = [pretty_midi.PitchBend(512, 0.7)]
    bass = pretty_midi.Instrument(program=33, name="bass")
    bass.notes = [pretty_midi.Note(90, 36, 0.0, 1.5)]
    pm.instruments = [piano, bass]
    return pm


def _bytes(pm) -> bytes:
    buffer = io.BytesIO()
    pm.write(buffer)
    return buffer.getvalue()


def test_copy_midi_writes_the_same_file_and_changes_alone():
    pm = _song()
    before = _bytes(pm)
    out = copy_midi(pm)
    assert _bytes(out) == before
    # every event is the copy's own: changing them leaves the original as it was
    out.instruments[0].notes[0].pitch = 20
    out.instruments[0].notes.append(pretty_midi.Note(70, 72, 4.0, 4.5))
    out.instruments[0].control_changes[0].value = 1
    out.instruments[0].pitch_bends[0].pitch = -100
    out.instruments[1].program = 40
    out.time_signature_changes[0].numerator = 5
    out.lyrics[0].text = "lo"
    out.adjust_times([0.0, 10.0], [0.0, 20.0])  # rebuilds the copy's tempo map
    assert _bytes(pm) == before
    assert pm.get_tempo_changes()[1][0] == pytest.approx(96.0)


def test_copy_midi_keeps_the_instruments_asked_for():
    pm = _song()
    out = copy_midi(pm, instruments=[1])
    assert [i.name for i in out.instruments] == ["bass"] and len(pm.instruments) == 2
    assert [(n.pitch, n.start, n.end) for n in out.instruments[0].notes] == [(36, 0.0, 1.5)]
    assert out.time_signature_changes[0].numerator == 3  # the signatures and tempo map come along


def test_find_midi_files(tmp_path):
    (tmp_path / "a").mkdir()
    for name in ("a/x.mid", "y.MIDI", "z.txt"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in find_midi_files(tmp_path)] == ["x.mid", "y.MIDI"]
    assert find_midi_files(tmp_path / "y.MIDI") == [tmp_path / "y.MIDI"]
    with pytest.raises(FileNotFoundError):
        find_midi_files(tmp_path / "missing")


def tempo_map_file(notes_every: float | None = None) -> bytes:
    """60 bpm for 10 s, 150 bpm for 2 s, 90 bpm to 30 s, in 3/4 and E flat (a note held over all of it; with
    `notes_every`, a note struck every that many seconds as well)."""
    import mido

    ticks, spans = 480, [(60, 10.0), (150, 2.0), (90, 18.0)]  # (bpm, seconds)
    conductor, played = mido.MidiTrack(), mido.MidiTrack()
    conductor.append(mido.MetaMessage("time_signature", numerator=3, denominator=4))
    conductor.append(mido.MetaMessage("key_signature", key="Eb"))
    now = 0
    for bpm, seconds in spans:
        conductor.append(mido.MetaMessage("set_tempo", tempo=mido.bpm2tempo(bpm), time=0))
        conductor.append(mido.MetaMessage("marker", text=f"{bpm}", time=round(seconds * bpm / 60 * ticks)))
    onsets = [0.0] if notes_every is None else [k * notes_every for k in range(int(30 / notes_every))]

    def tick(t: float) -> int:  # seconds -> ticks through the map above
        out, at = 0.0, 0.0
        for bpm, seconds in spans:
            part = min(max(t - at, 0.0), seconds)
            out, at = out + part * bpm / 60 * ticks, at + seconds
        return round(out)

    events = [(0, mido.Message("note_on", note=40, velocity=70))]
    events += [(tick(30.0), mido.Message("note_off", note=40))]
    for t in onsets[1:] if notes_every else []:
        events += [(tick(t), mido.Message("note_on", note=60, velocity=80))]
        events += [(tick(t + notes_every / 2), mido.Message("note_off", note=60))]
    for t, msg in sorted(events, key=lambda e: (e[0], e[1].type == "note_on")):
        played.append(msg.copy(time=t - now))
        now = t
    out = io.BytesIO()
    mido.MidiFile(ticks_per_beat=ticks, tracks=[conductor, played]).save(file=out)
    return out.getvalue()


@pytest.mark.parametrize(
    ("start", "end", "bpm"),
    [
        (0.0, None, 90.0),  # the whole file: 18 s at 90
        (0.0, 11.0, 60.0),
        (9.5, 11.9, 150.0),  # 1.9 s at 150 against 0.5 at 60
        (9.0, 11.0, 150.0),  # a tie (1 s each): the later tempo
        (11.0, 11.0, 150.0),  # an empty stretch: the tempo in effect there
        (40.0, 50.0, 90.0),  # past the end: the last tempo goes on
    ],
)
def test_the_prevailing_tempo_is_the_one_held_longest_in_the_stretch(start, end, bpm):
    pm = pretty_midi.PrettyMIDI(io.BytesIO(tempo_map_file()))
    assert pm.get_end_time() == pytest.approx(30.0, abs=0.01)
    assert prevailing_tempo(pm, start, end) == pytest.approx(bpm)


def test_a_tempo_that_returns_adds_up():
    """60 bpm for 4 s, 200 for 4.5 s, 60 again from 8.5 s: 60 held 6 s of the first 10.5 against 4.5."""
    import mido

    conductor = mido.MidiTrack()
    for bpm, beats in [(60, 4), (200, 15), (60, 2)]:
        conductor.append(mido.MetaMessage("set_tempo", tempo=mido.bpm2tempo(bpm), time=0))
        conductor.append(mido.MetaMessage("marker", text="", time=beats * 96))
    out = io.BytesIO()
    mido.MidiFile(ticks_per_beat=96, tracks=[conductor]).save(file=out)
    pm = pretty_midi.PrettyMIDI(io.BytesIO(out.getvalue()))
    assert prevailing_tempo(pm, 0.0, 10.5) == pytest.approx(60.0)
    assert prevailing_tempo(pm, 3.0, 10.5) == pytest.approx(200.0)
    assert prevailing_tempo(pretty_midi.PrettyMIDI(), 0.0, 5.0) == DEFAULT_BPM  # no tempo set: MIDI's


@pytest.mark.parametrize(
    ("bpm", "tempi"), [(150.0, [(0, 60), (10, 150)]), (90.0, [(0, 60), (10, 150), (11, 90)])]
)
def test_a_timeline_up_to_a_cut_is_written_into_a_file_without_moving_a_note(bpm, tempi):
    upload = pretty_midi.PrettyMIDI(io.BytesIO(tempo_map_file()))
    timeline = Timeline.of(upload, 11.0)
    assert timeline.tempi == ((0.0, 60.0), (10.0, 150.0))  # the 90 at 12 s is past the cut
    assert timeline.time_signatures == ((0.0, 3, 4),) and len(timeline.key_signatures) == 1
    out = pretty_midi.PrettyMIDI(resolution=960, initial_tempo=120)
    piano = pretty_midi.Instrument(0)
    piano.notes = [pretty_midi.Note(80, 60, t, t + 0.3) for t in (0.5, 9.9, 10.7, 11.4, 25.0)]
    out.instruments.append(piano)
    timeline.write_into(out, 11.0, bpm)
    back = pretty_midi.PrettyMIDI(io.BytesIO(_bytes(out)))
    times, bpms = back.get_tempo_changes()
    assert [(round(t, 3), round(b, 3)) for t, b in zip(times, bpms, strict=True)] == tempi
    assert [n.start for n in back.instruments[0].notes] == pytest.approx(
        [0.5, 9.9, 10.7, 11.4, 25.0], abs=1e-3
    )
    assert [(c.numerator, c.denominator) for c in back.time_signature_changes] == [(3, 4)]
    assert [c.key_number for c in back.key_signature_changes] == [upload.key_signature_changes[0].key_number]
    # bars up to the cut: the 3/4 downbeats where the upload's are (every 3 s at 60 bpm, 1.2 s at 150)
    ours, theirs = back.get_downbeats(), upload.get_downbeats()
    assert ours[ours < 11.0] == pytest.approx(theirs[theirs < 11.0], abs=1e-3)
    assert len(ours[ours < 11.0]) == 5  # 0, 3, 6, 9, 10.8
