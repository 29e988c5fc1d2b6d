"""POST /v1/infills/stream with a model whose codec has instruments (issue 42): every streamed note is a note
of the answer's file, on the track the file has it on. A note the model writes for an instrument that no
chosen track plays is left out of the file (`span.route`), so it is never streamed either."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import numpy as np
import pytest

from musicrel.generation.span import InfillParams, gap_notes, infill_segments
from tests.musicrel.generation.test_infill_tracks import BAND, END, START, three_tracks, tiny
from tests.server.conftest import serve

SPAN = {"start": str(START), "end": str(END), "seed": "6", "num_samples": "3"}


@pytest.fixture(scope="module")
def trio() -> bytes:
    """A violin, a viola and a cello (programs 40, 41, 42)."""
    buffer = io.BytesIO()
    three_tracks(programs=(40, 41, 42)).write(buffer)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_checkpoint):
    """The tiny random instruments + infill model as the server's infill model, float32 (the library's own
    run of the same weights gives the same notes)."""
    from musicrel.model.checkpoint import save_model

    folder = tmp_path_factory.mktemp("tiny_band_infill")
    save_model(tiny(BAND), folder, codec=BAND)
    with serve(tiny_checkpoint, infill_checkpoint=folder, weights="float32", batch_window_ms=0) as pair:
        yield pair[0], folder


def streamed(client, data: bytes, **fields) -> tuple[list[list[tuple]], dict]:
    """Each sample's streamed notes (pitch, start, track, instrument) that no note_drop took back, and the
    result event."""
    response = client.post(
        "/v1/infills/stream", files={"file": ("trio.mid", data, "audio/midi")}, data={**SPAN, **fields}
    )
    assert response.status_code == 200, response.text
    events = [json.loads(line) for line in response.text.splitlines()]
    result = events[-1]
    assert result["type"] == "result", result
    notes = []
    for i in range(len(result["samples"])):
        mine = [e for e in events if e.get("sample") == i]
        dropped = {e["id"] for e in mine if e["type"] == "note_drop"}
        notes.append(
            sorted(
                (e["pitch"], round(e["time"], 3), e["track"], e["instrument"])
                for e in mine
                if e["type"] == "note_on" and e["id"] not in dropped
            )
        )
    return notes, result


@pytest.mark.parametrize("tracks", ["1", "0,2", None])
def test_every_streamed_note_is_a_note_of_the_file_on_its_track(served, trio, tracks):
    client, _ = served
    fields = {} if tracks is None else {"tracks": tracks}
    notes, result = streamed(client, trio, **fields)
    chosen = result["tracks"]
    programs = [40, 41, 42]
    assert any(notes)
    for sample, mine in zip(result["samples"], notes, strict=True):
        answer = sorted((n["pitch"], round(n["start"], 3), n["track"]) for n in sample["new_notes"])
        assert [n[:3] for n in mine] == answer
        for _, _, track, instrument in mine:  # each on a chosen track that plays its instrument
            assert track in chosen and programs[track] == instrument


def test_the_notes_of_an_instrument_no_chosen_track_plays_are_not_streamed(served, trio):
    """tracks=1 (the viola) and instruments=any: the model also wrote notes for other instruments (the
    library's run of the same weights and seed shows them), and none of them is streamed."""
    from musicrel.generation.controls import Controls
    from musicrel.generation.infill import infill
    from musicrel.model.checkpoint import load_model

    client, folder = served
    notes, result = streamed(client, trio, tracks="1", instruments="any")
    assert {n[3] for mine in notes for n in mine} <= {41}
    model = load_model(folder, weights="float32")
    params = InfillParams(seed=6, num_samples=3, tracks=(1,), controls=Controls(instruments="any"))
    library = infill(model, trio, START, END, codec=BAND, params=params)
    seg = infill_segments(BAND, trio, START, END, (1,))
    others = 0
    for tokens, sample, mine in zip(library.tokens, library.notes, notes, strict=True):
        assert sorted((n.pitch, round(n.start, 3)) for n in sample) == [n[:2] for n in mine]
        _, instruments = gap_notes(BAND, seg.past, tokens, START, END)
        others += sum(i != 41 for i in instruments)
    assert others > 0


def test_the_stream_places_a_note_as_the_answer_does():
    """The infill task's note source, fed a band's gap by hand: the violin's and the viola's notes on their
    tracks (the chosen 0 and 1), the cello's (track 2, kept) never reported, nor its note-off."""
    from server.tasks.infill import INFILL
    from server.tasks.stream import TaskStream

    pm = three_tracks(programs=(40, 41, 42))
    seg = infill_segments(BAND, pm, START, END, (0, 1))
    service = SimpleNamespace(view_of={"infill": SimpleNamespace(codec=BAND)}.get)
    form = SimpleNamespace(start=START, end=END, num_samples=1)
    request = SimpleNamespace(found=seg, form=form, job=SimpleNamespace(model="infill"))
    stream = TaskStream(INFILL, service, request)
    inst = lambda program: BAND.instrument_offset + program  # noqa: E731
    shift = lambda steps: BAND.time_shift_offset + steps - 1  # noqa: E731
    tokens = [inst(42), 40, inst(41), 62, shift(50), inst(42), BAND.note_off_offset + 40, inst(40), 81]
    tokens += [shift(20), BAND.note_off_offset + 81, inst(41), BAND.note_off_offset + 62]
    (notes,) = stream.notes
    lines = [json.loads(line) for line in stream._events(0, notes.feed(np.asarray(tokens)) + notes.close())]
    ons = [(e["pitch"], e["time"], e["track"], e["instrument"]) for e in lines if e["type"] == "note_on"]
    assert ons == [(62, START, 1, 41), (81, START + 0.5, 0, 40)]
    assert sorted(e["id"] for e in lines if e["type"] == "note_off") == [0, 1]
    written, instruments = gap_notes(BAND, seg.past, np.asarray(tokens), START, END)
    merged = [(n.pitch, n.start) for n, i in zip(written, instruments, strict=True) if i != 42]
    assert sorted(merged) == sorted((p, t) for p, t, _, _ in ons)


@pytest.mark.parametrize("route", ["/v1/infills", "/v1/infills/stream"])
def test_the_answer_is_the_upload_with_the_spans_notes_edited(served, route):
    """What pretty_midi drops (a copyright, SysEx, a marker, each track's port) comes back as sent: the
    answer's file is the upload's own bytes with the chosen track's notes in the span edited."""
    import base64

    import mido

    from tests.musicrel.generation.test_infill_tracks import with_markers

    client, _ = served
    data = with_markers(three_tracks(programs=(40, 41, 42)))
    response = client.post(
        route,
        files={"file": ("trio.mid", data, "audio/midi")},
        data={**SPAN, "tracks": "1"},
        headers={"Accept": "application/json"},
    )
    assert response.status_code == 200, response.text
    answer = json.loads(response.text.splitlines()[-1]) if route.endswith("stream") else response.json()
    sent = mido.MidiFile(file=io.BytesIO(data)).tracks
    for sample in answer["samples"]:
        tracks = mido.MidiFile(file=io.BytesIO(base64.b64decode(sample["midi_base64"]))).tracks
        assert [tracks[t] for t in (0, 1, 3)] == [sent[t] for t in (0, 1, 3)]
        assert [m for m in tracks[2] if m.type not in ("note_on", "note_off")] == [
            m for m in sent[2] if m.type not in ("note_on", "note_off")
        ]
        assert tracks[2] != sent[2]  # the viola's span was written anew
