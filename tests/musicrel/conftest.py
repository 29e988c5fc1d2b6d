"""Helpers and fixtures shared by the library's tests: raw Standard MIDI File bytes built by hand for the
hostile-input tests (no files are shipped); tiny untrained models, motifs and a grammar checker for the
generation tests. A test module that defines its own `model` uses that one."""

from __future__ import annotations

import io

import numpy as np
import pretty_midi
import pytest
import torch

from musicrel.midi.codec import EventCodec
from musicrel.model.config import ModelConfig
from musicrel.model.transformer import MusicTransformer

# ---- raw MIDI bytes -----------------------------------------------------------------------------------


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


# ---- generation: tiny models and motifs ---------------------------------------------------------------

CODEC = EventCodec()
STEP = CODEC.config.step_ms / 1000.0


def tiny_model(max_seq_len: int = 128, seed: int = 0) -> MusicTransformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=CODEC.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=max_seq_len
    )
    return MusicTransformer(cfg).eval()


def make_motif(
    n_notes: int = 16, tempo: float = 96.0, program: int = 24, offset: float = 0.0, drums: bool = True
):
    pm = pretty_midi.PrettyMIDI(initial_tempo=tempo)
    if drums:  # a drum track first: the kept program must be the first NON-drum one
        kit = pretty_midi.Instrument(program=0, is_drum=True)
        kit.notes = [pretty_midi.Note(100, 36, offset + k * 0.5, offset + k * 0.5 + 0.1) for k in range(4)]
        pm.instruments.append(kit)
    inst = pretty_midi.Instrument(program=program)
    for k in range(n_notes):
        start = offset + k * 0.25
        inst.notes.append(pretty_midi.Note(70 + k % 5 * 5, 60 + (k * 7) % 12, start, start + 0.35))
    pm.instruments.append(inst)
    return pm


def midi_bytes(pm: pretty_midi.PrettyMIDI) -> bytes:
    buf = io.BytesIO()
    pm.write(buf)
    return buf.getvalue()


def notes_of(pm):
    return [
        (n.pitch, n.velocity, round(n.start, 4), round(n.end, 4)) for i in pm.instruments for n in i.notes
    ]


def check_grammar(tokens: np.ndarray, start_open: np.ndarray | None = None) -> None:
    """Replays a generated stream: note-offs only for sounding pitches, no specials (a note-on of a sounding
    pitch is a legal re-strike)."""
    sounding = np.zeros(128, bool) if start_open is None else start_open.copy()
    for t in tokens:
        t = int(t)
        assert t not in (CODEC.pad_id, CODEC.bos_id, CODEC.eos_id)
        if CODEC.note_on_offset <= t < CODEC.note_on_offset + 128:
            sounding[t - CODEC.note_on_offset] = True
        elif CODEC.note_off_offset <= t < CODEC.note_off_offset + 128:
            assert sounding[t - CODEC.note_off_offset], "orphan note-off"
            sounding[t - CODEC.note_off_offset] = False


@pytest.fixture(scope="module")
def one_thread():
    # Tiny models on a shared machine: thread hand-offs cost more than the arithmetic.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model() -> MusicTransformer:
    return tiny_model()
