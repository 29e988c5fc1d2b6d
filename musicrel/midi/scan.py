"""A cheap pure-Python pre-scan of Standard MIDI File bytes, run before any parser sees them.

mido/pretty_midi trust the file: a 37-byte file with one note at tick 9,999,990 makes pretty_midi allocate a
~230 MB tick table, a delta-time of 320 KB of 0xFF bytes makes mido loop quadratically, and bad bytes surface
as OSError/ValueError/KeyError from deep inside the parser. `scan` walks every event of every track once
(O(n), no allocation per tick) and raises `InvalidMidiError` with a stable code before anything expensive
happens.

`scan(..., collect=True)` also keeps the few channel events the codec needs, and `instruments_from_scan` turns
them into notes and sustain-pedal changes exactly as pretty_midi would (same instruments in the same order,
same float times), so `EventCodec.encode` can skip mido/pretty_midi entirely on the hot path.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np

from musicrel.errors import InvalidMidiError

# mido refuses longer sysex/meta payloads (OSError); reject them up front instead.
MAX_MESSAGE_LENGTH = 1_000_000
# Status bytes mido cannot decode.
_UNDEFINED_STATUS = frozenset((0xF4, 0xF5, 0xF9, 0xFD))
# Data-byte counts of the system common messages mido reads from files; realtime ones carry none.
_SYSTEM_DATA = {0xF1: 1, 0xF2: 2, 0xF3: 1}
_SUSTAIN = 64


class Limits(Protocol):
    """The caps `scan` enforces (a `CodecConfig` provides them)."""

    max_bytes: int
    max_tracks: int
    max_events: int
    max_ticks: int
    max_seconds: float


@dataclass
class MidiScan:
    """What the pre-scan learned about a file."""

    format: int
    division: int  # ticks per quarter note
    n_tracks: int
    n_events: int
    max_tick: int
    seconds: float  # length in seconds under pretty_midi's tempo map (first non-empty track)
    tempos: list[tuple[int, int]]  # (tick, microseconds per beat) from the first non-empty track
    # with collect=True, per non-empty track: completed notes and sustain changes (see `scan`)
    tracks: list[list[tuple[int, int, int, int, int, int]]] | None = field(default=None, repr=False)


@dataclass
class RawInstrument:
    """An instrument as pretty_midi builds it: notes (N, 4) [start, end, pitch, velocity] in seconds and
    sustain-pedal changes (M, 2) [time, value]."""

    program: int
    is_drum: bool
    notes: np.ndarray
    sustain: np.ndarray


def _err(message: str, code: str) -> InvalidMidiError:
    return InvalidMidiError(message, code=code)


def _varlen(trk: bytes, p: int) -> tuple[int, int]:
    """Variable-length quantity at trk[p]: (value, next position). At most 4 bytes, as the SMF spec says; a
    longer run of continuation bytes (the 320 KB 0xFF hazard) is rejected at the fifth byte."""
    value = 0
    for _ in range(4):
        b = trk[p]
        p += 1
        value = (value << 7) | (b & 0x7F)
        if b < 0x80:
            return value, p
    raise _err("variable-length quantity longer than 4 bytes", "not_midi")


def _check_meta(mtype: int, payload: bytes, track: int) -> None:
    """Reject meta events that mido or pretty_midi would crash on while decoding."""
    n = len(payload)
    bad = None
    if mtype == 0x00 and n == 1 or mtype == 0x20 and n == 0:
        bad = "short sequence-number/channel-prefix"
    elif mtype == 0x51 and (n < 3 or int.from_bytes(payload[:3], "big") == 0):
        bad = "tempo must be 3 bytes and non-zero"
    elif mtype == 0x54 and (n < 5 or payload[0] >> 5 > 3):
        bad = "malformed SMPTE offset"
    elif mtype == 0x58 and (n < 4 or payload[0] == 0):
        bad = "malformed time signature"
    elif mtype == 0x59:
        key = payload[0] - 256 if n and payload[0] > 127 else payload[0] if n else 0
        if n < 2 or not -7 <= key <= 7 or payload[1] > 1:
            bad = "malformed key signature"
    if bad:
        raise _err(f"track {track}: {bad}", "bad_event")


def _header(data: bytes, limits: Limits) -> tuple[int, int, int, int]:
    """The MThd chunk checked against `limits`: (format, track count, ticks per beat, where the first track
    starts)."""
    n = len(data)
    if n > limits.max_bytes:
        raise _err(f"file is {n} bytes, more than max_bytes={limits.max_bytes}", "too_large")
    if data[:4] != b"MThd":
        raise _err("not a MIDI file (no MThd header)", "not_midi")
    if n < 14:
        raise _err("file ends inside the MThd header", "truncated")
    hlen = int.from_bytes(data[4:8], "big")
    if hlen < 6:
        raise _err(f"MThd header length {hlen} < 6", "not_midi")
    if 8 + hlen > n:
        raise _err("file ends inside the MThd header", "truncated")
    fmt = int.from_bytes(data[8:10], "big")
    ntracks = int.from_bytes(data[10:12], "big")
    division = int.from_bytes(data[12:14], "big")
    if fmt > 2:
        raise _err(f"unknown MIDI format {fmt}", "not_midi")
    if division & 0x8000:
        raise _err("SMPTE time division is not supported", "smpte_division")
    if division == 0:
        raise _err("time division is 0 ticks per beat", "zero_division")
    if ntracks > limits.max_tracks:
        raise _err(f"{ntracks} tracks, more than max_tracks={limits.max_tracks}", "too_many_tracks")
    return fmt, ntracks, division, 8 + hlen


def scan(data: bytes, limits: Limits, collect: bool = False) -> MidiScan:
    """Validate raw SMF bytes against `limits` in one O(n) pass; InvalidMidiError on the first problem."""
    fmt, ntracks, division, pos = _header(data, limits)
    n_events = 0
    max_tick = 0
    tempos: list[tuple[int, int]] | None = None  # from the first non-empty track, as pretty_midi reads them
    tracks: list[list[tuple[int, int, int, int, int, int]]] = []
    for t, trk in enumerate(_track_chunks(data, pos, ntracks)):
        track = _scan_track(trk, t, limits, n_events, collect)
        n_events = track.n_events
        if trk:
            if tempos is None:
                tempos = track.tempos
            max_tick = max(max_tick, track.tick)
            if collect:
                tracks.append(track.records)

    tempos = tempos or []
    seconds = float(tick_times(np.array([max_tick]), tempos, division)[0])
    if seconds > limits.max_seconds:
        raise _err(f"file lasts {seconds:.0f} s, more than max_seconds={limits.max_seconds:g}", "too_long")
    return MidiScan(fmt, division, ntracks, n_events, max_tick, seconds, tempos, tracks if collect else None)


def _track_chunks(data: bytes, pos: int, ntracks: int) -> Iterator[bytes]:
    """The body of each MTrk chunk from `pos` on, checked to be one and to fit in the file; lazily, so a
    track's events are scanned before the next chunk's framing is."""
    n = len(data)
    for t in range(ntracks):
        if pos + 8 > n:
            raise _err(f"file ends before track {t} of {ntracks}", "truncated")
        if data[pos : pos + 4] != b"MTrk":
            raise _err(f"chunk {t} is not an MTrk track", "not_midi")
        clen = int.from_bytes(data[pos + 4 : pos + 8], "big")
        if pos + 8 + clen > n:
            raise _err(f"track {t} claims {clen} bytes but the file ends first", "truncated")
        yield data[pos + 8 : pos + 8 + clen]
        pos += 8 + clen


class _Track(NamedTuple):
    """What scanning one track chunk found."""

    tick: int  # the track's last tick
    n_events: int  # events so far in the file, this track's included
    tempos: list[tuple[int, int]]  # (tick, microseconds per beat)
    # with collect: completed notes (start, end, pitch, velocity, channel, program at note-off) and sustain
    # changes (tick, -1, value, 0, channel, program), in file order; unclosed notes are dropped
    records: list[tuple[int, int, int, int, int, int]]


def _scan_track(trk: bytes, t: int, limits: Limits, n_events: int, collect: bool) -> _Track:
    """Walk every event of track `t` once, counting on from `n_events`."""
    max_ticks, max_events = limits.max_ticks, limits.max_events
    end = len(trk)
    # with collect: notes paired as they go by, as pretty_midi does, rather than in a second pass; inline,
    # because a call per channel event made the collecting scan (EventCodec.encode's hot path) 17 % slower
    records: list[tuple[int, int, int, int, int, int]] = []
    open_notes: dict[int, list[tuple[int, int]]] = {}  # note-on status << 7 | pitch -> [(tick, velocity)]
    program = [0] * 16
    tempos: list[tuple[int, int]] = []
    tick = 0
    running = 0
    p = 0
    try:
        while p < end:
            # delta time, unrolled: this loop is the hot path of the whole codec
            b = trk[p]
            p += 1
            if b > 127:
                delta = b & 0x7F
                b = trk[p]
                p += 1
                delta = (delta << 7) | (b & 0x7F)
                if b > 127:
                    b = trk[p]
                    p += 1
                    delta = (delta << 7) | (b & 0x7F)
                    if b > 127:
                        b = trk[p]
                        p += 1
                        delta = (delta << 7) | (b & 0x7F)
                        if b > 127:
                            raise _err("variable-length quantity longer than 4 bytes", "not_midi")
                tick += delta
                if tick > max_ticks:
                    raise _err(f"track {t} reaches tick {tick}, more than max_ticks={max_ticks}", "too_long")
            else:
                tick += b
            n_events += 1
            if n_events > max_events:
                raise _err(f"more than max_events={max_events} events", "too_many_events")
            st = trk[p]
            if st < 0x80:
                if not running:
                    raise _err(
                        f"track {t}: data byte 0x{st:02x} where a status byte belongs", "bad_data_byte"
                    )
                st = running
            else:
                p += 1
            if st < 0xF0:
                running = st
                hi = st & 0xF0
                d1 = trk[p]
                if hi == 0xC0 or hi == 0xD0:
                    p += 1
                    d2 = 0
                else:
                    d2 = trk[p + 1]
                    p += 2
                if d1 > 127 or d2 > 127:
                    raise _err(f"track {t}: data byte out of range 0..127 at tick {tick}", "bad_data_byte")
                if not collect:
                    continue
                if hi == 0x90 and d2:
                    key = st << 7 | d1
                    opened = open_notes.get(key)
                    if opened is None:
                        open_notes[key] = [(tick, d2)]
                    else:
                        opened.append((tick, d2))
                elif hi <= 0x90:
                    key = (st | 0x10) << 7 | d1  # the note-on status of this channel
                    opened = open_notes.pop(key, None)
                    if opened is None:
                        continue
                    ch = st & 0x0F
                    if len(opened) > 1:
                        if keep := _close_notes(records, opened, d1, tick, ch, program[ch]):
                            open_notes[key] = keep
                    elif opened[0][0] != tick:
                        records.append((opened[0][0], tick, d1, opened[0][1], ch, program[ch]))
                elif hi == 0xC0:
                    program[st & 0x0F] = d1
                elif hi == 0xB0 and d1 == _SUSTAIN:
                    records.append((tick, -1, d2, 0, st & 0x0F, program[st & 0x0F]))
            elif st == 0xFF:  # meta: does not touch running status (mido agrees)
                p = _meta_event(trk, p, t, tick, tempos)
            elif st == 0xF0 or st == 0xF7:
                running = 0
                p = _sysex_event(trk, p, t)
            else:
                running = 0
                p = _system_event(trk, p, st, t)
    except IndexError:
        raise _err(f"track {t}: last event runs past the end of its track chunk", "truncated") from None
    if p != end:
        raise _err(f"track {t}: last event runs past the end of its track chunk", "truncated")
    if tick > max_ticks:
        raise _err(f"track {t} reaches tick {tick}, more than max_ticks={max_ticks}", "too_long")
    return _Track(tick, n_events, tempos, records)


def _close_notes(
    records: list[tuple[int, int, int, int, int, int]],
    opened: list[tuple[int, int]],
    pitch: int,
    tick: int,
    ch: int,
    program: int,
) -> list[tuple[int, int]]:
    """A note-off for a pitch with several open notes closes every one started on an earlier tick, as
    pretty_midi does; the notes it leaves open."""
    close = [sv for sv in opened if sv[0] != tick]
    keep = [sv for sv in opened if sv[0] == tick]
    for s0, v0 in close:
        records.append((s0, tick, pitch, v0, ch, program))
    return keep if close else []


def _meta_event(trk: bytes, p: int, t: int, tick: int, tempos: list[tuple[int, int]]) -> int:
    """Check the meta event whose type byte is at trk[p], keeping a tempo change in `tempos`; where the next
    event starts."""
    mtype = trk[p]
    length, p = _varlen(trk, p + 1)
    if length > MAX_MESSAGE_LENGTH or p + length > len(trk):
        raise _err(f"track {t}: meta event runs past the end of its track", "truncated")
    payload = trk[p : p + length]
    if mtype in (0x00, 0x20, 0x51, 0x54, 0x58, 0x59):
        _check_meta(mtype, payload, t)
        if mtype == 0x51:
            tempos.append((tick, int.from_bytes(payload[:3], "big")))
    return p + length


def _sysex_event(trk: bytes, p: int, t: int) -> int:
    """Check the sysex event whose length starts at trk[p]; where the next event starts."""
    length, p = _varlen(trk, p)
    if length > MAX_MESSAGE_LENGTH or p + length > len(trk):
        raise _err(f"track {t}: sysex runs past the end of its track", "truncated")
    payload = trk[p : p + length]
    inner = payload[1 if payload[:1] == b"\xf0" else 0 : -1 if payload[-1:] == b"\xf7" else None]
    if inner and max(inner) > 127:
        raise _err(f"track {t}: sysex data byte out of range 0..127", "bad_data_byte")
    return p + length


def _system_event(trk: bytes, p: int, st: int, t: int) -> int:
    """Check a system common or realtime message of status `st` whose data starts at trk[p]; where the next
    event starts."""
    if st in _UNDEFINED_STATUS:
        raise _err(f"track {t}: undefined status byte 0x{st:02x}", "bad_event")
    k = _SYSTEM_DATA.get(st, 0)
    # Checked before the data bytes are: max() of a message cut off at the end of the file would be max() of
    # nothing (ValueError, a 500 at the API), found by the parser fuzz.
    if p + k > len(trk):
        raise _err(f"track {t}: last event runs past the end of its track chunk", "truncated")
    if k and max(trk[p : p + k]) > 127:
        raise _err(f"track {t}: data byte out of range 0..127", "bad_data_byte")
    return p + k


def _tick_scales(tempos: list[tuple[int, int]], division: int) -> list[tuple[int, float]]:
    """pretty_midi's `_tick_scales`: tempo at tick 0 replaces the default 120 bpm, repeats are ignored."""
    scales = [(0, 60.0 / (120.0 * division))]
    for tick, tempo in tempos:
        if tick == 0:
            bpm = 6e7 / tempo
            scales = [(0, 60.0 / (bpm * division))]
        else:
            scale = 60.0 / ((6e7 / tempo) * division)
            if scale != scales[-1][1]:
                scales.append((tick, scale))
    return scales


def tick_times(ticks: np.ndarray, tempos: list[tuple[int, int]], division: int) -> np.ndarray:
    """Seconds of each tick, bit-identical to pretty_midi's tick table, without one slot per tick."""
    scales = _tick_scales(tempos, division)
    starts = np.array([s for s, _ in scales], dtype=np.int64)
    scale = np.array([c for _, c in scales], dtype=np.float64)
    offsets = np.zeros(len(scales), dtype=np.float64)
    for i in range(1, len(scales)):  # same float operations, in the same order, as pretty_midi
        offsets[i] = offsets[i - 1] + scale[i - 1] * (starts[i] - starts[i - 1])
    ticks = np.asarray(ticks, dtype=np.int64)
    seg = np.searchsorted(starts, ticks, side="right") - 1
    return offsets[seg] + scale[seg] * (ticks - starts[seg])


def instruments_from_scan(result: MidiScan) -> list[RawInstrument]:
    """Notes and sustain changes per instrument, reproducing pretty_midi's `_load_instruments`: an instrument
    is (program at note-off, channel, track), created at its first completed note, in file order; control
    changes seen on a (channel, track) before its instrument exists go to a "straggler" list that every
    instrument created later on that (channel, track) shares."""
    assert result.tracks is not None, "scan(..., collect=True) first"
    out = []
    for records in result.tracks:
        if not records:
            continue
        flat = itertools.chain.from_iterable(records)
        rec = np.fromiter(flat, dtype=np.int64, count=6 * len(records)).reshape(-1, 6)
        # columns: start|tick, end|-1, pitch|value, velocity|0, channel, program
        is_note = rec[:, 1] >= 0
        ch_of = rec[:, 4]
        key = rec[:, 5] * 16 + ch_of
        note_idx = np.flatnonzero(is_note)
        keys, first = np.unique(key[note_idx], return_index=True)
        created = np.full(128 * 16, len(rec), dtype=np.int64)  # key -> record index it was made at
        created[keys] = note_idx[first]
        # which list each sustain change lands in, following pretty_midi's straggler rules
        cc = np.flatnonzero(~is_note)
        exists = created[key[cc]] < cc
        straggler_at = np.full(16, len(rec), dtype=np.int64)  # channel -> record index its straggler appeared
        np.minimum.at(straggler_at, ch_of[cc[~exists]], cc[~exists])
        shares = straggler_at[ch_of] < created[key]  # per record: its instrument uses the straggler list
        list_id = np.where(shares | ~is_note & ~(created[key] < np.arange(len(rec))), -1 - ch_of, key)
        times = tick_times(rec[:, :2].ravel(), result.tempos, result.division).reshape(-1, 2)
        for k in keys[np.argsort(created[keys])].tolist():
            sel = note_idx[key[note_idx] == k]
            notes = np.empty((len(sel), 4), dtype=np.float64)
            notes[:, :2] = times[sel]
            notes[:, 2:] = rec[sel, 2:4]
            own = -1 - k % 16 if shares[sel[0]] else k
            ccs = cc[list_id[cc] == own]
            sustain = np.stack([times[ccs, 0], rec[ccs, 2].astype(np.float64)], axis=1)
            out.append(RawInstrument(k // 16, k % 16 == 9, notes, sustain))
    return out
