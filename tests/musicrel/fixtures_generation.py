"""Tiny untrained models, motifs and a grammar checker shared by the generation tests (grammar, primer,
sampling, generate, batch)."""

from __future__ import annotations

import io

import numpy as np
import pretty_midi
import torch

from musicrel.midi.codec import EventCodec
from musicrel.model.config import ModelConfig
from musicrel.model.transformer import MusicTransformer

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
