"""POST /v1/continuations and its stream with a model whose codec has instruments (issue 42): the answer lists
the motif's tracks and each sample's, the MIDI keeps them (names, programs, drums), the stream's note_on says
each note's track and instrument and the notes per track are the file's; `program` is refused
(program_with_instruments); a quartet, a Lied, a band with drums, drums only, 17 instruments and a program
change inside a track are answered, never with a 5xx. A piano model answers a drums-only file no_notes."""

from __future__ import annotations

import base64
import io
import json

import pretty_midi
import pytest

from tests.musicrel.generation.test_continuation_tracks import (
    CODEC,
    ENSEMBLES,
    as_bytes,
    drums_only,
    instruments_model,
    layout,
    many_instruments,
    program_change_inside_a_track,
)
from tests.server.conftest import error_of, serve

FIELDS = {"seconds": "1.5", "seed": "3", "num_samples": "2"}


@pytest.fixture(scope="module")
def instruments_checkpoint(tmp_path_factory):
    """A tiny random model with the instruments codec, saved as a checkpoint."""
    from musicrel.model.checkpoint import save_model

    folder = tmp_path_factory.mktemp("tiny_instruments_checkpoint")
    save_model(instruments_model(), folder, codec=CODEC)
    return folder


@pytest.fixture(scope="module")
def client(instruments_checkpoint):
    with serve(instruments_checkpoint, batch_window_ms=0) as (client, _):
        yield client


def post(client, data: bytes, path: str = "/v1/continuations", **fields):
    return client.post(
        path,
        files={"file": ("motif.mid", data, "audio/midi")},
        data={**FIELDS, **fields},
        headers={"accept": "application/json"},
    )


def midi_of(sample: dict) -> pretty_midi.PrettyMIDI:
    return pretty_midi.PrettyMIDI(io.BytesIO(base64.b64decode(sample["midi_base64"])))


def described(upload: pretty_midi.PrettyMIDI) -> list[dict]:
    return [
        {"index": k, "name": i.name, "program": i.program, "drum": i.is_drum, "source": k}
        for k, i in enumerate(upload.instruments)
    ]


@pytest.mark.parametrize("name", sorted(ENSEMBLES))
def test_the_answer_lists_and_keeps_the_tracks(client, name):
    upload = ENSEMBLES[name]()
    response = post(client, as_bytes(upload), include_primer="true")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["tracks"] == described(upload)
    for sample in body["samples"]:
        assert sample["tracks"][: len(upload.instruments)] == described(upload)
        assert all(t["source"] is None for t in sample["tracks"][len(upload.instruments) :])
        pm = midi_of(sample)  # the motif is included: every track has notes, so none vanishes on reading
        assert layout(pm)[: len(upload.instruments)] == layout(upload)
        assert written_tracks(sample) == [(t["name"], t["program"], t["drum"]) for t in sample["tracks"]]


def written_tracks(sample: dict) -> list[tuple[str, int, bool]]:
    """(name, program, drum) of each track chunk of a sample's file after the tempo track, read with mido:
    pretty_midi drops a track without notes when it reads a file, and the answer's indices count them."""
    import mido

    midi = mido.MidiFile(file=io.BytesIO(base64.b64decode(sample["midi_base64"])))
    out = []
    for track in midi.tracks[1:]:
        name = next((m.name for m in track if m.type == "track_name"), "")
        program = next(m.program for m in track if m.type == "program_change")
        drum = next(m.channel for m in track if m.type == "program_change") == 9
        out.append((name, program, drum))
    return out


def test_the_stream_gives_each_notes_track_and_they_are_the_files(client):
    upload = ENSEMBLES["band"]()
    response = post(client, as_bytes(upload), path="/v1/continuations/stream", seconds="3")
    assert response.status_code == 200, response.text
    events = [json.loads(line) for line in response.text.splitlines()]
    start, result = events[0], events[-1]
    assert start["type"] == "start" and start["tracks"] == described(upload)
    assert result["type"] == "result"
    for s, sample in enumerate(result["samples"]):
        notes: dict[int, list] = {}
        for e in events:
            if e.get("sample") != s:
                continue
            if e["type"] == "note_on":
                track = sample["tracks"][e["track"]]
                assert e["instrument"] == (128 if track["drum"] else track["program"])
                notes[e["id"]] = [e["track"], e["pitch"], e["time"], None]
            elif e["type"] == "note_off":
                notes[e["id"]][3] = e["time"]
            else:
                del notes[e["id"]]
        assert notes, "the tiny model's seed strikes notes"
        from_stream = sorted((t, p, round(a, 3), round(b, 3)) for t, p, a, b in notes.values())
        raw = midi_of(sample)
        # read back, a file's tracks without notes vanish: map the tracks that have notes by their names
        kept = [k for k, t in enumerate(sample["tracks"]) if any(n[0] == k for n in notes.values())]
        assert len(raw.instruments) == len(kept)
        from_file = sorted(
            (k, n.pitch, round(n.start, 3), round(n.end, 3))
            for k, inst in zip(kept, raw.instruments, strict=True)
            for n in inst.notes
        )
        assert from_stream == from_file


def test_program_is_refused_with_instruments(client):
    response = post(client, as_bytes(ENSEMBLES["quartet"]()), program="Violin")
    assert response.status_code == 422
    assert error_of(response)["code"] == "program_with_instruments"
    response = post(client, as_bytes(ENSEMBLES["quartet"]()), path="/v1/continuations/stream", program="40")
    assert response.status_code == 422 and error_of(response)["code"] == "program_with_instruments"


def test_drums_only_many_instruments_and_a_program_change_are_answered(client):
    for data, tracks in (
        (as_bytes(drums_only()), [("Kit", 0, True)]),
        (as_bytes(many_instruments(17)), None),
        (program_change_inside_a_track(), [("Winds", 73, False), ("Winds", 68, False)]),
    ):
        response = post(client, data, include_primer="true")
        assert response.status_code == 200, response.text
        body = response.json()
        if tracks is not None:
            assert [(t["name"], t["program"], t["drum"]) for t in body["tracks"]] == tracks
        else:
            assert len(body["tracks"]) == 18 and body["tracks"][-1]["drum"]
            assert [t["program"] for t in body["tracks"][:17]] == [3 * k for k in range(17)]


def test_a_track_selection_and_the_midi_answer(client):
    response = post(client, as_bytes(ENSEMBLES["band"]()), tracks="0,2", include_primer="true")
    assert response.status_code == 200, response.text
    tracks = response.json()["tracks"]
    assert [(t["name"], t["source"]) for t in tracks] == [("Drums", 0), ("Guitar", 2)]
    plain = client.post(
        "/v1/continuations",
        files={"file": ("motif.mid", as_bytes(ENSEMBLES["band"]()), "audio/midi")},
        data={**FIELDS, "include_primer": "true"},
    )
    assert plain.status_code == 200 and plain.headers["content-type"] == "audio/midi"
    pm = pretty_midi.PrettyMIDI(io.BytesIO(plain.content))
    assert layout(pm)[:3] == layout(ENSEMBLES["band"]())


def test_a_piano_model_answers_as_before(tiny_checkpoint):
    with serve(tiny_checkpoint, batch_window_ms=0) as (client, _):
        response = post(client, as_bytes(drums_only()))
        assert response.status_code == 422 and error_of(response)["code"] == "no_notes"
        body = post(client, as_bytes(ENSEMBLES["band"]())).json()
        assert body["tracks"] is None and all(s["tracks"] is None for s in body["samples"])
        assert len(midi_of(body["samples"][0]).instruments) == 1
