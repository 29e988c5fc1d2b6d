"""musicrel.midi.tracks: the upload's tracks (names, programs, drums), each note's track by instrument and by
nearest voice where one instrument has several tracks, new tracks for new instruments, the file written
back with its tracks."""

from __future__ import annotations

import io

import pretty_midi

from musicrel.midi.codec import CodecConfig, EventCodec
from musicrel.midi.instruments import DRUMS
from musicrel.midi.tracks import Track, Tracks, read_tracks

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
    by_track = {k: sorted(n.pitch for n, p in zip(notes, places, strict=True) if p == k) for k in range(3)}
    assert by_track == {0: [74, 76, 79], 1: [64, 65, 67], 2: [43]}


def test_selection_keeps_upload_indices_as_sources():
    (tracks, places), notes = read(quartet(), selection=[1, 2])
    assert [t.source for t in tracks.tracks] == [1, 2]
    assert sorted(n.pitch for n, p in zip(notes, places, strict=True) if p == 0) == [64, 65, 67]


def test_nearest_voice_from_the_latest_onset_before_the_note():
    (tracks, _), _ = read(quartet(), cut=2.0)  # last onsets: Violin I 74, Violin II 65 (at 1.0 s)
    placer = tracks.placer()
    assert placer.place(40, 72, 2.0) == 0
    assert placer.place(40, 66, 2.0) == 1
    # struck at the same time: the notes above do not count yet, each is read against 74 and 65
    assert placer.place(40, 70, 2.0) == 0  # |70 - 74| = 4 < |70 - 65| = 5
    # later: Violin I's latest onset is {72, 70} (mean 71), Violin II's {66}
    assert placer.place(40, 69, 2.5) == 0
    assert placer.place(40, 60, 3.0) == 1  # Violin I's latest is 69, Violin II's 66
    assert placer.place(42, 40, 3.0) == 2  # one cello track: always it


def test_nearest_voice_ties_go_to_the_earlier_track():
    pm = pretty_midi.PrettyMIDI()
    pm.instruments = [track("A", 0, [(0.0, 1.0, 70)]), track("B", 0, [(0.0, 1.0, 60)])]
    (tracks, _), _ = read(pm)
    assert tracks.placer().place(0, 65, 1.0) == 0


def test_a_track_silent_so_far_is_chosen_only_when_all_are():
    pm = pretty_midi.PrettyMIDI()
    pm.instruments = [track("A", 0, [(5.0, 6.0, 40)]), track("B", 0, [(0.0, 1.0, 90)])]
    (tracks, _), _ = read(pm, cut=2.0)
    assert tracks.placer().place(0, 30, 2.0) == 1  # A struck nothing before the cut
    empty = Tracks([Track("A", 0, False, 0, 0), Track("B", 0, False, 0, 1)])
    assert empty.placer().place(0, 30, 0.0) == 0


def test_new_instruments_get_new_tracks_in_the_order_they_sound():
    (tracks, _), _ = read(quartet())
    placer = tracks.placer()
    assert placer.place(DRUMS, 36, 2.0) == 3
    assert placer.place(33, 40, 2.0) == 4
    assert placer.place(DRUMS, 38, 2.5) == 3
    assert [(t.name, t.program, t.is_drum, t.source) for t in placer.tracks[3:]] == [
        ("Drums", 0, True, None),
        ("Electric Bass (finger)", 33, False, None),
    ]
    assert len(tracks) == 3  # the upload's Tracks are not changed by a placement


def test_offset_reads_times_in_the_uploads_clock():
    (tracks, _), _ = read(quartet(), cut=1.0)  # latest onsets at 0.5 s: Violin I 79, Violin II 64
    placer = tracks.placer(offset=1.0)
    assert placer.place(40, 70, 0.0) == 1  # |70-64| < |70-79|


def test_write_keeps_every_track_and_drums_on_channel_10():
    pm = quartet()
    pm.instruments.append(track("Kit", 25, [(0.0, 0.1, 36)], is_drum=True))
    (tracks, _), _ = read(pm)
    placer = tracks.placer()
    placer.place(33, 40, 0.0)
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
