"""EventCodec: vocabulary, config round trip, encoding rules, pedal, tracks, decode of garbage, augmentation,
and round trips of the shared real files."""

from __future__ import annotations

import io

import numpy as np
import pretty_midi
import pytest

from musicrel.bench.codec import fidelity
from musicrel.errors import ConfigError, InvalidMidiError
from musicrel.midi.codec import CodecConfig, EventCodec

N = pretty_midi.Note


def notes_of(*spec):
    return [N(velocity=v, pitch=p, start=s, end=e) for s, e, p, v in spec]


def pm_with(*instruments):
    """instruments: (program, is_drum, notes, [(time, cc64 value), ...])"""
    pm = pretty_midi.PrettyMIDI()
    for program, is_drum, notes, pedal in instruments:
        inst = pretty_midi.Instrument(program=program, is_drum=is_drum)
        inst.notes = list(notes)
        inst.control_changes = [pretty_midi.ControlChange(64, v, t) for t, v in pedal]
        pm.instruments.append(inst)
    return pm


def spans(notes):
    return [(round(n.start, 6), round(n.end, 6), n.pitch) for n in notes]


# ---------------------------------------------------------------- vocabulary and config


def test_vocabulary_layout():
    c = EventCodec()
    assert c.vocab_size == 391 and c.num_events == 388
    assert (c.note_on_offset, c.note_off_offset, c.time_shift_offset, c.velocity_offset) == (0, 128, 256, 356)
    assert (c.pad_id, c.bos_id, c.eos_id) == (388, 389, 390)
    assert c.time_advance.shape == (391,)
    assert c.time_advance[256] == pytest.approx(0.01) and c.time_advance[355] == pytest.approx(1.0)
    assert c.time_advance[:256].sum() == 0 and c.time_advance[356:].sum() == 0
    e = EventCodec(CodecConfig(pedal="events"))
    assert e.vocab_size == 393
    assert (e.pedal_on_id, e.pedal_off_id, e.pad_id, e.eos_id) == (388, 389, 390, 392)


def test_config_json_roundtrip():
    for cfg in (CodecConfig(), CodecConfig(step_ms=8, pedal="events", tracks=[0, 3], max_seconds=120)):
        assert CodecConfig.from_json(cfg.to_json()) == cfg
        assert CodecConfig.from_dict(cfg.to_dict()) == cfg
        assert CodecConfig.from_json(cfg.to_json()).to_json() == cfg.to_json()
    assert CodecConfig(tracks=(2, 1)).to_dict()["tracks"] == [2, 1]
    assert EventCodec(CodecConfig.from_json(CodecConfig(pedal="events").to_json())).vocab_size == 393


@pytest.mark.parametrize(
    "field,value",
    [
        ("step_ms", 0),
        ("max_shift_steps", 0),
        ("velocity_bins", 129),
        ("velocity_bins", 2.5),
        ("pedal", "ignore"),
        ("tracks", "all"),
        ("tracks", [-1]),
        ("tracks", []),
        ("max_bytes", 0),
        ("max_tracks", True),
        ("max_events", -5),
        ("max_ticks", "many"),
        ("max_seconds", 0),
        ("max_seconds", float("inf")),
    ],
)
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        CodecConfig(**{field: value})


def test_config_from_dict_rejects_unknown_and_malformed():
    with pytest.raises(ConfigError, match="bogus"):
        CodecConfig.from_dict({"bogus": 1})
    with pytest.raises(ConfigError):
        CodecConfig.from_json("{not json")
    with pytest.raises(ConfigError):
        CodecConfig.from_dict([1, 2])


# ---------------------------------------------------------------- encoding rules


def test_encode_known_sequence():
    c = EventCodec()
    tokens = c.encode_notes(notes_of((0.0, 0.5, 60, 100), (0.5, 1.0, 62, 100), (1.0, 3.5, 64, 20)))
    vel100, vel20 = 356 + 100 * 32 // 128, 356 + 20 * 32 // 128
    shift = lambda k: 256 + k - 1  # noqa: E731
    assert tokens.dtype == np.int32
    assert tokens.tolist() == [
        vel100, 60, shift(50),
        128 + 60, 62, shift(50),  # off before on at the same step; velocity unchanged -> no token
        128 + 62, vel20, 64, shift(100), shift(100), shift(50),  # 2.5 s gap = 100 + 100 + 50 steps
        128 + 64,
    ]  # fmt: skip


def test_rounding_not_truncation_no_drift():
    c = EventCodec()
    # 20 minutes of notes on an awkward grid: every onset within half a step, no accumulated drift
    starts = np.arange(1, 9000) * 0.13337
    notes = [N(velocity=80, pitch=60 + i % 24, start=s, end=s + 0.0996) for i, s in enumerate(starts)]
    decoded = c.decode_notes(c.encode_notes(notes))
    assert len(decoded) == len(notes)
    got = np.array([n.start for n in decoded])
    assert np.abs(got - starts).max() <= 0.005 + 1e-9
    assert decoded[-1].start == pytest.approx(round(starts[-1] * 100) / 100)
    # 0.0149 rounds to 1 step, 0.015 up to 2 (truncation would give 1 and 1)
    t = c.encode_notes(notes_of((0.0149, 0.03, 60, 80), (0.0151, 0.03, 61, 80)))
    assert t.tolist() == [256, 356 + 20, 60, 256, 61, 256, 128 + 60, 128 + 61]


def test_restruck_overlapping_and_zero_length_notes():
    c = EventCodec()
    decoded = c.decode_notes(
        c.encode_notes(
            notes_of((0.0, 1.0, 60, 80), (0.5, 1.5, 60, 80), (2.0, 2.0, 62, 80), (3.0, 3.001, 64, 80))
        )
    )
    assert spans(decoded) == [(0.0, 0.5, 60), (0.5, 1.5, 60), (2.0, 2.01, 62), (3.0, 3.01, 64)]


def test_same_step_duplicates_keep_longest():
    c = EventCodec()
    decoded = c.decode_notes(c.encode_notes(notes_of((1.0, 1.2, 60, 80), (1.002, 2.0, 60, 40))))
    assert spans(decoded) == [(1.0, 2.0, 60)]


def test_notes_starting_after_zero_keep_absolute_time():
    c = EventCodec()
    tokens = c.encode_notes(notes_of((2.0, 2.5, 60, 80)))
    assert tokens[:2].tolist() == [355, 355]
    assert spans(c.decode_notes(tokens)) == [(2.0, 2.5, 60)]


def test_velocity_token_only_on_bin_change():
    c = EventCodec()
    tokens = c.encode_notes(
        notes_of((0, 0.1, 60, 80), (0.1, 0.2, 61, 81), (0.2, 0.3, 62, 100), (0.3, 0.4, 63, 100))
    )
    vel_tokens = [t for t in tokens.tolist() if 356 <= t < 388]
    assert vel_tokens == [356 + 20, 356 + 25]  # 80 and 81 share bin 20


# ---------------------------------------------------------------- pedal


def test_pedal_extend_holds_notes_until_release():
    pm = pm_with(
        (
            0,
            False,
            notes_of((0.2, 0.3, 60, 80), (0.4, 0.5, 62, 80), (1.5, 1.6, 64, 80)),
            [(0.1, 127), (1.0, 0)],
        )
    )
    assert spans(EventCodec().to_notes(pm)) == [(0.2, 1.0, 60), (0.4, 1.0, 62), (1.5, 1.6, 64)]


def test_pedal_extend_restrike_and_release_at_same_time():
    pm = pm_with(
        (
            0,
            False,
            notes_of((0.2, 0.3, 60, 80), (0.6, 0.7, 60, 80), (0.8, 1.0, 62, 80)),
            [(0.1, 100), (1.0, 10)],
        )
    )
    # re-struck 60 closes the held one; 62 released exactly when the pedal lifts is not held
    assert spans(EventCodec().to_notes(pm)) == [(0.2, 0.6, 60), (0.6, 1.0, 60), (0.8, 1.0, 62)]


def test_pedal_never_released_holds_to_last_event():
    pm = pm_with((0, False, notes_of((0.2, 0.3, 60, 80), (0.5, 2.0, 62, 80)), [(0.1, 127)]))
    assert spans(EventCodec().to_notes(pm)) == [(0.2, 2.0, 60), (0.5, 2.0, 62)]


def test_pedal_events_tokens_and_decode_to_cc64():
    c = EventCodec(CodecConfig(pedal="events"))
    pm = pm_with((0, False, notes_of((0.2, 0.3, 60, 80)), [(0.1, 127), (0.15, 127), (1.0, 0)]))
    assert spans(c.to_notes(pm)) == [(0.2, 0.3, 60)]  # notes keep their own length
    tokens = c.encode(pm).tolist()
    assert tokens.count(c.pedal_on_id) == 1 and tokens.count(c.pedal_off_id) == 1
    assert (
        tokens.index(c.pedal_on_id) < tokens.index(60) < tokens.index(128 + 60) < tokens.index(c.pedal_off_id)
    )
    out = c.decode(tokens)
    ccs = [(round(cc.time, 6), cc.value) for cc in out.instruments[0].control_changes if cc.number == 64]
    assert ccs == [(0.1, 127), (1.0, 0)]
    assert spans(c.decode_notes(tokens)) == [(0.2, 0.3, 60)]


def test_pedal_events_merge_instruments():
    c = EventCodec(CodecConfig(pedal="events"))
    pm = pm_with(
        (0, False, notes_of((0.0, 0.1, 60, 80)), [(0.1, 127), (0.5, 0)]),
        (1, False, notes_of((0.0, 0.1, 62, 80)), [(0.3, 127), (0.8, 0)]),
    )
    _, pedal = c._decode(c.encode(pm))
    assert [(round(t, 6), d) for t, d in pedal] == [(0.1, True), (0.8, False)]  # down while either holds it


# ---------------------------------------------------------------- tracks and drums


def three_tracks():
    return pm_with(
        (0, False, notes_of((0.0, 1.0, 60, 80)), []),
        (0, True, notes_of((0.0, 0.1, 36, 100), (0.5, 0.6, 38, 100)), []),
        (33, False, notes_of((0.5, 1.0, 40, 90)), []),
    )


def test_tracks_merge_drops_drums():
    assert spans(EventCodec().to_notes(three_tracks())) == [(0.0, 1.0, 60), (0.5, 1.0, 40)]


def test_tracks_selection():
    assert spans(EventCodec(CodecConfig(tracks=[2])).to_notes(three_tracks())) == [(0.5, 1.0, 40)]
    with pytest.raises(InvalidMidiError) as info:
        EventCodec(CodecConfig(tracks=[1])).encode(three_tracks())  # only the drum kit
    assert info.value.code == "no_notes"
    with pytest.raises(InvalidMidiError) as info:
        EventCodec(CodecConfig(tracks=[0, 5])).encode(three_tracks())
    assert info.value.code == "no_such_track"


def test_tracks_selection_same_on_bytes_and_pretty_midi():
    buf = io.BytesIO()
    three_tracks().write(buf)
    data = buf.getvalue()
    for tracks in ("merge", [0], [2, 0]):
        c = EventCodec(CodecConfig(tracks=tracks))
        assert np.array_equal(c.encode(data), c.encode(c.read(data)))


# ---------------------------------------------------------------- decode of anything


def test_decode_garbage():
    c = EventCodec()
    garbage = [128 + 70, 356 + 10, 60, 999, -3, c.pad_id, c.bos_id, 300, 128 + 60, 61, 61, 260, 62, 356 + 31]
    pm = c.decode(garbage)
    assert len(pm.instruments) == 1 and pm.instruments[0].program == 0 and not pm.instruments[0].is_drum
    notes = spans(pm.instruments[0].notes)
    # 60: on at 0, off after 45 steps; 61 struck twice on one step -> one note, closed at the end (min 0.1 s);
    # 62 left open at the end; the dangling note-off 70 and trailing velocity are ignored
    assert notes == [(0.0, 0.45, 60), (0.45, 0.55, 61), (0.5, 0.6, 62)]
    buf = io.BytesIO()
    pm.write(buf)
    buf.seek(0)
    assert len(pretty_midi.PrettyMIDI(buf).instruments[0].notes) == 3


def test_decode_restrike_closes_previous_and_zero_length_gets_a_step():
    c = EventCodec()
    assert spans(c.decode_notes([60, 260, 60, 260, 128 + 60])) == [(0.0, 0.05, 60), (0.05, 0.1, 60)]
    # off on the same step as its on -> one step; an immediate re-strike trims it rather than overlapping
    assert spans(c.decode_notes([60, 128 + 60, 260, 62, 128 + 62, 62, 259, 128 + 62])) == [
        (0.0, 0.01, 60),
        (0.05, 0.09, 62),
    ]


def test_decode_empty_and_velocity_only():
    c = EventCodec()
    assert c.decode([]).instruments[0].notes == []
    assert c.decode_notes(np.array([356, 357, 300])) == []


# ---------------------------------------------------------------- augmentation


def test_transpose():
    c = EventCodec()
    tokens = c.encode_notes(notes_of((0, 0.5, 60, 80), (0.5, 1.0, 126, 80)))
    up = c.transpose(tokens, 3)
    assert spans(c.decode_notes(up)) == [(0.0, 0.5, 63)]  # 126 + 3 leaves the range: on and off dropped
    assert np.array_equal(c.transpose(c.transpose(tokens, -5), 5), tokens)


def test_stretch():
    c = EventCodec()
    tokens = c.encode_notes(notes_of((0.1, 0.5, 60, 80), (0.7, 1.6, 62, 80)))
    assert np.array_equal(c.stretch(tokens, 1.0), tokens)
    assert spans(c.decode_notes(c.stretch(tokens, 2.0))) == [(0.2, 1.0, 60), (1.4, 3.2, 62)]
    assert spans(c.decode_notes(c.stretch(tokens, 0.5))) == [(0.05, 0.25, 60), (0.35, 0.8, 62)]
    assert c.time_advance[c.stretch(np.append(tokens, 300), 2.0)].sum() == pytest.approx(3.2 + 0.9)
    with pytest.raises(ConfigError):
        c.stretch(tokens, 0)


# ---------------------------------------------------------------- shared real files


@pytest.fixture(scope="module")
def real_parsed(real_midi_files):
    codec = EventCodec()
    return [(path, codec.read(path)) for path in real_midi_files]


def test_real_files_round_trip(real_parsed):
    codec = EventCodec()
    report, failures = [], []
    for path, pm in real_parsed:
        r = fidelity(codec, path, pm)
        report.append(
            f"{r['file']}: {r['instruments']} instr, {r['notes']} notes, kept {100 * r['kept']:.2f}%, "
            f"onset<= {r['max_onset_ms']:.2f} ms"
        )
        assert r["same_as_pretty_midi"], f"{path.name}: fast path differs from pretty_midi"
        assert r["tokens"] > 0
        if r["instruments"] == 1 and r["kept"] < 0.99:
            failures.append(r["file"])
        assert r["max_onset_ms"] <= 5.0 + 1e-6
    assert not failures, "\n".join(report)
    singles = [line for line in report if " 1 instr" in line]
    assert len(singles) >= 3, "\n".join(report)


def test_real_multitrack_drums_dropped(real_parsed):
    codec = EventCodec()
    checked = 0
    for path, pm in real_parsed:
        drums = [i for i in pm.instruments if i.is_drum]
        if not drums:
            continue
        checked += 1
        no_drums = pretty_midi.PrettyMIDI()
        no_drums.instruments = [i for i in pm.instruments if not i.is_drum]
        assert np.array_equal(codec.encode(path), codec.encode(no_drums)), path.name
        only_drums = pretty_midi.PrettyMIDI()
        only_drums.instruments = drums
        with pytest.raises(InvalidMidiError):
            codec.encode(only_drums)
    assert checked >= 3


def test_real_files_pedal_events(real_midi_files):
    codec = EventCodec(CodecConfig(pedal="events"))
    maestro = [p for p in real_midi_files if p.name.startswith("Maestro")][:1]
    for path in maestro:
        tokens = codec.encode(path)
        assert (tokens == codec.pedal_on_id).sum() > 10
        assert np.array_equal(tokens, codec.encode(codec.read(path)))
        r = fidelity(codec, path)
        assert r["kept"] >= 0.99, r


def test_a_codec_saved_before_the_melody_fields_reads_as_the_same_codec():
    """Prepared folders and checkpoints written before `melody`/`melody_lead_ms` existed name the same codec:
    evaluate, finetune and the n-gram compare codecs as CodecConfig, not as dicts."""
    old = {k: v for k, v in CodecConfig().to_dict().items() if k not in ("melody", "melody_lead_ms")}
    assert old != CodecConfig().to_dict() and CodecConfig.from_dict(old) == CodecConfig()


def test_id_map_spells_a_prepared_folder_s_ids_in_a_codec_that_adds_markers():
    from musicrel.midi.codec import id_map

    band, both = (
        EventCodec(CodecConfig(instruments=True)),
        EventCodec(CodecConfig(instruments=True, infill=True)),
    )
    table = id_map(band, both)
    assert table.shape == (band.vocab_size,)
    assert np.array_equal(table[: band.pad_id + 3], np.arange(band.pad_id + 3))  # events and specials stay
    assert table[band.instrument_offset] == both.instrument_offset and table[band.drums_id] == both.drums_id
    assert id_map(EventCodec(), EventCodec(CodecConfig(infill=True))) is None  # the piano's ids all stay
    assert id_map(band, band) is None
    assert id_map(EventCodec(), band) is None  # instruments added: appended after every piano id
    with pytest.raises(ValueError):
        id_map(band, EventCodec())  # instruments cannot be taken away
