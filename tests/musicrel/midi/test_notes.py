"""musicrel.midi.notes.read: a file's signatures wherever its tracks keep them (MuseScore writes a key
signature on every staff; pretty_midi reads track 0's alone), so what is written back keeps them."""

from __future__ import annotations

import io

import mido
import pytest

from musicrel.midi.codec import CodecConfig, EventCodec

CODEC = EventCodec(CodecConfig(instruments=True))


def musescore_like() -> bytes:
    """Track 0 the tempo and a 4/4; each staff its own key signatures (D major, then F major at bar 3),
    the second staff a 3/4 at bar 5, and one staff a C major at bar 3 as well (the first staff's F wins)."""
    mf = mido.MidiFile(ticks_per_beat=480)
    conductor = mido.MidiTrack(
        [
            mido.MetaMessage("set_tempo", tempo=500_000, time=0),
            mido.MetaMessage("time_signature", numerator=4, denominator=4, time=0),
        ]
    )
    mf.tracks.append(conductor)
    for staff, (program, pitch) in enumerate(((40, 74), (42, 50))):
        track = mido.MidiTrack([mido.MetaMessage("key_signature", key="D", time=0)])
        track.append(mido.Message("program_change", program=program, channel=staff, time=0))
        for _ in range(8):  # a half note per beat pair, 16 beats: 8 s at 120 bpm
            track.append(mido.Message("note_on", note=pitch, velocity=80, channel=staff, time=0))
            track.append(mido.Message("note_off", note=pitch, velocity=0, channel=staff, time=960))
        # bar 3 starts at tick 3,840: insert the key change there by splitting the delta times
        events, tick, out = list(track), 0, []
        for msg in events:
            tick += msg.time
            out.append((tick, msg))
        out.append((3840, mido.MetaMessage("key_signature", key="F" if staff == 0 else "C", time=0)))
        if staff == 1:
            out.append((7680, mido.MetaMessage("time_signature", numerator=3, denominator=4, time=0)))
        out.sort(key=lambda tm: (tm[0], not tm[1].is_meta))
        rebuilt, last = mido.MidiTrack(), 0
        for t, msg in out:
            rebuilt.append(msg.copy(time=t - last))
            last = t
        mf.tracks.append(rebuilt)
    buffer = io.BytesIO()
    mf.save(file=buffer)
    return buffer.getvalue()


def test_key_and_time_signatures_on_later_tracks_are_read():
    pm = CODEC.read(musescore_like())
    keys = [(k.key_number, k.time) for k in pm.key_signature_changes]
    assert keys == [(2, 0.0), (5, pytest.approx(4.0))]  # D major; F major at bar 3 (the first staff's)
    meters = [(t.numerator, t.denominator, t.time) for t in pm.time_signature_changes]
    assert meters == [(4, 4, 0.0), (3, 4, pytest.approx(8.0))]
    assert sum(len(i.notes) for i in pm.instruments) == 16  # the notes read as before


def test_signatures_written_back_are_kept():
    pm = CODEC.read(musescore_like())
    buffer = io.BytesIO()
    pm.write(buffer)
    again = CODEC.read(buffer.getvalue())
    assert [(k.key_number, round(k.time, 6)) for k in again.key_signature_changes] == [(2, 0.0), (5, 4.0)]
    assert [(t.numerator, round(t.time, 6)) for t in again.time_signature_changes] == [(4, 0.0), (3, 8.0)]


def test_a_file_with_signatures_on_track_0_alone_reads_as_pretty_midi_reads_it():
    mf = mido.MidiFile(ticks_per_beat=480)
    track = mido.MidiTrack(
        [
            mido.MetaMessage("key_signature", key="Bbm", time=0),
            mido.Message("note_on", note=60, velocity=80, time=0),
            mido.Message("note_off", note=60, velocity=0, time=480),
        ]
    )
    mf.tracks.append(track)
    buffer = io.BytesIO()
    mf.save(file=buffer)
    pm = CODEC.read(buffer.getvalue())
    assert [(k.key_number, k.time) for k in pm.key_signature_changes] == [(22, 0.0)]
    assert pm.time_signature_changes == []


def test_track_0s_signature_wins_at_a_tick_later_tracks_also_mark():
    mf = mido.MidiFile(ticks_per_beat=480)
    mf.tracks.append(mido.MidiTrack([mido.MetaMessage("key_signature", key="G", time=0)]))
    mf.tracks.append(
        mido.MidiTrack(
            [
                mido.MetaMessage("key_signature", key="D", time=0),
                mido.Message("note_on", note=62, velocity=80, time=0),
                mido.Message("note_off", note=62, velocity=0, time=480),
                mido.MetaMessage("key_signature", key="A", time=0),  # at tick 480, where track 0 says nothing
            ]
        )
    )
    buffer = io.BytesIO()
    mf.save(file=buffer)
    pm = CODEC.read(buffer.getvalue())
    assert [(k.key_number, k.time) for k in pm.key_signature_changes] == [(7, 0.0), (9, pytest.approx(0.5))]
