"""Parser fuzz (issue 15's suite): whatever bytes come in, EventCodec.encode returns valid tokens or raises
InvalidMidiError with a stable code, and does so quickly. The mutations are the ones that reach past the
header check: byte edits, inserted and deleted runs, chunk lengths and VLQ deltas rewritten, spliced copies
and truncation, applied to well-formed files of one and several tracks."""

from __future__ import annotations

import re
import time

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from musicrel.errors import InvalidMidiError
from musicrel.midi.codec import EventCodec
from tests.musicrel.conftest import note_track, simple_file, smf

CODEC = EventCodec()
# Far above what these few-hundred-byte inputs need (milliseconds), far below a parser that loops or balloons
# on a hostile length field; generous because the test machine is shared.
TIME_BOUND_S = 2.0

SEEDS = [
    simple_file(12),
    smf([b"\x00\xb0\x40\x7f" + note_track([(5, 900, 62), (480, 200, 64)], channel=1)]),
    smf([note_track([(0, 240, 60)]), note_track([(120, 240, 67)], channel=9)], fmt=1),
    smf([note_track([(i * 30, 60, 40 + i) for i in range(40)])], fmt=0, division=96),
]


@st.composite
def mutated(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["set", "insert", "delete", "length", "vlq", "splice"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "set" and data:
            data[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 16))]
        elif kind == "length":  # a chunk length (or any 4 bytes) claiming far more or less than is there
            value = draw(st.sampled_from([0, 1, 6, 2**16, 2**31 - 1, 2**32 - 1]))
            data[at : at + 4] = value.to_bytes(4, "big")
        elif kind == "vlq":  # a delta time of endless continuation bytes
            data[at:at] = b"\xff" * draw(st.integers(1, 12)) + b"\x7f"
        elif kind == "splice":  # a copied region pasted elsewhere: plausible events in the wrong place
            start = draw(st.integers(0, max(len(data) - 1, 0)))
            data[at:at] = data[start : start + draw(st.integers(1, 64))]
    return bytes(data[: len(data) - draw(st.integers(0, 32))])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_midi_encodes_or_raises_invalid_midi_quickly(data):
    start = time.perf_counter()
    try:
        tokens = CODEC.encode(data)
    except InvalidMidiError as exc:
        assert re.fullmatch(r"[a-z_]+", exc.code) and exc.code != "invalid_midi", exc.code
        assert str(exc)
    else:
        assert tokens.ndim == 1 and np.issubdtype(tokens.dtype, np.integer)
        assert tokens.size == 0 or (tokens.min() >= 0 and tokens.max() < CODEC.vocab_size)
    elapsed = time.perf_counter() - start
    assert elapsed < TIME_BOUND_S, f"{elapsed:.2f} s for {len(data)} bytes"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=512))
@example(b"\x00\xf1")  # a system-common message cut off by the end of the file: was max() of nothing
def test_arbitrary_bytes_after_a_valid_header_encode_or_raise_invalid_midi(tail):
    """The header passes, so every byte of the track data reaches the event parser."""
    data = simple_file(1)[:14] + b"MTrk" + len(tail).to_bytes(4, "big") + tail
    start = time.perf_counter()
    try:
        CODEC.encode(data)
    except InvalidMidiError as exc:
        assert re.fullmatch(r"[a-z_]+", exc.code) and exc.code != "invalid_midi", exc.code
    assert time.perf_counter() - start < TIME_BOUND_S
