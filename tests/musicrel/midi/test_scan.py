"""The pre-scan: every hostile-input hazard rejected with its code, quickly, before any parser runs; and the
fast note extraction matching pretty_midi exactly."""

from __future__ import annotations

import time
import tracemalloc

import mido
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musicrel.errors import InvalidMidiError
from musicrel.midi.codec import CodecConfig, EventCodec
from musicrel.midi.scan import instruments_from_scan, scan
from tests.musicrel.conftest import EOT, far_tick_file, mido_bytes, note_track, simple_file, smf, vlq

DEFAULT = CodecConfig()


def code_of(data: bytes, config: CodecConfig = DEFAULT) -> str:
    with pytest.raises(InvalidMidiError) as info:
        EventCodec(config).encode(data)
    # the pretty_midi path rejects the same way
    with pytest.raises(InvalidMidiError) as info2:
        EventCodec(config).read(data)
    assert info.value.code == info2.value.code
    return info.value.code


def test_valid_file_scans():
    result = scan(simple_file(8), DEFAULT)
    assert (result.format, result.n_tracks, result.division) == (1, 2, 480)
    assert result.max_tick == 8 * 480
    assert result.seconds == pytest.approx(8 * 0.5)  # 120 bpm tempo event
    assert result.n_events == 2 + 2 * 8 + 1


def test_not_midi():
    assert code_of(b"hello, this is not a MIDI file at all") == "not_midi"
    assert code_of(b"RIFF\x00\x00\x00\x00RMIDdata") == "not_midi"
    assert code_of(b"") == "not_midi"


def test_truncated_header():
    assert code_of(b"MThd\x00\x00\x00\x06\x00\x01") == "truncated"


def test_truncated_track():
    data = simple_file(8)
    assert code_of(data[:-7]) == "truncated"  # chunk length says more than the file holds
    assert code_of(smf([b"\x00\x90\x3c"])) == "truncated"  # event cut inside its chunk
    assert code_of(simple_file(2)[: -len(simple_file(2)) + 30]) == "truncated"


def test_missing_tracks_truncated():
    data = smf([note_track([(0, 10, 60)])], ntracks=3)
    assert code_of(data) == "truncated"


def test_smpte_division():
    assert code_of(smf([note_track([(0, 10, 60)])], division=0xE728)) == "smpte_division"


def test_zero_division():
    assert code_of(smf([note_track([(0, 10, 60)])], division=0)) == "zero_division"


def test_far_tick_37_bytes_rejected_without_parsing():
    data = far_tick_file()
    assert len(data) == 37
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(InvalidMidiError) as info:
        EventCodec().encode(data)
    with pytest.raises(InvalidMidiError):
        EventCodec().read(data)
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert info.value.code == "too_long"
    assert peak < 10 * 1024 * 1024, f"peak {peak / 2**20:.1f} MiB: the file reached the parser"
    assert elapsed < 0.5


def test_far_tick_rejected_by_seconds_when_ticks_allowed():
    # same file, ticks cap lifted: the tempo map still says ~14 hours
    assert code_of(far_tick_file(), CodecConfig(max_ticks=20_000_000)) == "too_long"


def test_slow_tempo_too_long_in_seconds():
    tempo = b"\x00\xff\x51\x03\xff\xff\xff"  # 16.7 s per beat
    data = smf([tempo + note_track([(0, 40_000, 60)])], fmt=0, division=96)
    assert scan(data, CodecConfig(max_seconds=10_000.0)).seconds == pytest.approx(40_000 / 96 * 16.777215)
    assert code_of(data) == "too_long"


def test_320kb_of_ff_delta_rejected_fast():
    body = b"\xff" * 320_000 + b"\x00\x90\x3c\x40"
    data = smf([body], fmt=0)
    t0 = time.perf_counter()
    assert code_of(data) == "not_midi"
    assert time.perf_counter() - t0 < 0.5


def test_too_many_tracks():
    tracks = [note_track([(0, 10, 60)]) for _ in range(300)]
    assert code_of(smf(tracks)) == "too_many_tracks"
    assert code_of(smf(tracks[:20]), CodecConfig(max_tracks=10)) == "too_many_tracks"
    EventCodec(CodecConfig(max_tracks=20)).encode(smf(tracks[:20]))  # at the cap: fine


def test_too_many_events():
    data = simple_file(600)
    assert code_of(data, CodecConfig(max_events=1000)) == "too_many_events"
    assert len(EventCodec(CodecConfig(max_events=1300)).encode(data)) > 0


def test_too_large():
    data = simple_file(200)
    assert code_of(data, CodecConfig(max_bytes=len(data) - 1)) == "too_large"
    huge = simple_file(8) + b"\x00" * (DEFAULT.max_bytes + 1)
    assert code_of(huge) == "too_large"


def test_too_large_file_not_read_whole(tmp_path):
    path = tmp_path / "big.mid"
    path.write_bytes(simple_file(8) + b"\x00" * 3_000)
    with pytest.raises(InvalidMidiError) as info:
        EventCodec(CodecConfig(max_bytes=1_000)).encode(path)
    assert info.value.code == "too_large"


def test_data_byte_out_of_range():
    body = b"\x00\xb0\x07\xa8" + EOT  # CC value 168, as in the shared ValueError_Control168.mid
    assert code_of(smf([body + note_track([(0, 10, 60)])], fmt=0)) == "bad_data_byte"
    assert code_of(smf([b"\x00\x3c\x40" + EOT])) == "bad_data_byte"  # running status with no status
    assert code_of(smf([b"\x00\xf0\x03\x01\x99\xf7" + EOT])) == "bad_data_byte"  # sysex data byte


@pytest.mark.parametrize(
    "event",
    [
        b"\x00\xff\x51\x03\x00\x00\x00",  # tempo 0: pretty_midi divides by it
        b"\x00\xff\x51\x01\x07",  # short tempo: mido IndexError
        b"\x00\xff\x59\x02\x09\x00",  # key signature with 9 sharps: mido KeySignatureError
        b"\x00\xff\x58\x04\x00\x02\x18\x08",  # time signature numerator 0: pretty_midi ValueError
        b"\x00\xf4",  # undefined status byte: mido OSError
    ],
)
def test_events_the_parsers_crash_on(event):
    assert code_of(smf([event + note_track([(0, 10, 60)])], fmt=0)) == "bad_event"


def test_meta_longer_than_track_truncated():
    assert code_of(smf([b"\x00\xff\x01\x7f\x41\x41" + EOT])) == "truncated"


def test_shared_broken_files(broken_midi_files):
    codes = {}
    for path in broken_midi_files:
        with pytest.raises(InvalidMidiError) as info:
            EventCodec().encode(path)
        codes[path.name] = info.value.code
    assert codes["empty.mid"] == "no_notes"
    assert codes["ValueError_Control168.mid"] == "bad_data_byte"


def test_empty_track_chunk_is_tolerated():
    data = smf([b"", note_track([(0, 480, 60)])])
    pm = EventCodec().read(data)  # pretty_midi alone raises ValueError on an empty track
    assert [n.pitch for n in pm.instruments[0].notes] == [60]
    assert np.array_equal(EventCodec().encode(data), EventCodec().encode(pm))


# ---------------------------------------------------------------- fast path == pretty_midi

_event = st.tuples(
    st.integers(0, 40),  # delta ticks
    st.sampled_from(["on", "on", "off", "off", "cc", "program", "zero_on"]),
    st.sampled_from([0, 1, 9]),  # channel
    st.sampled_from([60, 61, 64]),  # pitch
    st.sampled_from([0, 30, 64, 127]),  # value
)


def _random_file(tracks, tempos) -> bytes:
    mid = mido.MidiFile(type=1, ticks_per_beat=96)
    first = mido.MidiTrack()
    for delta, tempo in tempos:
        first.append(mido.MetaMessage("set_tempo", tempo=tempo, time=delta))
    mid.tracks.append(first)
    for events in tracks:
        track = mido.MidiTrack()
        for delta, kind, ch, pitch, value in events:
            if kind == "on":
                track.append(
                    mido.Message("note_on", channel=ch, note=pitch, velocity=max(value, 1), time=delta)
                )
            elif kind == "zero_on":
                track.append(mido.Message("note_on", channel=ch, note=pitch, velocity=0, time=delta))
            elif kind == "off":
                track.append(mido.Message("note_off", channel=ch, note=pitch, velocity=0, time=delta))
            elif kind == "cc":
                track.append(mido.Message("control_change", channel=ch, control=64, value=value, time=delta))
            else:
                track.append(mido.Message("program_change", channel=ch, program=value % 8, time=delta))
        mid.tracks.append(track)
    return mido_bytes(mid)


@settings(max_examples=60, deadline=None)
@given(
    tracks=st.lists(st.lists(_event, max_size=40), min_size=1, max_size=3),
    tempos=st.lists(st.tuples(st.integers(0, 100), st.integers(200_000, 1_500_000)), max_size=3),
)
def test_fast_instruments_match_pretty_midi(tracks, tempos):
    """Same instruments, same order, same notes and sustain changes, bit-identical float times."""
    data = _random_file(tracks, tempos)
    fast = instruments_from_scan(scan(data, DEFAULT, collect=True))
    pm = EventCodec().read(data)
    assert len(fast) == len(pm.instruments)
    for raw, inst in zip(fast, pm.instruments, strict=True):
        assert (raw.program, raw.is_drum) == (inst.program, inst.is_drum)
        expected = np.array([(n.start, n.end, n.pitch, n.velocity) for n in inst.notes]).reshape(-1, 4)
        assert np.array_equal(
            raw.notes[np.lexsort(raw.notes.T[::-1])], expected[np.lexsort(expected.T[::-1])]
        )
        ccs = np.array([(c.time, c.value) for c in inst.control_changes if c.number == 64]).reshape(-1, 2)
        assert np.array_equal(raw.sustain, ccs)


@settings(max_examples=60, deadline=None)
@given(
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
    cut=st.integers(0, 200),
)
def test_mutated_files_only_raise_invalid_midi(edits, cut):
    """Random byte edits and truncation of a valid file: a typed error or a result, never a parser crash; when
    both paths succeed they agree."""
    data = bytearray(
        simple_file(12) + smf([b"\x00\xb0\x40\x7f" + note_track([(5, 900, 62)], channel=1)])[14:]
    )
    for pos, value in edits:
        data[pos % len(data)] = value
    data = bytes(data[: len(data) - cut])
    codec = EventCodec()
    try:
        fast = codec.encode(data)
    except InvalidMidiError:
        fast = None
    try:
        slow = codec.encode(codec.read(data))
    except InvalidMidiError:
        slow = None
    if fast is not None and slow is not None:
        assert np.array_equal(fast, slow)
    else:
        assert fast is None and slow is None


def test_far_tick_file_is_what_it_claims():
    big = CodecConfig(max_ticks=20_000_000, max_seconds=1e6)
    assert vlq(127) == b"\x7f" and vlq(128) == b"\x81\x00"
    assert scan(far_tick_file(), big).max_tick == 9_999_990
