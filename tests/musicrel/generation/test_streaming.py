"""NoteStream reports, chunk by chunk, exactly the notes `render` writes for the same tokens."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musicrel.generation.primer import Primer, render
from musicrel.generation.streaming import NoteStream
from musicrel.midi.codec import EventCodec

CODEC = EventCodec()
PITCHES = (60, 62, 67)


def _token(kind: str, value: int) -> int:
    if kind == "on":
        return CODEC.note_on_offset + PITCHES[value % 3]
    if kind == "off":
        return CODEC.note_off_offset + PITCHES[value % 3]
    if kind == "shift":
        return CODEC.time_shift_offset + value % 3  # 1..3 steps
    if kind == "velocity":
        return CODEC.velocity_offset + value % CODEC.config.velocity_bins
    return CODEC.eos_id  # ignored by the decoder, as in a file


# Few pitches and short shifts: re-strikes on one step, one-step notes and notes open at the end are common.
tokens_st = st.lists(
    st.tuples(
        st.sampled_from(["on", "off", "shift", "shift", "velocity", "special"]), st.integers(0, 63)
    ).map(lambda kv: _token(*kv)),
    max_size=60,
)


def replay(primer_tokens, new_tokens, cuts, tail: int = 0) -> list[tuple[float, float, int, int]]:
    """Feed the tokens in chunks split at `cuts`, apply every event, return the notes (start, end, pitch,
    velocity); checks the event protocol on the way. `tail`: the primer's steps of silence before the cut."""
    stream = NoteStream(CODEC, np.asarray(primer_tokens, dtype=np.int64), tail)
    notes: dict[int, list] = {}
    ended: set[int] = set()
    bounds = [0, *sorted(c % (len(new_tokens) + 1) for c in cuts), len(new_tokens)]
    events = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        events += stream.feed(new_tokens[a:b])
    events += stream.close()
    assert stream.close() == []
    for e in events:
        if e.kind == "on":
            assert e.id == len(notes), "ids number the notes in the order they start"
            notes[e.id] = [e.time, None, e.pitch, e.velocity]
        else:
            assert e.id in notes and e.id not in ended, f"{e.kind} of a note that is not sounding"
            ended.add(e.id)
            if e.kind == "off":
                assert e.time > notes[e.id][0]
                notes[e.id][1] = e.time
            else:
                notes[e.id][1] = "drop"
    assert ended == set(notes), "every note ends by close()"
    return sorted((s, e, p, v) for s, e, p, v in notes.values() if e != "drop")


def rendered(primer_tokens, new_tokens, tail: int = 0) -> list[tuple[float, float, int, int]]:
    primer = Primer(np.asarray(primer_tokens, dtype=np.int64), 0.0, 0.0, 120.0, 0, [], tail_steps=tail)
    pm = render(CODEC, primer, np.asarray(new_tokens, dtype=np.int64))
    return sorted((n.start, n.end, n.pitch, n.velocity) for n in pm.instruments[0].notes)


@settings(max_examples=400, deadline=None)
@given(tokens_st, tokens_st, st.lists(st.integers(0, 60), max_size=4), st.sampled_from([0, 0, 1, 2, 5]))
def test_streamed_notes_are_the_rendered_notes(primer_tokens, new_tokens, cuts, tail):
    # Any stream, with a silence before the cut too (notes struck before it, as a stream decoded without
    # the join could strike them, are heard in neither).
    got = replay(primer_tokens, new_tokens, cuts, tail)
    want = rendered(primer_tokens, new_tokens, tail)
    assert len(got) == len(want)
    np.testing.assert_allclose(np.array(got).reshape(-1, 4), np.array(want).reshape(-1, 4), atol=1e-9)


def test_onsets_come_with_their_note_on_and_ends_wait_for_time_to_move():
    on, off, shift = CODEC.note_on_offset, CODEC.note_off_offset, CODEC.time_shift_offset
    vel = CODEC.velocity_offset + 20
    stream = NoteStream(CODEC, [vel, on + 50, shift + 9, off + 50])  # a primer note: never reported
    first = stream.feed([on + 60])
    assert [(e.kind, e.pitch, e.time) for e in first] == [("on", 60, 0.0)]
    assert first[0].velocity == CODEC._bin_velocity[20]  # the primer's velocity carries over
    # A note-off on the note-on's own step: one step long, unless struck again on that step, so wait.
    assert stream.feed([off + 60]) == []
    assert [(e.kind, e.id, e.time) for e in stream.feed([shift + 4])] == [("off", 0, pytest.approx(0.01))]
    # Struck again on its own step: the first strike is not in the file.
    events = stream.feed([on + 64, on + 64])
    assert [(e.kind, e.id) for e in events] == [("on", 1), ("drop", 1), ("on", 2)]
    assert [(e.kind, e.id, e.time) for e in stream.close()] == [("drop", 2, pytest.approx(0.05))]
    with pytest.raises(ValueError, match="closed"):
        stream.feed([on + 60])


def test_the_clock_starts_at_the_cut_after_the_primers_silence():
    on, off, shift = CODEC.note_on_offset, CODEC.note_off_offset, CODEC.time_shift_offset
    # The primer ends on a note-off; the cut is 0.7 s later (its tail), which the decoder covers with 1 s.
    stream = NoteStream(CODEC, [on + 50, shift + 9, off + 50], tail_steps=70)
    assert stream.feed([shift + 99]) == []
    events = stream.feed([on + 60, shift + 9]) + stream.close()
    assert [(e.kind, e.pitch, e.time) for e in events] == [
        ("on", 60, pytest.approx(0.3)),  # 1 s after the primer's end is 0.3 s after the cut
        ("off", 60, pytest.approx(0.4)),
    ]
