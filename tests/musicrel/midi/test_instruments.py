"""Instruments in the event stream (`CodecConfig(instruments=True)`): the vocabulary, the order of events,
drums, one track per instrument on decode, transposition, and round trips of the shared multi-instrument
corpus; and the codecs without instruments (every shipped checkpoint's) unchanged, token for token."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import mido
import numpy as np
import pretty_midi
import pytest

from musicrel.errors import ConfigError
from musicrel.midi.codec import CodecConfig, EventCodec
from musicrel.midi.instruments import DRUMS, NUM_INSTRUMENTS, instrument_name
from tests.conftest import REPO, SHARED_MIDI

N = pretty_midi.Note
INST = CodecConfig(instruments=True)


def pm_with(*instruments, name=""):
    """instruments: (program, is_drum, [(start, end, pitch, velocity)], [(time, cc64 value)])"""
    pm = pretty_midi.PrettyMIDI()
    for program, is_drum, notes, pedal in instruments:
        inst = pretty_midi.Instrument(program=program, is_drum=is_drum, name=name)
        inst.notes = [N(velocity=v, pitch=p, start=s, end=e) for s, e, p, v in notes]
        inst.control_changes = [pretty_midi.ControlChange(64, v, t) for t, v in pedal]
        pm.instruments.append(inst)
    return pm


def band():
    """Piano with pedal, a drum kit, a bass: the file the old-layout tokens below were written from."""
    return pm_with(
        (0, False, [(0.0, 0.5, 60, 80), (0.25, 1.0, 64, 50), (0.5, 0.504, 67, 100)], [(0.2, 127), (0.7, 0)]),
        (0, True, [(0.0, 0.1, 36, 100), (0.5, 0.6, 38, 100)], []),
        (33, False, [(0.5, 1.25, 40, 90), (1.0, 2.3, 60, 30)], []),
    )


def as_bytes(pm) -> bytes:
    buf = io.BytesIO()
    pm.write(buf)
    return buf.getvalue()


# ---------------------------------------------------------------- codecs without instruments: unchanged

# `band()` encoded by the codec as it was before instruments existed (commit 28b8c89's parent), per shipped
# checkpoint's codec: drums dropped, one stream.
_PIANO_STREAM = [
    376,
    60,
    280,
    368,
    64,
    280,
    378,
    40,
    381,
    67,
    275,
    188,
    195,
    285,
    192,
    363,
    60,
    280,
    168,
    355,
]
OLD_TOKENS = {
    "default": _PIANO_STREAM + [260, 188],
    "infill": _PIANO_STREAM + [260, 188],
    "small": _PIANO_STREAM + [260, 188],
    "accompany": [
        448,
        280,
        452,
        280,
        455,
        378,
        40,
        275,
        576,
        583,
        285,
        580,
        363,
        60,
        280,
        168,
        355,
        260,
        188,
    ],
}
OLD_VOCAB = {"default": 391, "infill": 394, "small": 391, "accompany": 647}


@pytest.mark.parametrize("name", sorted(OLD_TOKENS))
def test_shipped_checkpoints_codecs_are_unchanged(name):
    saved = json.loads((REPO / "checkpoints" / name / "config.json").read_text())["codec"]
    config = CodecConfig.from_dict(saved)
    assert not config.instruments and "instruments" not in saved
    # the dict (hence prepare's codec hash and every config.json written from it) is the one saved
    assert config.to_dict() == {**CodecConfig().to_dict(), **saved} and "instruments" not in config.to_dict()
    codec = EventCodec(config)
    assert codec.vocab_size == OLD_VOCAB[name] and codec.instrument_offset is None
    tokens = codec.encode(band())
    assert tokens.tolist() == OLD_TOKENS[name]
    assert np.array_equal(codec.encode(as_bytes(band())), tokens)
    assert not codec.is_instrument(np.arange(codec.vocab_size)).any()
    if not config.melody:
        pm = codec.decode(tokens)
        assert [(i.program, i.is_drum, i.name) for i in pm.instruments] == [(0, False, "musicrel")]


def test_pedal_events_codec_unchanged():
    tokens = EventCodec(CodecConfig(pedal="events")).encode(band())
    assert tokens.tolist() == [
        376, 60, 275, 388, 260, 368, 64, 280, 188, 378, 40, 381, 67, 256, 195, 274, 389, 285, 192, 363, 60,
        280, 168, 355, 260, 188,
    ]  # fmt: skip


# ---------------------------------------------------------------- vocabulary and config


def test_instrument_tokens_come_after_every_other_id():
    for base in (CodecConfig(), CodecConfig(infill=True), CodecConfig(pedal="events", infill=True)):
        old = EventCodec(base)
        new = EventCodec(CodecConfig.from_dict({**base.to_dict(), "instruments": True}))
        assert new.vocab_size == old.vocab_size + NUM_INSTRUMENTS == old.vocab_size + 129
        for attr in ("pad_id", "bos_id", "eos_id", "future_id", "fill_id", "pedal_on_id", "velocity_offset"):
            assert getattr(new, attr) == getattr(old, attr)
        assert new.instrument_offset == old.vocab_size and new.drums_id == new.vocab_size - 1
        ids = np.arange(new.vocab_size)
        assert new.is_instrument(ids).sum() == 129 and not new.is_special(ids[new.instrument_offset :]).any()
        assert new.is_special(ids).sum() == old.is_special(np.arange(old.vocab_size)).sum()
        assert new.time_advance[new.instrument_offset :].sum() == 0


def test_instruments_config():
    assert CodecConfig.from_json(INST.to_json()) == INST and INST.to_dict()["instruments"] is True
    assert (
        CodecConfig.from_dict({k: v for k, v in INST.to_dict().items() if k != "instruments"})
        == CodecConfig()
    )
    with pytest.raises(ConfigError, match="instruments"):
        CodecConfig(instruments="yes")
    with pytest.raises(ConfigError, match="melody and CodecConfig.instruments"):
        CodecConfig(instruments=True, melody=True, tracks=[0, 1])
    for codec in (EventCodec(), EventCodec(CodecConfig(infill=True))):
        with pytest.raises(ConfigError) as info:
            codec.decode_instrument_notes([60])
        assert info.value.code == "no_instruments"


# ---------------------------------------------------------------- encoding


def test_instrument_token_before_a_note_event_of_another_instrument():
    c = EventCodec(INST)
    piano, bass, drums = (c.instrument_offset + i for i in (0, 33, DRUMS))
    pm = pm_with(
        (0, False, [(0.0, 0.5, 60, 80)], []),
        (33, False, [(0.0, 0.5, 40, 80), (0.5, 0.6, 41, 80)], []),
        (0, True, [(0.0, 0.1, 36, 100)], []),
    )
    v80, v100 = c.velocity_offset + 80 * 32 // 128, c.velocity_offset + 100 * 32 // 128
    shift = lambda steps: c.time_shift_offset + steps - 1  # noqa: E731
    # at one step: instrument by instrument (ascending, drums last), offs before ons, by pitch; INSTRUMENT
    # before SET_VELOCITY; the velocity state is shared by every instrument
    assert c.encode(pm).tolist() == [
        piano, v80, 60, bass, 40, drums, v100, 36,
        shift(10), 128 + 36,  # the drums' note-off: the drums are already the instrument
        shift(40), piano, 128 + 60, bass, 128 + 40, v80, 41,  # the drums, last heard, are silent: by number
        shift(10), 128 + 41,
    ]  # fmt: skip


def test_the_instrument_playing_goes_first_at_the_next_step():
    c = EventCodec(INST)
    piano, bass = c.instrument_offset, c.instrument_offset + 33
    pm = pm_with(
        (0, False, [(0.0, 0.1, 60, 80), (0.1, 0.2, 62, 80)], []),
        (33, False, [(0.0, 0.1, 40, 80), (0.1, 0.2, 41, 80)], []),
    )
    v80 = c.velocity_offset + 80 * 32 // 128
    assert c.encode(pm).tolist() == [
        piano, v80, 60, bass, 40,
        c.time_shift_offset + 9, 128 + 40, 41, piano, 128 + 60, 62,  # the bass goes on first: one switch
        c.time_shift_offset + 9, 128 + 60 + 2, bass, 128 + 41,  # the piano, still playing, first again
    ]  # fmt: skip


def test_one_sounding_note_per_instrument_and_pitch():
    c = EventCodec(INST)
    pm = pm_with(
        (0, False, [(0.0, 1.0, 60, 80), (0.0, 0.5, 60, 80), (0.5, 1.5, 64, 80)], []),
        (40, False, [(0.0, 1.0, 60, 80), (0.3, 0.8, 64, 80)], []),
    )
    got = c.decode_instrument_notes(c.encode(pm))
    by = {
        (i, n.pitch, round(n.start, 3), round(n.end, 3))
        for n, i in zip(got.notes, got.instruments, strict=True)
    }
    # the piano's duplicate 60 keeps the longest; the violin's 60 and 64 are its own, overlapping the piano's
    assert by == {(0, 60, 0.0, 1.0), (0, 64, 0.5, 1.5), (40, 60, 0.0, 1.0), (40, 64, 0.3, 0.8)}


def test_two_tracks_of_one_program_share_an_instrument():
    """A quartet's Violin I and II (both program 40) are one instrument in the stream: their notes are merged
    (one sounding note per pitch between them) and come back on one "Violin" track."""
    c = EventCodec(INST)
    pm = pm_with(
        (40, False, [(0.0, 1.0, 76, 80), (0.0, 1.0, 67, 80)], []),
        (40, False, [(0.0, 0.5, 67, 70), (0.5, 1.0, 64, 70)], []),
    )
    read = c.instrument_notes(pm)
    assert set(read.instruments) == {40} and len(read.notes) == 3  # the two 67s struck together: the longest
    out = c.decode(c.encode(pm))
    assert [(i.name, i.program, len(i.notes)) for i in out.instruments] == [("Violin", 40, 3)]


def test_drums_kept_selected_and_on_a_drum_track():
    c = EventCodec(INST)
    read = c.instrument_notes(band())
    assert sorted(set(read.instruments)) == [0, 33, DRUMS]
    assert sum(i == DRUMS for i in read.instruments) == 2
    out = c.decode(c.encode(band()))
    assert [(i.name, i.program, i.is_drum) for i in out.instruments] == [
        ("Acoustic Grand Piano", 0, False),
        ("Electric Bass (finger)", 33, False),
        ("Drums", 0, True),
    ]
    assert [n.pitch for n in out.instruments[2].notes] == [36, 38]
    # a list of tracks keeps the drums among them
    drums_only = EventCodec(CodecConfig(instruments=True, tracks=[1])).instrument_notes(band())
    assert set(drums_only.instruments) == {DRUMS} and len(drums_only.notes) == 2
    # and what the file says about a kit's CC64 is no sustain: the kit's notes keep their lengths
    kit = pm_with((0, True, [(0.0, 0.1, 42, 90)], [(0.0, 127), (1.0, 0)]))
    assert c.instrument_notes(kit).notes[0].end == pytest.approx(0.1)


def test_bytes_and_pretty_midi_read_the_same_instruments():
    c = EventCodec(INST)
    for tracks in ("merge", [2, 1]):
        c = EventCodec(CodecConfig(instruments=True, tracks=tracks))
        assert np.array_equal(c.encode(as_bytes(band())), c.encode(band()))


def test_a_program_change_inside_a_track_gives_each_note_its_program():
    """pretty_midi (and the pre-scan that reproduces it) give a note the program in effect at its note-off:
    a track that changes program is read as two instruments."""
    mid = mido.MidiFile(ticks_per_beat=480)
    track = mido.MidiTrack()
    track += [
        mido.Message("program_change", program=0, time=0),
        mido.Message("note_on", note=60, velocity=80, time=0),
        mido.Message("note_off", note=60, velocity=0, time=480),
        mido.Message("program_change", program=40, time=0),
        mido.Message("note_on", note=67, velocity=80, time=0),
        mido.Message("note_off", note=67, velocity=0, time=480),
    ]
    mid.tracks.append(track)
    buf = io.BytesIO()
    mid.save(file=buf)
    c = EventCodec(INST)
    read = c.instrument_notes(buf.getvalue())
    assert [(n.pitch, i) for n, i in zip(read.notes, read.instruments, strict=True)] == [(60, 0), (67, 40)]
    out = c.decode(c.encode(buf.getvalue()))
    assert [(i.program, [n.pitch for n in i.notes]) for i in out.instruments] == [(0, [60]), (40, [67])]


def test_encode_notes_with_instruments_and_checks():
    c = EventCodec(INST)
    notes = [N(velocity=80, pitch=60, start=0.0, end=0.5), N(velocity=80, pitch=36, start=0.0, end=0.1)]
    got = c.decode_instrument_notes(c.encode_notes(notes, [73, DRUMS]))
    assert sorted(zip([n.pitch for n in got.notes], got.instruments, strict=True)) == [(36, DRUMS), (60, 73)]
    assert set(c.decode_instrument_notes(c.encode_notes(notes)).instruments) == {0}  # default: the piano
    for bad in ([0], [0, 129], [-1, 0]):
        with pytest.raises(ConfigError) as info:
            c.encode_notes(notes, bad)
        assert info.value.code == "bad_instruments"
    # a codec without instruments ignores them: the tokens of the notes alone
    assert np.array_equal(EventCodec().encode_notes(notes, [73, DRUMS]), EventCodec().encode_notes(notes))


# ---------------------------------------------------------------- decoding


def test_decode_anything_with_instrument_tokens():
    c = EventCodec(INST)
    violin, cello, drums = c.instrument_offset + 40, c.instrument_offset + 42, c.drums_id
    tokens = [
        60,
        violin,
        62,
        cello,
        128 + 62,
        50,
        270,
        violin,
        128 + 62,
        cello,
        128 + 50,
        drums,
        36,
        270,
        128 + 60,
    ]
    got = c.decode_instrument_notes(tokens)
    spans = sorted(
        (i, n.pitch, round(n.start, 3), round(n.end, 3))
        for n, i in zip(got.notes, got.instruments, strict=True)
    )
    # the cello's note-off of 62 closes nothing (the violin's 62 sounds on); the piano's 60, struck before any
    # INSTRUMENT, is never closed (its note-off comes under the drums: another voice) and ends at the end
    assert spans == [(0, 60, 0.0, 0.3), (40, 62, 0.0, 0.15), (42, 50, 0.0, 0.15), (DRUMS, 36, 0.15, 0.3)]
    pm = c.decode(tokens)
    assert [(i.name, i.is_drum) for i in pm.instruments] == [
        ("Acoustic Grand Piano", False),
        ("Violin", False),
        ("Cello", False),
        ("Drums", True),
    ]
    assert c.decode([]).instruments == []


def test_instrument_names():
    assert (
        instrument_name(DRUMS) == "Drums"
        and instrument_name(40) == "Violin"
        and instrument_name(0) == ("Acoustic Grand Piano")
    )


# ---------------------------------------------------------------- augmentation


def test_transpose_leaves_the_drums_alone():
    c = EventCodec(INST)
    tokens = c.encode(band())
    up = c.transpose(tokens, 2)
    a, b = c.decode_instrument_notes(tokens), c.decode_instrument_notes(up)
    assert [(n.pitch + (0 if i == DRUMS else 2), i) for n, i in zip(a.notes, a.instruments, strict=True)] == [
        (n.pitch, i) for n, i in zip(b.notes, b.instruments, strict=True)
    ]
    # a crop that starts inside the drums: told which instrument is in effect, its notes stay where they are
    crop = [36, 270, 128 + 36]
    assert c.transpose(crop, 3, instrument=DRUMS).tolist() == crop
    assert c.transpose(crop, 3).tolist() == [39, 270, 128 + 39]
    stretched = c.decode_instrument_notes(c.stretch(tokens, 2.0))
    assert stretched.instruments == a.instruments


def test_infill_markers_with_instruments():
    from musicrel.generation import fim

    c = EventCodec(CodecConfig(instruments=True, infill=True))
    tokens = c.encode(band())
    past, gap, future = fim.split_at(c, tokens, [50, 100])
    seq = fim.fim_sequence(c, past, future, 50, gap)
    assert {c.future_id, c.past_id, c.fill_id} <= set(seq.tokens.tolist())
    assert c.is_instrument(seq.tokens).sum() == c.is_instrument(tokens).sum()
    glued = np.concatenate([past, gap, future])
    assert c.decode_instrument_notes(glued).instruments == c.decode_instrument_notes(tokens).instruments


# ---------------------------------------------------------------- the shared multi-instrument corpus


def _multi() -> Path:
    path = SHARED_MIDI / "multi"
    if not (path / "manifest.csv").is_file():
        pytest.skip(
            f"the multi-instrument corpus is not at {path} (set MUSICREL_SHARED to the shared/ folder)"
        )
    return path


def _first(source: str, where=lambda row: True) -> tuple[Path, dict]:
    folder = _multi()
    with open(folder / "manifest.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["source"] == source and where(row):
                return folder / row["path"], row
    pytest.skip(f"no {source} file in {folder}")


CASES = {
    "quartet": ("openscore-quartets", lambda r: float(r["seconds"]) < 900),
    "lied": ("openscore-lieder", lambda r: len(r["programs"].split()) >= 2),
    "band with drums": ("freedoom", lambda r: r["drums"] == "1"),
    "drums only": ("groove", lambda r: True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_multi_corpus_round_trip(case):
    path, row = _first(*CASES[case])
    c = EventCodec(INST)
    read = c.instrument_notes(path)
    programs = {int(p) for p in row["programs"].split()}
    want = {DRUMS if p == -1 else p for p in programs}
    assert set(read.instruments) == want  # the manifest's programs, drums as their own instrument
    assert (DRUMS in want) == (row["drums"] == "1")
    tokens = c.encode(path)
    assert np.array_equal(tokens, c.encode(c.read(path)))
    back = c.decode_instrument_notes(tokens)
    assert len(back.notes) == len(read.notes)
    step = c.step

    def keyed(parts):
        return sorted(
            (i, n.pitch, n.start, n.end) for n, i in zip(parts.notes, parts.instruments, strict=True)
        )

    for (i, p, s, e), (j, q, s2, e2) in zip(keyed(read), keyed(back), strict=True):
        assert (i, p) == (j, q)
        assert abs(s - s2) <= step / 2 + 1e-9  # onsets on the nearest step
        assert abs(e - e2) <= step + 1e-9  # ends too (each rounded, so within a step of the length)
    pm = c.decode(tokens)
    assert {(inst.program if not inst.is_drum else DRUMS) for inst in pm.instruments} == want
    for inst in pm.instruments:
        assert inst.name == instrument_name(DRUMS if inst.is_drum else inst.program)
    assert sum(len(i.notes) for i in pm.instruments) == len(read.notes)
    # the file written and read again: the same instruments, drums on channel 10
    again = pretty_midi.PrettyMIDI(io.BytesIO(as_bytes(pm)))
    assert [(i.program, i.is_drum, len(i.notes)) for i in again.instruments] == [
        (i.program, i.is_drum, len(i.notes)) for i in pm.instruments
    ]


def test_what_one_piano_stream_would_flatten_goes_to_a_model_with_instruments():
    from musicrel.generation.controls import Controls
    from musicrel.midi.instruments import asked_instruments, is_ensemble, played, wants_instruments
    from tests.musicrel.generation.test_continuation_tracks import drums_only, quartet
    from tests.musicrel.generation.test_infill_tracks import three_tracks

    assert played(quartet()) == {40, 41, 42} and is_ensemble({40, 41, 42})
    assert is_ensemble({DRUMS}) and not is_ensemble({0}) and not is_ensemble(set())
    # POP909's three piano tracks are one instrument; a selection of one instrument of a quartet is one too
    assert not wants_instruments(three_tracks()) and wants_instruments(drums_only())
    assert played(quartet(), [2]) == {41} and not wants_instruments(quartet(), [0, 1])
    assert wants_instruments(quartet()) and not wants_instruments(quartet(), asked=False)
    # the controls: one program asks for a piano model, other instruments for a model with them
    assert asked_instruments(None) is None and asked_instruments(Controls(instruments="motif")) is None
    assert asked_instruments(Controls(program=40)) is False
    assert asked_instruments(Controls(instruments="Violin, Cello")) is True
    assert asked_instruments(Controls(instruments="any")) is True
