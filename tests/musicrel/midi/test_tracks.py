"""musicrel.midi.tracks: the upload's tracks (names, programs, drums), each note's track by instrument and by
nearest voice (each track's median pitch near the music written) where one instrument has several tracks,
new tracks for new instruments, the file written back with its tracks."""

from __future__ import annotations

import io

import pretty_midi

from musicrel.midi.codec import CodecConfig, EventCodec
from musicrel.midi.instruments import DRUMS
from musicrel.midi.tracks import Track, Tracks, doublings, nearest, read_tracks, voices

N = pretty_midi.Note
CODEC = EventCodec(CodecConfig(instruments=True))


def track(name, program, notes, is_drum=False):
    inst = pretty_midi.Instrument(program=program, is_drum=is_drum, name=name)
    inst.notes = [N(velocity=80, pitch=p, start=s, end=e) for s, e, p in notes]
    return inst


def quartet() -> pretty_midi.PrettyMIDI:
    """Violin I high, Violin II lower (both program 40), a cello."""
    pm = pretty_midi.PrettyMIDI()
    pm.instruments = [
        track("Violin I", 40, [(0.0, 0.5, 76), (0.5, 1.0, 79), (1.0, 2.0, 74)]),
        track("Violin II", 40, [(0.0, 0.5, 67), (0.5, 1.0, 64), (1.0, 2.0, 65)]),
        track("Cello", 42, [(0.0, 2.0, 43)]),
    ]
    return pm


def read(pm, selection="merge", cut=None):
    codec = CODEC if selection == "merge" else EventCodec(CodecConfig(instruments=True, tracks=selection))
    notes = codec.instrument_notes(pm)
    cut = max(n.end for n in notes.notes) if cut is None else cut
    keep = [i for i, n in enumerate(notes.notes) if n.start < cut]
    return read_tracks(
        pm, selection, [notes.notes[i] for i in keep], [notes.instruments[i] for i in keep], cut
    ), [notes.notes[i] for i in keep]


def test_tracks_keep_names_programs_and_drums():
    pm = quartet()
    pm.instruments.append(track("Kit", 25, [(0.0, 0.1, 36)], is_drum=True))
    (tracks, _), _ = read(pm)
    assert tracks.describe() == [
        {"index": 0, "name": "Violin I", "program": 40, "drum": False, "source": 0},
        {"index": 1, "name": "Violin II", "program": 40, "drum": False, "source": 1},
        {"index": 2, "name": "Cello", "program": 42, "drum": False, "source": 2},
        {"index": 3, "name": "Kit", "program": 25, "drum": True, "source": 3},
    ]
    assert [t.instrument for t in tracks.tracks] == [40, 40, 42, DRUMS]


def test_motif_notes_go_back_to_their_own_tracks():
    (tracks, places), notes = read(quartet())
    by_track = {k: sorted(n.pitch for n, p in zip(notes, places, strict=True) if p == (k,)) for k in range(3)}
    assert by_track == {0: [74, 76, 79], 1: [64, 65, 67], 2: [43]}


def test_selection_keeps_upload_indices_as_sources():
    (tracks, places), notes = read(quartet(), selection=[1, 2])
    assert [t.source for t in tracks.tracks] == [1, 2]
    assert sorted(n.pitch for n, p in zip(notes, places, strict=True) if p == (0,)) == [64, 65, 67]


def test_nearest_voice_is_each_tracks_median_pitch_before_the_cut():
    (tracks, _), _ = read(quartet(), cut=2.0)  # medians: Violin I 76 (74 76 79), Violin II 65 (64 65 67)
    assert tracks.voices == {0: 76.0, 1: 65.0, 2: 43.0}
    placer = tracks.placer()
    notes = [(40, 72), (40, 66), (40, 70), (40, 71), (42, 40)]
    places = [placer.place(i, p) for i, p in notes]
    assert places == [0, 1, 1, 0, 2]  # |70 - 76| = 6 > |70 - 65| = 5, but |71 - 76| = 5 < |71 - 65| = 6
    # the voices do not move with the notes placed: any order gives the same places
    again = tracks.placer()
    assert [again.place(i, p) for i, p in reversed(notes)] == places[::-1]


def test_a_voice_reads_the_notes_near_the_music_written():
    """A continuation reads the VOICE_WINDOW_SECONDS before the cut (all its notes before the cut when none
    are that near); an infill the window either side of the gap and the gap's own notes."""
    pm = pretty_midi.PrettyMIDI()
    pm.instruments = [
        track("A", 0, [(0.0, 1.0, 90), (15.0, 16.0, 50), (22.0, 23.0, 52), (40.0, 41.0, 100)]),
        track("B", 0, [(0.0, 1.0, 70), (30.0, 31.0, 60)]),
    ]
    assert voices(pm, [0, 1], 20.0) == {0: 50.0, 1: 70.0}  # A: only 15 s is within 10 s; B: none, so all
    assert voices(pm, [0, 1], 20.0, 25.0) == {0: 51.0, 1: 60.0}  # the gap's 52 and B's 30 s note count
    assert voices(pm, [0, 1], 0.0) == {}  # nothing before the cut: no voice
    (tracks, _), _ = read(pm, cut=20.0)
    assert tracks.placer().place(0, 62) == 1  # |62 - 70| < |62 - 50|


def test_nearest_voice_ties_go_to_the_earlier_track():
    pm = pretty_midi.PrettyMIDI()
    pm.instruments = [track("A", 0, [(0.0, 1.0, 70)]), track("B", 0, [(0.0, 1.0, 60)])]
    (tracks, _), _ = read(pm)
    assert tracks.placer().place(0, 65) == 0
    assert nearest({0: 70.0, 1: 60.0}, [1, 0], 65) == 1  # the earlier of the candidates as given


def test_a_track_silent_so_far_is_chosen_only_when_all_are():
    pm = pretty_midi.PrettyMIDI()
    pm.instruments = [track("A", 0, [(5.0, 6.0, 40)]), track("B", 0, [(0.0, 1.0, 90)])]
    (tracks, _), _ = read(pm, cut=2.0)
    assert tracks.placer().place(0, 30) == 1  # A struck nothing before the cut
    empty = Tracks([Track("A", 0, False, 0, 0), Track("B", 0, False, 0, 1)])
    assert empty.placer().place(0, 30) == 0


def test_new_instruments_get_new_tracks_in_the_order_they_sound():
    (tracks, _), _ = read(quartet())
    placer = tracks.placer()
    assert placer.place(DRUMS, 36) == 3
    assert placer.place(33, 40) == 4
    assert placer.place(DRUMS, 38) == 3
    assert [(t.name, t.program, t.is_drum, t.source) for t in placer.tracks[3:]] == [
        ("Drums", 0, True, None),
        ("Electric Bass (finger)", 33, False, None),
    ]
    assert len(tracks) == 3  # the upload's Tracks are not changed by a placement


def test_only_the_tracks_given_take_notes_and_none_is_added():
    """An infill's placer: the chosen tracks only; an instrument none of them plays is placed nowhere."""
    (tracks, _), _ = read(quartet())
    placer = tracks.placer(only={1, 2})
    assert placer.place(40, 90) == 1  # Violin I's voice is nearer, but it is not chosen
    assert placer.place(42, 40) == 2
    assert placer.place(41, 55) is None and placer.place(DRUMS, 36) is None
    assert len(placer.tracks) == 3


def line(pitches, start=0.0, step=0.5):
    return [(start + step * k, start + step * k + 0.4, p) for k, p in enumerate(pitches)]


def flutes(second=None) -> pretty_midi.PrettyMIDI:
    """Flute I and Flute II (both program 73) and an oboe on Flute I's line; Flute II in unison with Flute I
    unless given its own line."""
    melody = [72, 74, 76, 77, 79, 77, 76, 74]
    pm = pretty_midi.PrettyMIDI()
    pm.instruments = [
        track("Flute I", 73, line(melody)),
        track("Flute II", 73, line(second if second is not None else melody)),
        track("Oboe", 68, line(melody)),
    ]
    return pm


def test_a_track_in_unison_with_an_earlier_one_of_its_instrument_doubles_it():
    pm = flutes()
    assert doublings(pm, [0, 1, 2], 4.0) == {1: 0}  # the oboe plays the line too, but it is another part
    assert doublings(pm, [0, 2], 4.0) == {}
    # a part that doubles only some of the other's notes is its own; one that plays a few of them (a
    # subset) follows the fuller part, whichever comes first
    assert doublings(flutes(second=[72, 74, 76, 77, 60, 62, 64, 65]), [0, 1], 4.0) == {}
    pm = flutes()
    pm.instruments[0].notes = pm.instruments[0].notes[::2] + [N(80, 60, 4.0, 4.4)]
    assert doublings(pm, [0, 1], 5.0) == {}  # 4 of Flute I's 5 are Flute II's: 80 % < DOUBLING_SHARE
    pm.instruments[0].notes = pm.instruments[0].notes[:4]
    assert doublings(pm, [0, 1], 5.0) == {0: 1}  # Flute I plays every other note of Flute II's line
    # too few notes to tell, and what the cut has not heard yet, say nothing
    assert doublings(flutes(), [0, 1], 1.4) == {}  # three notes each before the cut
    three = flutes()
    three.instruments.append(track("Flute III", 73, line([72, 74, 76, 77, 79, 77, 76, 74])))
    assert doublings(three, [0, 1, 2, 3], 4.0) == {1: 0, 3: 0}


def test_a_double_takes_a_copy_of_each_note_and_none_of_its_own():
    (tracks, places), _ = read(flutes())
    assert tracks.doubles == {1: 0}
    assert sorted(set(places)) == [(0, 1), (2,)]  # the flutes' line, read once, is both flutes' own
    placer = tracks.placer()
    assert [placer.place(73, p) for p in (60, 79, 90)] == [0, 0, 0]
    assert placer.copies(0) == [1] and placer.copies(1) == [] and placer.copies(2) == []
    # an infill's chosen tracks: a double chosen without its part is a part of its own, and a part chosen
    # without its double copies to nothing
    alone = tracks.placer(only={1})
    assert alone.place(73, 79) == 1 and alone.copies(1) == []
    assert tracks.placer(only={0}).copies(0) == []


def test_write_keeps_every_track_and_drums_on_channel_10():
    pm = quartet()
    pm.instruments.append(track("Kit", 25, [(0.0, 0.1, 36)], is_drum=True))
    (tracks, _), _ = read(pm)
    placer = tracks.placer()
    placer.place(33, 40)
    notes = [[N(80, 60, 0.0, 1.0)], [], [N(80, 40, 0.0, 1.0)], [N(90, 36, 0.5, 0.6)], [N(70, 40, 0.0, 0.5)]]
    out = tracks.write(placer.tracks, notes, tempo=100.0)
    buffer = io.BytesIO()
    out.write(buffer)
    back = pretty_midi.PrettyMIDI(io.BytesIO(buffer.getvalue()))
    assert [(i.name, i.program, i.is_drum, len(i.notes)) for i in back.instruments] == [
        ("Violin I", 40, False, 1),
        ("Cello", 42, False, 1),
        ("Kit", 25, True, 1),
        ("Electric Bass (finger)", 33, False, 1),
    ]  # pretty_midi drops a track without notes when it reads a file back: written, it is there
    assert len(out.instruments) == 5


def test_of_two_values_at_one_time_the_motif_keeps_the_later():
    """pretty_midi writes a tick's controllers in the order of their values: 20 after 100 would come out
    100 last."""
    track = Track("Guitar", 29, False, 29, 0, controls=((0.0, 10, 100), (0.0, 10, 20), (1.0, 7, 90)),
                  bends=((0.5, 300), (0.5, -200)))  # fmt: skip
    changes, bends = track.motif_controls(2.0)
    assert [(c.number, c.value, c.time) for c in changes] == [(10, 20, 0.0), (7, 90, 1.0)]
    assert [(b.pitch, b.time) for b in bends] == [(-200, 0.5), (0, 2.0)]  # and released at the cut
    assert [(c.number, c.value) for c in track.mix()] == [(7, 90), (10, 20)]
