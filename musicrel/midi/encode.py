"""Notes -> event tokens: the order of the events at one step, SET_VELOCITY on a bin change, the TIME_SHIFTs
between steps, and a melody's MELODY tokens interleaved with its part. The conventions are in
`musicrel.midi.codec`'s docstring; `codec` here is an `EventCodec` (its ids and step)."""

from __future__ import annotations

import numpy as np

from musicrel.errors import ConfigError
from musicrel.midi.notes import Notes


def to_steps(codec, seconds) -> np.ndarray:
    """Round (not truncate) to the step grid."""
    return np.floor(np.asarray(seconds, dtype=np.float64) / codec.step + 0.5).astype(np.int64)


def events(codec, notes: Notes) -> tuple[np.ndarray, np.ndarray]:
    """(step, token) of every non-shift token, in stream order."""
    qs = np.maximum(to_steps(codec, notes.start), 0)
    qe = np.maximum(to_steps(codec, notes.end), qs + 1)  # a note shorter than a step still sounds one step
    pitch = np.asarray(notes.pitch, dtype=np.int64)
    vel = np.clip(np.asarray(notes.velocity, dtype=np.int64), 0, 127)
    # without instruments every note is one instrument's (0): the order and tokens are the piano codec's
    with_inst = codec.instrument_offset is not None and notes.instrument is not None
    inst = np.asarray(notes.instrument, dtype=np.int64) if with_inst else np.zeros(len(pitch), np.int64)
    keep = (pitch >= 0) & (pitch <= 127)
    qs, qe, pitch, vel, inst = qs[keep], qe[keep], pitch[keep], vel[keep], inst[keep]
    if not len(qs):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    # quantisation can make notes of one voice (instrument and pitch) collide: keep the longest, end each at
    # the next onset
    voice = inst * 128 + pitch
    order = np.lexsort((-qe, qs, voice))
    qs, qe, pitch, vel, inst, voice = (
        qs[order],
        qe[order],
        pitch[order],
        vel[order],
        inst[order],
        voice[order],
    )
    same = voice[1:] == voice[:-1]
    dup = np.concatenate(([False], same & (qs[1:] == qs[:-1])))
    qs, qe, pitch, vel, inst = qs[~dup], qe[~dup], pitch[~dup], vel[~dup], inst[~dup]
    voice = voice[~dup]
    never = np.iinfo(np.int64).max
    nxt = np.concatenate((np.where(voice[1:] == voice[:-1], qs[1:], never), [never]))
    qe = np.minimum(qe, nxt)

    n = len(qs)
    times = [qe, qs]
    kinds = [np.full(n, 1), np.full(n, 2)]  # at one step: pedal (0), note-off (1), note-on (2)
    toks = [codec.note_off_offset + pitch, codec.note_on_offset + pitch]
    keys = [pitch, pitch]
    insts = [inst, inst]
    bins = [np.full(n, -1), vel * codec.config.velocity_bins // 128]
    if codec.pedal_on_id is not None and len(notes.pedal_time):
        pt = np.maximum(to_steps(codec, notes.pedal_time), 0)
        down = notes.pedal_down
        last = np.concatenate((pt[1:] != pt[:-1], [True]))  # the state at the end of each step counts
        pt, down = pt[last], down[last]
        change = down != np.concatenate(([False], down[:-1]))
        pt, down = pt[change], down[change]
        times.append(pt)
        kinds.append(np.zeros(len(pt), dtype=np.int64))
        toks.append(np.where(down, codec.pedal_on_id, codec.pedal_off_id))
        keys.append(np.zeros(len(pt), dtype=np.int64))
        insts.append(np.full(len(pt), -1))  # the pedal first at its step, before any instrument's notes
        bins.append(np.full(len(pt), -1))
    time, kind, tok, key, ins, vbin = (np.concatenate(x) for x in (times, kinds, toks, keys, insts, bins))
    # at one step: the pedal, then instrument by instrument (ascending, drums last), offs before ons, by pitch
    order = np.lexsort((key, kind, ins, time))
    time, kind, tok, ins, vbin = time[order], kind[order], tok[order], ins[order], vbin[order]
    if with_inst:  # the instrument already playing goes first at its step: one switch fewer
        order = np.lexsort((_rotated(time, ins, kind > 0), time))  # stable: the rest of the order holds
        time, kind, tok, ins, vbin = time[order], kind[order], tok[order], ins[order], vbin[order]
    # SET_VELOCITY only when the bin differs from the previous note-on's
    on = np.flatnonzero(kind == 2)
    on_bins = vbin[on]
    changed = on[on_bins != np.concatenate(([-1], on_bins[:-1]))]
    at, new = changed, codec.velocity_offset + vbin[changed]
    if with_inst:
        # INSTRUMENT before a note event whose instrument is not the previous note event's (before its
        # SET_VELOCITY: np.insert keeps the order of values inserted at one index)
        note = np.flatnonzero(kind > 0)
        switch = note[ins[note] != np.concatenate(([-1], ins[note][:-1]))]
        at = np.concatenate((switch, changed))
        new = np.concatenate((codec.instrument_offset + ins[switch], new))
        first = np.argsort(at, kind="stable")
        at, new = at[first], new[first]
    tok = np.insert(tok, at, new)
    time = np.insert(time, at, time[at])
    return time, tok


def _rotated(time: np.ndarray, ins: np.ndarray, note: np.ndarray) -> np.ndarray:
    """(N,) int64: the order of each event's instrument at its step (`time`, `ins` sorted by step, then
    instrument): the instrument of the previous step's last note event first (-1) when it plays at this step,
    the others by number; the pedal (not a note event) before all (-2). Saves one INSTRUMENT token a step
    where an instrument goes on playing: on the multi corpus 15 to 45 % of them (a file's steps are walked
    in Python, once per (step, instrument))."""
    out = np.full(len(time), -2, dtype=np.int64)
    where = np.flatnonzero(note)
    if not len(where):
        return out
    pair = time[where] * 256 + ins[where]  # sorted: by step, then instrument (< 256)
    first = np.concatenate(([True], pair[1:] != pair[:-1]))
    uniq_t, uniq_i = time[where][first].tolist(), ins[where][first].tolist()
    rank = list(uniq_i)
    last, a = -1, 0
    while a < len(uniq_t):
        b = a
        while b < len(uniq_t) and uniq_t[b] == uniq_t[a]:
            b += 1
        step = uniq_i[a:b]
        if last in step and len(step) > 1:
            rank[a + step.index(last)] = -1
            last = step[-1] if step[-1] != last else step[-2]
        else:
            last = step[-1]
        a = b
    out[where] = np.asarray(rank, dtype=np.int64)[np.cumsum(first) - 1]
    return out


def with_shifts(codec, time: np.ndarray, tok: np.ndarray, end_time: int | None = None) -> np.ndarray:
    """Interleave TIME_SHIFT tokens so that token i happens at step time[i] (non-decreasing)."""
    if end_time is not None:
        time = np.append(time, max(end_time, time[-1] if len(time) else 0))
    delta = np.diff(time, prepend=0)
    m = codec.config.max_shift_steps
    full, rem = delta // m, delta % m
    nshift = full + (rem > 0)
    count = nshift + 1
    if end_time is not None:
        count[-1] -= 1  # the end marker itself emits no token
    pos = np.cumsum(count) - count  # where each event's shifts begin
    out = np.empty(int(count.sum()), dtype=np.int32)
    # full shifts: pos[i] + 0 .. full[i]-1
    total_full = int(full.sum())
    if total_full:
        first = np.repeat(pos, full)
        within = np.arange(total_full) - np.repeat(np.cumsum(full) - full, full)
        out[first + within] = codec.time_shift_offset + m - 1
    r = rem > 0
    out[(pos + full)[r]] = codec.time_shift_offset + rem[r] - 1
    ev = pos + nshift
    out[ev[:-1] if end_time is not None else ev] = tok
    return out


def melody_events(codec, melody: Notes) -> tuple[np.ndarray, np.ndarray]:
    """A melody -> (step, MELODY token) of its events in stream order (velocities dropped)."""
    if codec.melody_on_offset is None:
        raise ConfigError("this codec has no melody tokens (CodecConfig.melody is false)", code="no_melody")
    mt, mtok = events(codec, melody)
    keep = codec.is_note_on(mtok) | codec.is_note_off(mtok)  # a melody carries no velocity
    mt, mtok = mt[keep], mtok[keep]
    lead = codec.melody_lead_steps
    if lead:  # ahead of time; order kept (a stable sort later merges them with the part)
        mt = np.maximum(mt - lead, 0)
    on = codec.is_note_on(mtok)
    melody_off = codec.melody_off_offset + mtok - codec.note_off_offset
    return mt, np.where(on, codec.melody_on_offset + mtok, melody_off)


def melody_stream(codec, melody: Notes, part: Notes) -> np.ndarray:
    """The melody's events first at each step, then the part's, with the shifts between steps."""
    mt, mtok = melody_events(codec, melody)
    time, tok = events(codec, part)
    both_t, both = np.concatenate((mt, time)), np.concatenate((mtok, tok))
    order = np.argsort(both_t, kind="stable")
    return with_shifts(codec, both_t[order], both[order])
