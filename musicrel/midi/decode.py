"""Event tokens -> notes and pedal changes: any integer sequence decodes (the conventions are in
`musicrel.midi.codec`'s docstring); `codec` here is an `EventCodec` (its ids and step)."""

from __future__ import annotations

import numpy as np
import pretty_midi

OPEN_NOTE_MIN_SECONDS = 0.1


def decode_tokens(codec, tokens) -> tuple[list[pretty_midi.Note], list[tuple[float, bool]], list[int]]:
    """(notes sorted by (start, instrument, pitch), [(time, pedal down)], each note's instrument).

    The instrument is the last INSTRUMENT token's (0, the piano, before the first and for a codec without
    instruments); one sounding note per (instrument, pitch)."""
    try:
        toks = np.asarray(tokens).astype(np.int64, copy=False).ravel().tolist()
    except (OverflowError, TypeError, ValueError):  # ints beyond int64 are out of range anyway
        toks = [int(t) if abs(int(t)) < 1 << 62 else -1 for t in np.asarray(tokens, dtype=object).ravel()]
    step = codec.step
    off_off, ts_off, vel_off = codec.note_off_offset, codec.time_shift_offset, codec.velocity_offset
    vel_end = vel_off + codec.config.velocity_bins
    bin_velocity = codec._bin_velocity.tolist()
    inst_lo = codec.instrument_offset if codec.instrument_offset is not None else -1
    inst_hi = inst_lo + codec.num_instruments if inst_lo >= 0 else -1
    base = 0  # the instrument in effect x 128: notes are keyed by voice = instrument x 128 + pitch
    t = 0
    velocity = 64
    open_notes: dict[int, tuple[int, int]] = {}  # voice -> (start step, velocity)
    last_closed: dict[int, int] = {}  # voice -> index in notes, to trim a one-step note a re-strike overlaps
    notes: list[list] = []  # [start step, end step, voice, velocity]
    pedal: list[tuple[int, bool]] = []
    pedal_down = False
    for tok in toks:
        if tok < 0:
            continue
        if tok < off_off:
            voice = base + tok
            prev = open_notes.pop(voice, None)
            if prev is not None and prev[0] < t:
                last_closed[voice] = len(notes)
                notes.append([prev[0], t, voice, prev[1]])
            j = last_closed.get(voice)
            if j is not None and notes[j][1] > t:  # a one-step note would overlap the re-strike
                notes[j][1] = t
            open_notes[voice] = (t, velocity)
        elif tok < ts_off:
            voice = base + tok - off_off
            prev = open_notes.pop(voice, None)
            if prev is not None:
                last_closed[voice] = len(notes)
                notes.append([prev[0], max(t, prev[0] + 1), voice, prev[1]])
        elif tok < vel_off:
            t += tok - ts_off + 1
        elif tok < vel_end:
            velocity = bin_velocity[tok - vel_off]
        elif tok == codec.pedal_on_id or tok == codec.pedal_off_id:
            down = tok == codec.pedal_on_id
            if down != pedal_down:
                pedal.append((t, down))
                pedal_down = down
        elif inst_lo <= tok < inst_hi:
            base = (tok - inst_lo) * 128
    min_open = max(1, round(OPEN_NOTE_MIN_SECONDS / step))
    for voice, (s, v) in open_notes.items():
        notes.append([s, max(t, s + min_open), voice, v])
    notes = [n for n in notes if n[1] > n[0]]
    notes.sort(key=lambda n: (n[0], n[2]))
    out = [pretty_midi.Note(velocity=v, pitch=p % 128, start=s * step, end=e * step) for s, e, p, v in notes]
    return out, [(s * step, d) for s, d in pedal], [n[2] // 128 for n in notes]
