"""`midi.edit`: an infill's notes written into the upload's own messages. Files built message by message with
what pretty_midi drops or rewrites (markers, copyright, SysEx, ports, an empty track, controllers, a type-0
file, a track that changes program): every message but the notes edited comes back as sent, and the notes
read back are the edited file's; where the edit cannot be exact, pretty_midi's rewrite."""

from __future__ import annotations

import io

import mido
import pretty_midi
import pytest

from musicrel.midi.codec import CodecConfig, EventCodec
from musicrel.midi.edit import edited, written
from musicrel.midi.files import copy_midi

CODEC = EventCodec(CodecConfig(instruments=True))
TPB = 96  # ticks a beat; 120 bpm: a tick is 1/192 s


def _track(*timed) -> mido.MidiTrack:
    """A track from (absolute tick, message) pairs."""
    out, now = mido.MidiTrack(), 0
    for tick, msg in sorted(timed, key=lambda e: e[0]):
        out.append(msg.copy(time=tick - now))
        now = tick
    return out


def _notes(channel, pitch, ticks, velocity=80, off="note_off"):
    """(tick, message) pairs of notes at `ticks` ((start, end) pairs)."""
    pairs = []
    for start, end in ticks:
        pairs.append((start, mido.Message("note_on", channel=channel, note=pitch, velocity=velocity)))
        stop = mido.Message(off, channel=channel, note=pitch, velocity=0)
        pairs.append((end, stop))
    return pairs


def band() -> bytes:
    """Type 1: a conductor track with what pretty_midi does not keep, an empty track chunk, a bass with a
    port, controllers and a pitch bend, drums closed by velocity-0 note-ons, a track of controllers alone."""
    meta = mido.MetaMessage
    conductor = _track(
        (0, meta("set_tempo", tempo=500_001)),  # 1 us off 120 bpm: pretty_midi's rewrite rounds it
        (0, meta("copyright", text="(c) a band")),
        (0, mido.Message("sysex", data=[0x41, 0x10, 0x42, 0x12, 0x40, 0x00, 0x7F, 0x00, 0x41])),
        (0, meta("marker", text="verse")),
        (TPB * 8, meta("marker", text="chorus")),
        (TPB * 8, meta("cue_marker", text="lights")),
    )
    beats = [(TPB * b, TPB * b + TPB // 2) for b in range(16)]
    bass = _track(
        (0, meta("midi_port", port=1)),
        (0, meta("track_name", name="Bass")),
        (0, mido.Message("program_change", channel=1, program=33)),
        (0, mido.Message("control_change", channel=1, control=7, value=100)),
        (TPB * 3, mido.Message("pitchwheel", channel=1, pitch=512)),
        (TPB * 5, mido.Message("control_change", channel=1, control=10, value=20)),
        *_notes(1, 40, beats),
    )
    drums = _track(
        (0, meta("track_name", name="Drums")),
        *_notes(9, 36, beats[::2], velocity=110, off="note_on"),
        *_notes(9, 42, beats, velocity=70, off="note_on"),
    )
    knobs = _track(
        (0, meta("track_name", name="FX")), (TPB, mido.Message("control_change", channel=3, control=91))
    )
    mf = mido.MidiFile(type=1, ticks_per_beat=TPB)
    mf.tracks += [conductor, mido.MidiTrack(), bass, drums, knobs]
    out = io.BytesIO()
    mf.save(file=out)
    return out.getvalue()


def refill(pm: pretty_midi.PrettyMIDI, t: int, start: float, end: float, new: list) -> pretty_midi.PrettyMIDI:
    """`pm` with track `t`'s notes that start in [start, end) replaced by `new` ((pitch, start, end))."""
    out = copy_midi(pm)
    inst = out.instruments[t]
    inst.notes = [n for n in inst.notes if not start <= n.start < end]
    inst.notes += [pretty_midi.Note(90, p, a, b) for p, a, b in new]
    return out


def absolute(data: bytes) -> list[list[tuple]]:
    """Each track's messages as (absolute tick, message without its delta)."""
    tracks = []
    for track in mido.MidiFile(file=io.BytesIO(data)).tracks:
        tick, out = 0, []
        for msg in track:
            tick += msg.time
            out.append((tick, msg.copy(time=0)))
        tracks.append(out)
    return tracks


def notes_of(pm) -> list[list[tuple]]:
    return [
        sorted((n.pitch, round(n.start, 4), round(n.end, 4), n.velocity) for n in i.notes)
        for i in pm.instruments
    ]


def test_an_edit_changes_the_notes_asked_for_and_no_other_message():
    source = band()
    before = CODEC.read(source)
    assert [(i.name, i.program, i.is_drum) for i in before.instruments] == [
        ("Bass", 33, False),
        ("Drums", 0, True),
    ]
    after = refill(before, 0, 2.0, 3.0, [(43, 2.0, 2.25), (45, 2.5, 2.75), (47, 2.75, 3.5)])
    data = edited(source, before, after)
    assert data is not None
    assert notes_of(CODEC.read(data)) == notes_of(after)
    old, new = absolute(source), absolute(data)
    assert len(new) == len(old) == 5 and mido.MidiFile(file=io.BytesIO(data)).type == 1
    for t in (0, 1, 3, 4):  # the conductor, the empty chunk, the drums, the controllers: as sent
        assert new[t] == old[t], t
    notes = ("note_on", "note_off")
    assert [e for e in new[2] if e[1].type not in notes] == [e for e in old[2] if e[1].type not in notes]
    gone = {(tick, msg.type, msg.note) for tick, msg in old[2] if msg.type in notes} - {
        (tick, msg.type, msg.note) for tick, msg in new[2] if msg.type in notes
    }
    assert gone == {(TPB * b, "note_on", 40) for b in (4, 5)} | {
        (TPB * b + TPB // 2, "note_off", 40) for b in (4, 5)
    }
    # pretty_midi's own rewrite loses what the edit keeps
    rewritten = absolute(written(None, before, [after])[0])
    kinds = {msg.type for track in rewritten for _, msg in track}
    assert not kinds & {"copyright", "sysex", "marker", "cue_marker", "midi_port"}
    assert written(source, before, [after]) == [data]


def test_a_note_off_that_also_closes_a_kept_note_stays():
    # two strikes of one pitch closed by one note-off (pretty_midi closes both with it): the first kept,
    # the second (in the span) removed
    mf = mido.MidiFile(type=1, ticks_per_beat=TPB)
    on = mido.Message("note_on", channel=0, note=60, velocity=80)
    mf.tracks.append(
        _track(
            (0, mido.Message("program_change", channel=0, program=40)),
            (0, on),
            (TPB * 4, on),
            (TPB * 6, mido.Message("note_off", channel=0, note=60)),
            *_notes(0, 64, [(TPB * 8, TPB * 9)]),
        )
    )
    buffer = io.BytesIO()
    mf.save(file=buffer)
    source = buffer.getvalue()
    before = CODEC.read(source)
    assert notes_of(before) == [[(60, 0.0, 3.0, 80), (60, 2.0, 3.0, 80), (64, 4.0, 4.5, 80)]]
    after = refill(before, 0, 1.5, 2.5, [])
    data = edited(source, before, after)
    assert data is not None and notes_of(CODEC.read(data)) == [[(60, 0.0, 3.0, 80), (64, 4.0, 4.5, 80)]]


def test_a_type_0_file_stays_one_track():
    mf = mido.MidiFile(type=0, ticks_per_beat=TPB)
    mf.tracks.append(
        _track(
            (0, mido.MetaMessage("marker", text="intro")),
            (0, mido.Message("program_change", channel=0, program=0)),
            (0, mido.Message("program_change", channel=1, program=40)),
            *_notes(0, 48, [(TPB * b, TPB * b + TPB) for b in range(12)]),
            *_notes(1, 76, [(TPB * b, TPB * b + TPB // 2) for b in range(12)]),
        )
    )
    buffer = io.BytesIO()
    mf.save(file=buffer)
    source = buffer.getvalue()
    before = CODEC.read(source)
    after = refill(before, 1, 1.0, 2.0, [(79, 1.0, 1.25), (81, 1.5, 1.75)])  # on ticks: 1/192 s
    data = edited(source, before, after)
    assert data is not None
    back = mido.MidiFile(file=io.BytesIO(data))
    assert back.type == 0 and len(back.tracks) == 1 and back.tracks[0][0] == mf.tracks[0][0]
    assert notes_of(CODEC.read(data)) == notes_of(after)


def changing_program() -> bytes:
    """One track, one channel: a piano, then strings from beat 4 (pretty_midi: two instruments)."""
    mf = mido.MidiFile(type=1, ticks_per_beat=TPB)
    mf.tracks.append(
        _track(
            (0, mido.Message("program_change", channel=0, program=0)),
            (TPB * 4 - 1, mido.Message("program_change", channel=0, program=48)),
            *_notes(0, 60, [(TPB * b, TPB * b + TPB // 2) for b in range(8)]),
        )
    )
    buffer = io.BytesIO()
    mf.save(file=buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("at, exact", [(0.5, True), (3.0, False)])
def test_a_new_note_where_its_program_is_not_in_effect_falls_back_to_a_rewrite(at, exact):
    source = changing_program()
    before = CODEC.read(source)
    assert [i.program for i in before.instruments] == [0, 48]
    after = refill(before, 0, at, at + 0.25, [(67, at, at + 0.25)])  # a piano note: at 3 s the strings play
    assert (edited(source, before, after) is not None) == exact
    assert notes_of(CODEC.read(written(source, before, [after])[0])) == notes_of(after)


def test_other_instruments_or_another_file_are_no_edit():
    source = band()
    before = CODEC.read(source)
    fewer = copy_midi(before, [0])
    assert edited(source, before, fewer) is None
    other = CODEC.read(changing_program())
    assert edited(source, other, copy_midi(other)) is None


def test_bytes_mido_cannot_read_get_the_rewrite():
    before = CODEC.read(band())
    after = refill(before, 0, 2.0, 3.0, [(43, 2.0, 2.25)])
    assert notes_of(CODEC.read(written(b"MThd\x00\x00", before, [after])[0])) == notes_of(after)
