"""POST /v1/infills and /v1/infills/stream in-process (TestClient) with a tiny random infill model: both
answer forms and the stream, everything outside the span kept, reproducible seeds, every bad span a typed
4xx (never a 5xx), the 503 without an infill model, the form's bounds, admission, metrics, and the engine
process."""

from __future__ import annotations

import base64
import io
import json
import threading
from collections.abc import Iterator

import httpx
import pretty_midi
import pytest
from fastapi.testclient import TestClient

from musicrel.generation.controls import parse_key, scale_pitch_classes
from tests.server.conftest import error_of, metric, serve, wait_for

SPAN = {"start": "5", "end": "8"}
NO_SECONDS = {"start": None, "end": None}  # post() leaves a None field out of the form


def tune(seconds: float = 20.0, step: float = 0.25, tracks: int = 1) -> bytes:
    """One rising and falling line every `step` seconds for `seconds` (and a bass per extra track)."""
    pm = pretty_midi.PrettyMIDI(initial_tempo=110)
    n = int(seconds / step)
    lead = pretty_midi.Instrument(program=0, name="lead")
    lead.notes = [pretty_midi.Note(80, 60 + (k * 5) % 12, k * step, k * step + 0.2) for k in range(n)]
    pm.instruments.append(lead)
    for t in range(1, tracks):
        bass = pretty_midi.Instrument(program=32 + t, name=f"bass{t}")
        bass.notes = [pretty_midi.Note(70, 36 + t, k * 1.0, k * 1.0 + 0.8) for k in range(int(seconds))]
        pm.instruments.append(bass)
    buffer = io.BytesIO()
    pm.write(buffer)
    return buffer.getvalue()


TUNE = tune()


def post(
    client: TestClient, data: bytes = TUNE, json_: bool = False, path: str = "/v1/infills", **fields
) -> httpx.Response:
    headers = {"accept": "application/json"} if json_ else {}
    return client.post(
        path,
        files={"file": ("tune.mid", data, "audio/midi")},
        data={k: v for k, v in {**SPAN, "seed": "7", **fields}.items() if v is not None},
        headers=headers,
    )


def read(data: bytes) -> pretty_midi.PrettyMIDI:
    return pretty_midi.PrettyMIDI(io.BytesIO(data))


def keys(notes) -> list[tuple]:
    return sorted((n.pitch, n.velocity, round(n.start, 4), round(n.end, 4)) for n in notes)


def check_span_filled(source: bytes, out: bytes, start: float, end: float) -> list:
    """Outside [start, end) every note of the one instrument is as it was; the notes that start inside are
    new and end by `end`. Returns the new notes."""
    (given,), (got,) = read(source).instruments, read(out).instruments
    outside = [n for n in given.notes if not start <= n.start < end]
    inside = [n for n in got.notes if start <= n.start < end]
    assert keys([n for n in got.notes if not start <= n.start < end]) == keys(outside)
    for n in inside:
        assert n.end <= end + 0.011, (n, end)
    return inside


@pytest.fixture(scope="module")
def client(tiny_checkpoint, tiny_infill_checkpoint) -> Iterator[tuple[TestClient, object]]:
    with serve(tiny_checkpoint, infill_checkpoint=tiny_infill_checkpoint, batch_window_ms=0) as pair:
        yield pair


# ---------------------------------------------------------------- answers
def test_midi_answer_regenerates_the_span_and_keeps_the_rest(client):
    c, _ = client
    r = post(c)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "audio/midi"
    assert r.headers["x-musicrel-seed"] == "7"
    assert 'filename="infill-7.mid"' in r.headers["content-disposition"]
    assert "generate;dur=" in r.headers["server-timing"]
    new = check_span_filled(TUNE, r.content, 5.0, 8.0)
    assert new, "the random tiny model wrote no note in 3 s"
    assert int(r.headers["x-musicrel-notes"]) == len(new)
    assert int(r.headers["x-musicrel-removed"]) == 12  # a note every 0.25 s in [5, 8)


def test_json_answer_has_every_sample_and_a_seed_that_repeats(client):
    c, _ = client
    r = post(c, json_=True, num_samples="2", seed="11", temperature="0.9", top_k="40", top_p="0.9")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["seed"] == 11 and body["settings"]["seed"] == 11 and body["settings"]["top_k"] == 40
    assert (body["start"], body["end"], body["removed"]) == (5.0, 8.0, 12)
    assert body["prompt_tokens"] > 0
    assert set(body["timings"]) == {"parse_ms", "queue_ms", "generation_ms", "total_ms"}
    assert [s["index"] for s in body["samples"]] == [0, 1]
    files = [base64.b64decode(s["midi_base64"]) for s in body["samples"]]
    for sample, data in zip(body["samples"], files, strict=True):
        new = check_span_filled(TUNE, data, 5.0, 8.0)
        assert sample["notes"] == len(new) == len(sample["new_notes"]) and sample["new_tokens"] > 0
        assert {n.pop("track") for n in sample["new_notes"]} <= {0}  # the tune's one track
        listed = keys(pretty_midi.Note(**n) for n in sample["new_notes"])  # exact; the file's, in ticks
        for a, b in zip(keys(new), listed, strict=True):
            assert a[:2] == b[:2] and abs(a[2] - b[2]) < 0.005 and abs(a[3] - b[3]) < 0.005
    assert files[0] != files[1], "two samples of one request should differ"
    again = post(c, json_=True, num_samples="2", seed="11", temperature="0.9", top_k="40", top_p="0.9")
    assert [s["midi_base64"] for s in again.json()["samples"]] == [s["midi_base64"] for s in body["samples"]]
    # Sample 0 of a batch is the single answer of the same seed (per-row seeds, as a continuation's).
    single = post(c, seed="11", temperature="0.9", top_k="40", top_p="0.9")
    assert single.content == files[0]


BAR = 4 * 60 / 110  # TUNE is 4/4 at 110 bpm


@pytest.mark.parametrize("path", ["/v1/infills", "/v1/infills/stream"])
def test_a_span_in_bars_is_the_seconds_of_those_bars(client, path):
    """Bars 3-4 of the tune: from bar 3's downbeat to bar 5's, as a sequencer counts them; the answer says
    the seconds, and the same seconds given as such fill the same notes."""
    c, _ = client
    bars = {"first_bar": "3", "last_bar": "4"}
    r = c.post(
        path,
        files={"file": ("t.mid", TUNE)},
        data={**bars, "seed": "5"},
        headers={"accept": "application/json"},
    )
    body = r.json() if path == "/v1/infills" else stream_events(r)[-1]
    assert r.status_code == 200, r.text
    start, end = body["start"], body["end"]
    assert abs(start - 2 * BAR) < 1e-4 and abs(end - 4 * BAR) < 1e-4, (start, end)  # the file's tempo in µs
    assert body["settings"]["first_bar"] == 3 and body["settings"]["start"] == start
    data = base64.b64decode(body["samples"][0]["midi_base64"])
    check_span_filled(TUNE, data, start, end)
    assert body["removed"] == sum(1 for k in range(80) if start <= k * 0.25 < end)
    seconds = c.post(
        "/v1/infills",
        files={"file": ("t.mid", TUNE)},
        data={"start": repr(start), "end": repr(end), "seed": "5"},
    )
    assert seconds.content == data


def test_a_file_with_several_tracks_gets_the_new_notes_on_its_own_tracks(client):
    c, _ = client
    data = tune(tracks=2)
    r = post(c, data, json_=True)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tracks"] == [0, 1] and body["settings"]["tracks"] is None
    for every in ("all", " MERGE "):  # every track, as a continuation's tracks says it
        same = post(c, data, json_=True, tracks=every).json()
        assert same["tracks"] == [0, 1] and same["samples"] == body["samples"]
    out = read(base64.b64decode(body["samples"][0]["midi_base64"]))
    assert [i.name for i in out.instruments] == ["lead", "bass1"]  # no track added
    listed = body["samples"][0]["new_notes"]
    assert listed and {n["track"] for n in listed} <= {0, 1}
    for t in (0, 1):
        inside = [n for n in out.instruments[t].notes if 5.0 <= n.start < 8.0]
        assert len(inside) == sum(n["track"] == t for n in listed)


@pytest.mark.parametrize("path", ["/v1/infills", "/v1/infills/stream"])
def test_tracks_regenerates_only_those_tracks_and_keeps_the_others_exactly(client, path):
    """tracks=1 on a lead and two basses: the lead and the second bass come back note for note, the first
    bass keeps every note outside the span and takes every new note."""
    c, _ = client
    data = tune(tracks=3)
    r = post(c, data, json_=True, path=path, tracks=" 1 ", num_samples="2")
    events = [] if path == "/v1/infills" else stream_events(r)
    body = r.json() if path == "/v1/infills" else events[-1]
    for i, sample in enumerate(body["samples"]):  # the streamed notes are the model's own: none placed
        mine = [e for e in events[1:-1] if e["sample"] == i]
        dropped = {e["id"] for e in mine if e["type"] == "note_drop"}
        ons = sorted(
            (e["pitch"], round(e["time"], 3))
            for e in mine
            if e["type"] == "note_on" and e["id"] not in dropped
        )
        if events:
            assert ons == sorted((n["pitch"], round(n["start"], 3)) for n in sample["new_notes"])
    assert sum(s["notes"] for s in body["samples"]) > 0
    assert r.status_code == 200, r.text
    assert body["tracks"] == [1] and body["settings"]["tracks"] == "1"
    assert body["removed"] == 3  # a bass note a second in [5, 8)
    given = read(data)
    for sample in body["samples"]:
        out = read(base64.b64decode(sample["midi_base64"]))
        assert [i.name for i in out.instruments] == ["lead", "bass1", "bass2"]
        for t in (0, 2):
            assert keys(out.instruments[t].notes) == keys(given.instruments[t].notes)
        outside = [n for n in given.instruments[1].notes if not 5.0 <= n.start < 8.0]
        assert keys(n for n in out.instruments[1].notes if not 5.0 <= n.start < 8.0) == keys(outside)
        inside = [n for n in out.instruments[1].notes if 5.0 <= n.start < 8.0]
        assert {n["track"] for n in sample["new_notes"]} <= {1} and len(inside) == sample["notes"]


@pytest.mark.parametrize(
    ("tracks", "code"),
    [("3", "no_such_track"), ("0,9", "no_such_track"), ("a", "invalid_request"), ("1;2", "invalid_request"),
     ("-1", "invalid_request"), ("2000", "invalid_request")],
)  # fmt: skip
@pytest.mark.parametrize("path", ["/v1/infills", "/v1/infills/stream"])
def test_bad_tracks_are_422_naming_the_field(client, path, tracks, code):
    c, _ = client
    r = post(c, tune(tracks=2), path=path, tracks=tracks)
    assert r.status_code == 422, r.text
    assert error_of(r)["code"] == code and error_of(r)["field"] == "tracks"
    bars = post(c, tune(tracks=2), path=path, tracks=tracks, **NO_SECONDS, first_bar="3", last_bar="4")
    assert bars.status_code == 422 and error_of(bars)["field"] == "tracks"


def test_a_drum_track_is_not_one_a_piano_model_can_fill(client):
    c, _ = client
    pm = read(tune(tracks=2))
    kit = pretty_midi.Instrument(program=0, is_drum=True, name="kit")
    kit.notes = [pretty_midi.Note(100, 36, 0.5 * k, 0.5 * k + 0.1) for k in range(40)]
    pm.instruments.append(kit)
    buffer = io.BytesIO()
    pm.write(buffer)
    r = post(c, buffer.getvalue(), tracks="2")
    assert r.status_code == 422 and error_of(r)["code"] == "track_not_read"


def stream_events(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in response.text.splitlines()]


def test_the_stream_sends_the_new_notes_then_the_plain_answer(client):
    c, _ = client
    events = stream_events(post(c, path="/v1/infills/stream", num_samples="2"))
    start, result = events[0], events[-1]
    assert start["type"] == "start" and start["seed"] == 7 and start["samples"] == 2
    assert (start["start"], start["end"]) == (5.0, 8.0)
    assert result["type"] == "result", result
    notes = events[1:-1]
    assert notes and {e["type"] for e in notes} <= {"note_on", "note_off", "note_drop"}
    assert {e["sample"] for e in notes} == {0, 1}
    for e in notes:
        if e["type"] != "note_drop":
            assert 5.0 <= e["time"] <= 8.0 + 1e-6, e
    # each sample's streamed notes (those not dropped) are the new notes of its file
    for i, sample in enumerate(result["samples"]):
        mine = [e for e in notes if e["sample"] == i]
        dropped = {e["id"] for e in mine if e["type"] == "note_drop"}
        onsets = sorted(
            (e["pitch"], round(e["time"], 3))
            for e in mine
            if e["type"] == "note_on" and e["id"] not in dropped
        )
        assert onsets == sorted((n["pitch"], round(n["start"], 3)) for n in sample["new_notes"])
    plain = post(c, json_=True, num_samples="2").json()  # the same seed on the plain route: the same files
    assert [s["midi_base64"] for s in plain["samples"]] == [s["midi_base64"] for s in result["samples"]]


def test_the_stream_leaves_out_a_new_note_struck_under_a_kept_one():
    """The edge rule the file applies (a new note struck while a kept note of its pitch sounds into the gap
    is dropped) applies to the streamed events too, with every event of that note."""
    from types import SimpleNamespace

    import numpy as np

    from musicrel.generation.streaming import NoteEvent
    from musicrel.midi.codec import CodecConfig, EventCodec
    from server.tasks.infill import INFILL
    from server.tasks.stream import TaskStream

    pm = read(TUNE)
    pm.instruments[0].notes.append(pretty_midi.Note(90, 50, 4.0, 7.0))  # sounds into the 5-8 s gap
    codec = EventCodec(CodecConfig(infill=True))
    service = SimpleNamespace(view_of={"infill": SimpleNamespace(codec=codec)}.get)
    form = SimpleNamespace(start=5.0, num_samples=1)
    segments = SimpleNamespace(pm=pm, past=np.zeros(0, dtype=np.int64))
    request = SimpleNamespace(found=segments, form=form, job=SimpleNamespace(model="infill"))
    stream = TaskStream(INFILL, service, request)
    events = [
        NoteEvent("on", 0, 50, 0.5, 80),  # 5.5 s: under the kept 50 -> left out
        NoteEvent("on", 1, 52, 0.5, 80),  # another pitch -> reported
        NoteEvent("off", 0, 50, 1.0),
        NoteEvent("off", 1, 52, 1.0),
        NoteEvent("on", 2, 50, 2.0, 80),  # 7.0 s: the kept 50 has ended -> reported
        NoteEvent("off", 2, 50, 2.5),
    ]
    lines = [json.loads(line) for line in stream._events(0, events)]
    assert [(e["type"], e["id"]) for e in lines] == [
        ("note_on", 1), ("note_off", 1), ("note_on", 2), ("note_off", 2)
    ]  # fmt: skip
    assert lines[2]["time"] == 7.0 and lines[2]["pitch"] == 50


def test_controls_steer_the_span_and_the_answer_says_what_they_applied(client):
    c, _ = client
    r = post(c, json_=True, num_samples="2", key="auto", key_strength="only", high_note="66")
    assert r.status_code == 200, r.text
    body = r.json()
    # TUNE's line walks the twelve pitch classes in fourths: its key is whatever Krumhansl-Schmuckler finds
    assert body["controls"]["key_detected"] is True and body["controls"]["high_note"] == 66
    assert body["settings"]["key"] == "auto" and body["settings"]["high_note"] == 66
    scale = scale_pitch_classes(parse_key(body["controls"]["key"]))
    new = [n for s in body["samples"] for n in s["new_notes"]]
    assert new and all(n["pitch"] % 12 in scale and n["pitch"] <= 66 for n in new)
    assert post(c, json_=True).json()["controls"] is None


# ---------------------------------------------------------------- errors: typed 4xx, never a 5xx
@pytest.mark.parametrize(
    ("data", "fields", "status", "code", "field"),
    [
        (TUNE, {"start": "8", "end": "5"}, 422, "invalid_span", "start"),
        (TUNE, {"start": "5", "end": "5"}, 422, "invalid_span", "start"),
        (TUNE, {"start": "5", "end": "5.001"}, 422, "invalid_span", "start"),
        (TUNE, {"start": "1", "end": "40"}, 422, "span_too_long", "end"),
        (TUNE, {"start": "30", "end": "35"}, 422, "span_outside_music", "start"),
        (TUNE, {"start": "0", "end": "3"}, 422, "nothing_before", "start"),
        (TUNE, {"start": "15", "end": "25"}, 422, "nothing_after", "end"),
        (TUNE, {"start": "abc"}, 422, "invalid_request", "start"),
        (TUNE, {"end": "nan"}, 422, "invalid_request", "end"),
        (TUNE, {"start": "-1"}, 422, "invalid_request", "start"),
        (TUNE, {"end": ""}, 422, "invalid_request", "end"),
        (b"not a midi file at all", {}, 422, "not_midi", None),
        (b"", {}, 422, "invalid_request", "file"),
        (TUNE, {"seconds": "3"}, 422, "invalid_request", "seconds"),  # a continuation's field
        (TUNE, {"num_samples": "5"}, 422, "invalid_request", "num_samples"),
        (TUNE, {"temperature": "0"}, 422, "invalid_request", "temperature"),
        (TUNE, {"top_k": "100000"}, 422, "invalid_request", "top_k"),
        (TUNE, {"seed": "-1"}, 422, "invalid_request", "seed"),
        (TUNE, {"program": "40"}, 422, "invalid_request", "program"),  # new notes join the file's own
        (TUNE, {"key": "H:major"}, 422, "unknown_key", "key"),
        (TUNE, {"low_note": "70", "high_note": "60"}, 422, "empty_range", "low_note"),
        (TUNE, {"first_bar": "3", "last_bar": "4"}, 422, "invalid_request", "first_bar"),  # and seconds
        (TUNE, {**NO_SECONDS, "first_bar": "3"}, 422, "invalid_request", "last_bar"),
        (
            TUNE,
            {**NO_SECONDS, "first_bar": "4", "last_bar": "3"},
            422,
            "invalid_span",
            "first_bar",
        ),
        (
            TUNE,
            {**NO_SECONDS, "first_bar": "3", "last_bar": "10"},
            422,
            "span_outside_music",
            "last_bar",
        ),
        (
            TUNE,
            {**NO_SECONDS, "first_bar": "0", "last_bar": "3"},
            422,
            "invalid_request",
            "first_bar",
        ),
        (TUNE, {**NO_SECONDS, "first_bar": "1", "last_bar": "2"}, 422, "nothing_before", "first_bar"),
        (tune(60.0), {**NO_SECONDS, "first_bar": "2", "last_bar": "16"}, 422, "span_too_long", "last_bar"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/infills", "/v1/infills/stream"])
def test_a_bad_request_is_a_typed_4xx(client, path, data, fields, status, code, field):
    c, _ = client
    r = post(c, data, path=path, **fields)  # a field set to None is left out of the form
    assert r.status_code == status, r.text
    error = error_of(r)
    assert error["code"] == code
    assert error.get("field") == field


def test_a_form_without_a_span_is_422_naming_it(client):
    c, _ = client
    r = c.post("/v1/infills", files={"file": ("t.mid", TUNE)}, data={"end": "8"})
    assert r.status_code == 422 and error_of(r)["field"] == "start"


def test_without_a_model_the_routes_are_503_and_the_model_info_says_so(tiny_checkpoint, tmp_path):
    with serve(tiny_checkpoint, infill_checkpoint=tmp_path / "nothing") as (c, _):
        for path in ("/v1/infills", "/v1/infills/stream"):
            r = post(c, path=path)
            assert r.status_code == 503, r.text
            assert error_of(r)["code"] == "infill_unavailable"
        assert c.get("/v1/model").json()["infill"] is None
        assert post(c, b"").status_code == 503  # refused before the upload is looked at
        continued = c.post("/v1/continuations", files={"file": ("m.mid", TUNE)}, data={"seconds": "0.3"})
        assert continued.status_code == 200, continued.text


def test_a_checkpoint_without_infill_tokens_is_not_served(tiny_checkpoint):
    with serve(tiny_checkpoint, infill_checkpoint=tiny_checkpoint) as (c, service):
        r = post(c)
        assert r.status_code == 503 and error_of(r)["code"] == "infill_unavailable"
        assert "infill tokens" in error_of(r)["message"]
        assert service.infiller is None


def test_unset_the_infill_model_is_the_continuation_model_when_it_fills_gaps(
    tiny_checkpoint, tiny_infill_checkpoint, tmp_path
):
    """MUSICREL_INFILL_CHECKPOINT unset: a continuation checkpoint that has infill tokens (an instruments
    model that also fills, say) serves the fills too; one that has none leaves them to checkpoints/infill."""
    from server.model import DEFAULT_INFILL_CHECKPOINT, infill_folder

    assert infill_folder(None, tiny_infill_checkpoint) == tiny_infill_checkpoint
    assert infill_folder(None, tiny_checkpoint) == DEFAULT_INFILL_CHECKPOINT
    assert infill_folder(None, tmp_path / "nothing") == DEFAULT_INFILL_CHECKPOINT
    assert infill_folder(tmp_path / "chosen", tiny_infill_checkpoint) == tmp_path / "chosen"  # set: it wins
    with serve(tiny_infill_checkpoint, infill_checkpoint=None) as (c, service):
        assert c.get("/v1/model").json()["infill"]["checkpoint"] == str(tiny_infill_checkpoint)
        assert post(c).status_code == 200
        assert service.infiller is not None


def test_model_info_describes_the_infill_model(client, tiny_infill_checkpoint):
    c, _ = client
    info = c.get("/v1/model").json()["infill"]
    assert info["checkpoint"] == str(tiny_infill_checkpoint)
    assert info["max_span_seconds"] == 30 and info["parameters"] > 0 and len(info["sha256"]) == 64


def test_past_the_deadline_is_504(tiny_checkpoint, tiny_infill_checkpoint):
    with serve(tiny_checkpoint, infill_checkpoint=tiny_infill_checkpoint, request_timeout_s=0.05) as (
        c,
        service,
    ):
        r = post(c, tune(60.0), start="10", end="40", num_samples="4")
        assert r.status_code == 504, r.text
        assert error_of(r)["code"] == "timeout"
        assert service.admission.admitted == 0  # the ticket went back


# ---------------------------------------------------------------- admission, metrics, docs
def test_counted_in_flight_and_refused_while_draining(client):
    c, service = client
    labels = {"route": "/v1/infills", "method": "POST", "status": "200"}
    before = metric(service, "musicrel_http_requests_total", **labels)
    assert post(c).status_code == 200
    assert metric(service, "musicrel_http_requests_total", **labels) == before + 1
    assert service.in_flight == 0 and service.admission.admitted == 0
    service.draining = True
    try:
        for path in ("/v1/infills", "/v1/infills/stream"):
            r = post(c, path=path)
            assert r.status_code == 503 and error_of(r)["code"] == "draining"
    finally:
        service.draining = False


def test_openapi_documents_the_form(client):
    c, _ = client
    document = c.get("/openapi.json").json()
    for path in ("/v1/infills", "/v1/infills/stream"):
        operation = document["paths"][path]["post"]
        assert {"200", "422", "503"} <= set(operation["responses"])
        assert "infill_unavailable" in operation["responses"]["503"]["description"]
        assert "nothing_after" in operation["responses"]["422"]["description"]
        ref = operation["requestBody"]["content"]["multipart/form-data"]["schema"]["$ref"].rsplit("/", 1)[1]
        body = document["components"]["schemas"][ref]
        assert body["additionalProperties"] is False
        assert {"file", "start", "end", "tracks", "seed", "temperature", "top_k", "top_p"} <= set(
            body["properties"]
        )
        assert {"first_bar", "last_bar"} <= set(body["properties"]) and body["required"] == ["file"]
        assert [way["required"] for way in body["oneOf"]] == [["start", "end"], ["first_bar", "last_bar"]]
        assert body["properties"]["num_samples"]["maximum"] == 4


def test_a_full_queue_refuses_an_infill_with_429(tiny_checkpoint, tiny_infill_checkpoint):
    from tests.server.conftest import FAST, Gate
    from tests.server.conftest import post as post_continuation

    gate = Gate()
    with serve(
        tiny_checkpoint,
        decoder=gate,
        infill_checkpoint=tiny_infill_checkpoint,
        max_queue=1,
        max_batch_rows=1,
        batch_window_ms=0,
    ) as (c, service):
        gate.hold()
        answers: dict = {}
        holding = threading.Thread(target=lambda: answers.update(first=post_continuation(c, **FAST)))
        holding.start()
        assert gate.entered.wait(10)  # a continuation holds the engine's loop ...
        queued = threading.Thread(target=lambda: answers.update(second=post(c)))
        queued.start()
        wait_for(lambda: service.worker.queue_depth == 1)  # ... an infill waits in its queue ...
        refused = post(c)  # ... and the next one is turned away at once
        assert refused.status_code == 429 and error_of(refused)["code"] == "queue_full"
        assert int(refused.headers["retry-after"]) >= 1
        gate.opened.set()
        holding.join(30)
        queued.join(30)
        assert answers["first"].status_code == 200 and answers["second"].status_code == 200
        assert float(answers["second"].headers["x-musicrel-timing-queue-ms"]) > 0


# ---------------------------------------------------------------- through the engine process
def test_the_engine_process_fills_the_same_music_and_the_server_holds_no_weights(client, engine_app):
    thread_client, _ = client
    expected = post(thread_client, json_=True, num_samples="2", seed="5").json()
    c, service = engine_app
    r = post(c, json_=True, num_samples="2", seed="5")
    assert r.status_code == 200, r.text
    assert service.loaded is None and service.infiller is None  # cards and codecs only
    assert c.get("/v1/model").json()["infill"]["parameters"] > 0
    got = [s["midi_base64"] for s in r.json()["samples"]]
    assert got == [s["midi_base64"] for s in expected["samples"]]
    events = stream_events(post(c, path="/v1/infills/stream", num_samples="2", seed="5"))
    assert [s["midi_base64"] for s in events[-1]["samples"]] == got
    assert any(e["type"] == "note_on" for e in events)


def test_a_client_that_leaves_stops_its_infill_in_the_engine(engine_app):
    from tests.server.conftest import post_then_leave

    c, service = engine_app  # the client checked every 20 ms

    def started() -> bool:
        return any(job.started_at for job in list(service.worker._jobs.values()))

    before = metric(service, "musicrel_stopped_jobs_total", reason="disconnected")
    fields = {"start": "10", "end": "40", "num_samples": "4"}  # seconds of decoding on the tiny model
    messages = post_then_leave(c, fields, started, path="/v1/infills", data=tune(60.0))
    assert messages[0]["status"] == 499
    wait_for(lambda: metric(service, "musicrel_stopped_jobs_total", reason="disconnected") == before + 1, 30)
    assert post(c).status_code == 200  # the engine carries on
