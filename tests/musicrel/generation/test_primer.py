"""generation.primer: the primer window at the cut, cropping, tracks, and rendering any token stream."""

from __future__ import annotations

import io

import numpy as np
import pretty_midi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musicrel.generation.primer import prepare_primer, primer_at_cut, render
from musicrel.midi.codec import CodecConfig, EventCodec, open_pitches, shift_steps
from tests.musicrel.conftest import (
    CODEC,
    STEP,
    check_grammar,
    make_motif,
    midi_bytes,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@settings(max_examples=40, deadline=None)
@given(tokens=st.lists(st.integers(-5, CODEC.vocab_size + 5), max_size=200), include=st.booleans())
def test_garbage_token_streams_render_to_valid_files(tokens, include):
    primer = prepare_primer(CODEC, make_motif(6), 2.0)
    pm = render(
        CODEC, primer, np.array(tokens, dtype=np.int64), include_primer=include, seed=1, sample_index=0
    )
    back = pretty_midi.PrettyMIDI(io.BytesIO(midi_bytes(pm)))
    for n in back.instruments[0].notes if back.instruments else []:
        assert 0 <= n.start < n.end


def test_primer_window_clips_notes_sounding_at_the_cut():
    pm = pretty_midi.PrettyMIDI()
    inst = pretty_midi.Instrument(program=0)
    inst.notes = [
        pretty_midi.Note(80, 60, 0.0, 1.0),
        pretty_midi.Note(80, 62, 1.5, 4.0),  # sounding at the cut (end - 2 s = 2.0)
        pretty_midi.Note(80, 64, 3.0, 3.5),
    ]
    pm.instruments.append(inst)
    primer = prepare_primer(CODEC, pm, primer_seconds=2.0)
    assert primer.start_time == pytest.approx(2.0) and primer.end_time == pytest.approx(4.0)
    assert [(n.pitch, n.start, n.end) for n in primer.notes] == [(62, 2.0, 4.0), (64, 3.0, 3.5)]
    decoded = CODEC.decode_notes(primer.tokens)
    assert [(n.pitch, round(n.start, 2), round(n.end, 2)) for n in decoded] == [
        (62, 0.0, 2.0),
        (64, 1.0, 1.5),
    ]


def test_primer_at_cut_leaves_sounding_notes_open_and_ends_on_its_last_event():
    notes = [
        pretty_midi.Note(80, 60, 0.0, 1.0),
        pretty_midi.Note(80, 62, 1.5, 4.0),  # sounding at the cut (3.0): stays open
        pretty_midi.Note(80, 64, 2.0, 2.5),
        pretty_midi.Note(80, 65, 3.5, 4.0),  # after the cut: not in the primer
    ]
    primer = primer_at_cut(CODEC, notes, cut=3.0, primer_seconds=30.0)
    assert primer.end_time == 3.0 and primer.tokens[0] == CODEC.bos_id
    assert np.flatnonzero(open_pitches(CODEC, primer.tokens)).tolist() == [62]
    # The tokens end on the last event (64's note-off at 2.5 s), not on a partial shift toward the cut: the
    # 0.5 s left to the cut is the tail that decoding covers (generation.join).
    assert primer.tokens[-1] == CODEC.note_off_offset + 64
    assert shift_steps(CODEC)[primer.tokens].sum() * STEP == pytest.approx(2.5)
    assert primer.tail_steps == 50
    assert CODEC.note_on_offset + 65 not in primer.tokens.tolist()
    check_grammar(primer.tokens[1:])
    # A cut 1.75 s into a silence: more than one whole shift's worth of tail, and still no trailing shift.
    primer = primer_at_cut(CODEC, notes[:1], cut=2.75, primer_seconds=30.0)
    assert primer.tokens[-1] == CODEC.note_off_offset + 60 and primer.tail_steps == 175
    assert (shift_steps(CODEC)[primer.tokens].sum() + primer.tail_steps) * STEP == pytest.approx(2.75)
    assert not open_pitches(CODEC, primer.tokens).any()
    # A cut on an event (the last note-off): no tail.
    primer = primer_at_cut(CODEC, notes[:1], cut=1.0, primer_seconds=30.0)
    assert primer.tokens[-1] == CODEC.note_off_offset + 60 and primer.tail_steps == 0


def test_a_note_the_primer_strikes_on_its_last_step_is_the_motifs_not_the_continuations():
    # 64 starts a hair before the cut (a cut at t0 + 10 s in floating point does this): it rounds to the cut's
    # step, the model reads it, and the truth (notes from the cut on) does not hold it.
    notes = [pretty_midi.Note(80, 60, 0.0, 0.5), pretty_midi.Note(80, 64, 3.0 - 1e-9, 3.5)]
    primer = primer_at_cut(CODEC, notes, cut=3.0)
    assert primer.tail_steps == 0 and primer.tokens[-1] == CODEC.note_on_offset + 64
    on, shift = CODEC.note_on_offset, CODEC.time_shift_offset
    pm = render(CODEC, primer, np.array([shift + 9, on + 67, shift + 9]))
    assert [(n.pitch, round(n.start, 2)) for n in pm.instruments[0].notes] == [(67, 0.1)]
    # struck again by the continuation on that very step, it is the continuation's, from 0
    pm = render(CODEC, primer, np.array([on + 64, shift + 9]))
    notes = pm.instruments[0].notes
    assert [(n.pitch, round(n.start, 2), round(n.end, 2)) for n in notes] == [(64, 0.0, 0.1)]


def test_long_primer_is_cropped_at_an_event_boundary():
    motif = make_motif(200, drums=False)
    full = prepare_primer(CODEC, motif, 1000.0)
    cropped = prepare_primer(CODEC, motif, 1000.0, max_tokens=40)
    assert len(full.tokens) > 40 >= len(cropped.tokens) > 20
    assert cropped.start_time > full.start_time and cropped.end_time == full.end_time
    check_grammar(cropped.tokens)  # re-encoded: it opens every note it closes
    assert not open_pitches(CODEC, cropped.tokens).any()


def test_render_keeps_the_pedal_of_an_events_codec_and_releases_it():

    codec = EventCodec(CodecConfig(pedal="events"))
    primer = prepare_primer(codec, make_motif(4), 2.0)
    shift = codec.time_shift_offset
    tokens = [
        codec.pedal_on_id,
        codec.note_on_offset + 60,
        shift + 49,
        codec.note_off_offset + 60,
        shift + 49,
    ]
    pm = render(codec, primer, tokens)
    cc = [(c.number, c.value, round(c.time, 3)) for c in pm.instruments[0].control_changes]
    assert cc == [(64, 127, 0.0), (64, 0, 1.0)]
    assert [(n.pitch, n.start, n.end) for n in pm.instruments[0].notes] == [(60, 0.0, 0.5)]


def test_tracks_select_notes_and_program():
    pm = make_motif(8, program=24)  # [drums, program 24]
    other = pretty_midi.Instrument(program=56)
    other.notes = [pretty_midi.Note(100, 40, 0.0, 3.0)]
    pm.instruments.append(other)
    merged = prepare_primer(CODEC, pm, 30.0)
    only = prepare_primer(CODEC, pm, 30.0, tracks=[2])
    assert merged.program == 24 and only.program == 56
    assert {n.pitch for n in only.notes} == {40} and 40 in {n.pitch for n in merged.notes}


def _band(parts: list[tuple[int, int]], drums: int = 0) -> pretty_midi.PrettyMIDI:
    """One track per (program, notes), each a run of 0.25 s notes from time 0; `drums` drum hits first."""
    pm = pretty_midi.PrettyMIDI()
    kit = pretty_midi.Instrument(program=0, is_drum=True)
    kit.notes = [pretty_midi.Note(90, 36, 0.1 * i, 0.1 * i + 0.05) for i in range(drums)]
    pm.instruments.append(kit)
    for k, (program, count) in enumerate(parts):
        inst = pretty_midi.Instrument(program=program)
        inst.notes = [pretty_midi.Note(80, 50 + 7 * k, 0.25 * i, 0.25 * i + 0.2) for i in range(count)]
        pm.instruments.append(inst)
    return pm


@pytest.mark.parametrize(
    ("parts", "tracks", "program", "reason"),
    [
        (
            [(52, 3), (0, 40)],
            "merge",
            0,
            "Acoustic Grand Piano plays 93% of the motif's notes",
        ),  # choir + piano
        (
            [(122, 2), (33, 10), (25, 12), (48, 12)],
            "merge",
            0,
            "no instrument plays more than half",
        ),  # a band
        ([(122, 2), (33, 10), (25, 12)], [3], 25, "plays every note"),  # one track chosen
        ([(40, 12)], "merge", 40, "Violin plays every note"),
    ],
)
def test_the_motifs_instrument_is_the_one_that_plays_most_of_its_notes(parts, tracks, program, reason):
    """Issue 23: the first track's program made a merged pop song "FX 1 (rain)" and a piano piece with a
    vocal line "Choir Aahs". Drums (100 hits here) count for nothing."""
    primer = prepare_primer(CODEC, _band(parts, drums=100), 30.0, tracks=tracks)
    assert primer.program == program
    assert reason in primer.program_reason, primer.program_reason


def test_the_instrument_is_counted_in_the_window_read():
    pm = _band([(40, 40)])
    late = pretty_midi.Instrument(program=73)  # a flute that plays only in the last 2 s
    late.notes = [pretty_midi.Note(80, 80, 8.0 + 0.1 * i, 8.05 + 0.1 * i) for i in range(20)]
    pm.instruments.append(late)
    assert prepare_primer(CODEC, pm, 30.0).program == 40  # 40 violin notes against 20 flute notes
    assert prepare_primer(CODEC, pm, 1.5).program == 73  # the window holds the flute alone


def test_real_merged_songs_are_read_as_their_main_instrument_or_piano(real_midi_files, read_real_midi):
    """Every real file gets a program that plays more than half the window's notes, or piano."""
    for path in real_midi_files:
        pm = read_real_midi(path)
        primer = prepare_primer(CODEC, pm, 30.0)
        window = [
            inst.program
            for inst in pm.instruments
            if not inst.is_drum
            for n in inst.notes
            if primer.start_time <= n.start < primer.end_time
        ]
        share = window.count(primer.program) / len(window)
        assert share > 0.5 or (primer.program == 0 and "piano" in primer.program_reason), path.name


def test_a_piano_codec_says_what_it_flattened():
    """A codec without instruments merges a band's instruments and drops its drums: the program's reason says
    so (the answers' `program_reason`, the command's summary); one instrument on many tracks is no band."""
    from tests.musicrel.generation.test_continuation_tracks import band, quartet
    from tests.musicrel.generation.test_infill_tracks import three_tracks

    assert prepare_primer(CODEC, quartet()).program_reason.endswith(
        "; 3 instruments merged into one stream (a model with instruments keeps them)"
    )
    assert (
        "2 instruments merged into one stream and drums dropped"
        in prepare_primer(CODEC, band()).program_reason
    )
    assert (
        prepare_primer(CODEC, three_tracks()).program_reason
        == "Acoustic Grand Piano plays every note of the motif"
    )
    # the tracks read decide: one violin of the quartet is one instrument
    assert "merged" not in prepare_primer(CODEC, quartet(), tracks=[0]).program_reason


def test_motif_end_cuts_the_motif_there():
    """Issue 23: a whole piece was continued after its final cadence; the user says where the motif ends."""
    pm = make_motif(16, drums=False)  # notes every 0.25 s, each 0.35 s long: 0.0 .. 4.1 s
    whole = prepare_primer(CODEC, pm, 30.0)
    cut = prepare_primer(CODEC, pm, 30.0, motif_end=2.1)
    assert whole.end_time == pytest.approx(4.1) and cut.end_time == pytest.approx(2.1)
    assert max(n.start for n in cut.notes) < 2.1 and len(cut.notes) == 9  # onsets 0.0 .. 2.0
    assert max(n.end for n in cut.motif_notes) == pytest.approx(2.1)  # the note sounding at 2.1 stays open
    assert len(cut.tokens) < len(whole.tokens)
    short = prepare_primer(CODEC, pm, 1.0, motif_end=2.1)
    assert short.start_time == pytest.approx(1.1) and short.requested_seconds == 1.0 and not short.cropped
    beyond = prepare_primer(CODEC, pm, 30.0, motif_end=100.0)  # later than the last note: the last note
    assert beyond.end_time == whole.end_time and np.array_equal(beyond.tokens, whole.tokens)


@pytest.mark.parametrize("motif_end", [0.0, -1.0, float("nan"), float("inf"), True, "3"])
def test_a_bad_motif_end_has_its_code(motif_end):
    from musicrel.errors import GenerationError

    with pytest.raises(GenerationError) as err:
        prepare_primer(CODEC, make_motif(8), 30.0, motif_end=motif_end)
    assert err.value.code == "invalid_params"


def test_a_motif_end_before_every_note_is_no_notes():
    from musicrel.errors import GenerationError

    with pytest.raises(GenerationError, match="first starts at 5.00 s") as err:
        prepare_primer(CODEC, make_motif(8, offset=5.0, drums=False), 30.0, motif_end=4.0)
    assert err.value.code == "no_notes"


def test_a_window_shortened_by_the_token_cap_says_so(real_midi_files, read_real_midi):
    """A dense song's "30 s" was 5 s of it, silently: the primer says it was cropped, and how much it read."""
    cropped = []
    for path in real_midi_files:
        primer = prepare_primer(CODEC, read_real_midi(path), 30.0, max_tokens=384)
        assert primer.requested_seconds == 30.0
        asked_start = max(min(n.start for n in primer.motif_notes), primer.end_time - 30.0)
        assert primer.cropped == (primer.start_time > asked_start + 1e-9 or len(primer.tokens) == 384)
        if primer.cropped:
            cropped.append(primer.end_time - primer.start_time)
    assert cropped and all(seconds < 30.0 for seconds in cropped)
    assert not prepare_primer(CODEC, real_midi_files[0], 30.0).cropped  # no cap, no crop


def test_the_tempo_is_the_one_the_primer_window_is_at():
    """A score that changes tempo (60 bpm for 10 s, 150 for 2 s, then 90): the continuation's file and its
    chords in beats take the tempo of what the model read, not the file's first."""
    from musicrel.generation.controls import Controls
    from tests.musicrel.midi.test_files import tempo_map_file

    data = tempo_map_file(notes_every=0.5)
    late = prepare_primer(CODEC, data, 1.0, motif_end=11.5)  # the window 10.5-11.5 s: all at 150
    assert late.tempo == pytest.approx(150.0)
    assert prepare_primer(CODEC, data, 30.0, motif_end=11.5).tempo == pytest.approx(60.0)  # 10 s of 11.5
    assert prepare_primer(CODEC, data, 10.0, motif_end=29.0).tempo == pytest.approx(90.0)
    pm = render(CODEC, late, [])
    assert pm.get_tempo_changes()[1][0] == pytest.approx(150.0, abs=0.01)
    chords = Controls(chords="C:4b").resolve(late, CODEC.config.step_ms).applied["chords"]
    assert chords[0]["seconds"] == pytest.approx(4 * 60 / 150)


def test_a_file_that_includes_the_motif_has_the_uploads_bars_up_to_the_cut():
    """The motif at its own times, on the upload's tempo map and signatures; the continuation at its tempo."""
    from tests.musicrel.midi.test_files import tempo_map_file

    data = tempo_map_file(notes_every=0.5)
    upload = pretty_midi.PrettyMIDI(io.BytesIO(data))
    primer = prepare_primer(CODEC, data, 30.0, motif_end=11.5)  # the window is mostly at 60 bpm
    new = np.array([CODEC.time_shift_offset + 49, CODEC.note_on_offset + 67, CODEC.time_shift_offset + 49])
    pm = pretty_midi.PrettyMIDI(io.BytesIO(midi_bytes(render(CODEC, primer, new, include_primer=True))))
    times, bpms = pm.get_tempo_changes()
    assert [(round(t, 2), round(b, 2)) for t, b in zip(times, bpms, strict=True)] == [
        (0, 60), (10, 150), (11.5, 60)
    ]  # fmt: skip
    assert [(c.numerator, c.denominator) for c in pm.time_signature_changes] == [(3, 4)]
    ours, theirs = pm.get_downbeats(), upload.get_downbeats()
    assert ours[ours < 11.5] == pytest.approx(theirs[theirs < 11.5], abs=1e-3)
    motif = sorted(round(n.start, 3) for n in pm.instruments[0].notes if n.start < 11.5)
    assert motif == sorted(round(n.start, 3) for i in upload.instruments for n in i.notes if n.start < 11.5)
    alone = pretty_midi.PrettyMIDI(io.BytesIO(midi_bytes(render(CODEC, primer, new))))
    assert len(alone.get_tempo_changes()[1]) == 1  # the continuation alone: one tempo (pretty_midi's 4/4)
