"""Raw Standard MIDI File bytes built by hand, for hostile-input tests (no files are shipped)."""

from __future__ import annotations

import io


def vlq(n: int) -> bytes:
    """Variable-length quantity, as in SMF delta times."""
    out = [n & 0x7F]
    n >>= 7
    while n:
        out.append(0x80 | (n & 0x7F))
        n >>= 7
    return bytes(reversed(out))


def chunk(kind: bytes, body: bytes) -> bytes:
    return kind + len(body).to_bytes(4, "big") + body


def smf(tracks: list[bytes], fmt: int = 1, division: int = 480, ntracks: int | None = None) -> bytes:
    """A file from track bodies (event bytes, end-of-track appended by the caller when wanted)."""
    n = len(tracks) if ntracks is None else ntracks
    header = chunk(b"MThd", fmt.to_bytes(2, "big") + n.to_bytes(2, "big") + division.to_bytes(2, "big"))
    return header + b"".join(chunk(b"MTrk", t) for t in tracks)


EOT = b"\x00\xff\x2f\x00"


def note_track(notes: list[tuple[int, int, int]], channel: int = 0) -> bytes:
    """Track body from (start tick, end tick, pitch) triples, velocity 80."""
    events = []
    for s, e, p in notes:
        events.append((s, 1, bytes((0x90 | channel, p, 80))))
        events.append((e, 0, bytes((0x80 | channel, p, 0))))
    events.sort(key=lambda x: (x[0], x[1]))
    body, now = b"", 0
    for t, _, msg in events:
        body += vlq(t - now) + msg
        now = t
    return body + EOT


def simple_file(n_notes: int = 8, division: int = 480) -> bytes:
    """A valid type-1 file: a tempo track and a piano track of quarter notes."""
    tempo = b"\x00\xff\x51\x03\x07\xa1\x20" + EOT
    return smf(
        [tempo, note_track([(i * division, (i + 1) * division, 60 + i % 12) for i in range(n_notes)])],
        1,
        division,
    )


def far_tick_file() -> bytes:
    """The 37-byte hazard: one note whose note-off sits at tick 9,999,990."""
    body = b"\x00\x90\x3c\x40" + vlq(9_999_990) + b"\x80\x3c\x00" + EOT
    return smf([body], fmt=0, division=96)


def mido_bytes(mid) -> bytes:
    buf = io.BytesIO()
    mid.save(file=buf)
    return buf.getvalue()
