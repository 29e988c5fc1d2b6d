"""POST /v1/continuations/stream in-process: the events in order, notes that are the final MIDI's, the same
MIDI as the plain endpoint, notes before the end, a client that leaves frees its rows, errors (before the
stream as plain JSON, after it as events) and the plain endpoint's limits."""

from __future__ import annotations

import base64
import io
import json
import threading
from collections.abc import Callable

import httpx
import pretty_midi
import pytest
from fastapi.testclient import TestClient

from server.tasks.stream import MEDIA_TYPE
from tests.server.conftest import MOTIF, Broken, Gate, error_of, metric, motif, serve, wait_for

PATH = "/v1/continuations/stream"
# a seed whose two samples strike notes within the second (the tiny model's draws: RowRandom's streams)
FIELDS = {"seconds": "1", "seed": "12", "num_samples": "2"}
RESPONSE_FIELDS = {"seed", "settings", "primer", "samples", "new_tokens", "stopped", "timings", "batch"}


def stream(client: TestClient, data: bytes = MOTIF, **fields: str) -> httpx.Response:
    return client.post(PATH, files={"file": ("motif.mid", data, "audio/midi")}, data=fields)


def events_of(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == MEDIA_TYPE
    lines = response.text.splitlines()
    assert lines and all(lines), "one JSON object per line, nothing else"
    return [json.loads(line) for line in lines]


def apply(events: list[dict], sample: int) -> list[tuple[float, float, int, int]]:
    """One sample's notes from its events, checking the protocol: ids in onset order, onsets in time order,
    one end per note."""
    notes: dict[int, list] = {}
    ended: set[int] = set()
    last_onset = 0.0
    for e in events:
        if e.get("sample") != sample:
            continue
        if e["type"] == "note_on":
            assert e["id"] == len(notes) and e["time"] >= last_onset
            last_onset = e["time"]
            notes[e["id"]] = [e["time"], None, e["pitch"], e["velocity"]]
        else:
            assert e["id"] in notes and e["id"] not in ended
            ended.add(e["id"])
            notes[e["id"]][1] = e["time"] if e["type"] == "note_off" else "dropped"
    assert ended == set(notes), "every note ends before the result"
    return sorted((s, e, p, v) for s, e, p, v in notes.values() if e != "dropped")


def midi_notes(sample: dict) -> list[tuple[float, float, int, int]]:
    pm = pretty_midi.PrettyMIDI(io.BytesIO(base64.b64decode(sample["midi_base64"])))
    return sorted((n.start, n.end, n.pitch, n.velocity) for i in pm.instruments for n in i.notes)


def plain_json(client: TestClient) -> dict:
    """The plain endpoint's JSON answer to the same request."""
    files = {"file": ("motif.mid", MOTIF, "audio/midi")}
    headers = {"accept": "application/json"}
    return client.post(PATH.removesuffix("/stream"), files=files, data=FIELDS, headers=headers).json()


def midis(body: dict) -> list[str]:
    return [s["midi_base64"] for s in body["samples"]]


@pytest.fixture(scope="module")
def app_client(tiny_checkpoint):
    with serve(tiny_checkpoint, batch_window_ms=0) as pair:
        yield pair


@pytest.fixture
def client(app_client) -> TestClient:
    return app_client[0]


def test_events_in_order_notes_are_the_final_midi_and_it_equals_the_plain_answer(client):
    events = events_of(stream(client, **FIELDS))
    start, result = events[0], events[-1]
    assert start["type"] == "start" and result["type"] == "result"
    assert start["seed"] == result["seed"] == 12 and start["samples"] == 2
    assert start["settings"] == result["settings"] and start["primer"] == result["primer"]
    assert {e["type"] for e in events[1:-1]} <= {"note_on", "note_off", "note_drop"}
    assert set(result) >= RESPONSE_FIELDS and result["first_note_ms"] > 0
    for sample in result["samples"]:
        streamed, written = apply(events, sample["index"]), midi_notes(sample)
        assert streamed, "the tiny model's continuation has notes"
        assert [n[2:] for n in streamed] == [n[2:] for n in written]  # pitch and velocity, in order
        for s, w in zip(streamed, written, strict=True):
            assert s == pytest.approx(w, abs=1e-3)  # times on the 10 ms grid, written at 960 ticks per beat

    plain = plain_json(client)
    assert midis(plain) == midis(result) and plain["new_tokens"] == result["new_tokens"]


def test_a_seed_left_empty_is_drawn_and_announced_first(client):
    events = events_of(stream(client, seconds="0.5", seed=""))
    assert events[0]["seed"] == events[-1]["seed"] == events[-1]["settings"]["seed"]
    assert isinstance(events[0]["seed"], int)


def drive(client: TestClient, fields: dict, leave: Callable[[list[dict]], bool]) -> tuple[int, list[dict]]:
    """POST a stream straight to the ASGI app, reading its events as they are sent (TestClient buffers the
    whole body); the client goes away once `leave(events so far)` is true. Returns the status and events."""
    request = httpx.Request("POST", f"http://test{PATH}", files={"file": ("m.mid", MOTIF)}, data=fields)
    body = request.read()
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": PATH, "raw_path": PATH.encode(), "query_string": b"", "root_path": "",
        "client": ("127.0.0.1", 1), "server": ("test", 80),
        "headers": [(k.lower().encode(), v.encode()) for k, v in request.headers.items()],
    }  # fmt: skip
    status: list[int] = []
    events: list[dict] = []
    buffer = bytearray()

    async def call() -> None:
        import anyio

        sent = False

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            while not leave(events):
                await anyio.sleep(0.005)
            return {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.start":
                status.append(message["status"])
            elif message["type"] == "http.response.body":
                buffer.extend(message.get("body", b""))
                while b"\n" in buffer:
                    line, _, rest = bytes(buffer).partition(b"\n")
                    buffer[:] = rest
                    events.append(json.loads(line))

        await client.app(scope, receive, send)

    client.portal.call(call)
    return status[0], events


def test_notes_arrive_while_generating_and_leaving_frees_the_rows(tiny_checkpoint):
    gate = Gate()
    batches: list = []

    def decoder(*args, **options):
        batches.append(gate(*args, **options))
        return batches[-1]

    with serve(tiny_checkpoint, decoder=decoder, batch_window_ms=0) as (client, service):
        # 60 s of music asked for; the client leaves at the first note it hears.
        status, events = drive(client, {"seconds": "60", "seed": "3"}, lambda ev: ev[-1:] and
                               ev[-1]["type"] == "note_on")  # fmt: skip
        assert status == 200
        # a few more events may land between the note the client waits for and its leaving (it polls)
        assert events[0]["type"] == "start" and any(e["type"] == "note_on" for e in events)
        assert not any(e["type"] in ("result", "error") for e in events)
        wait_for(lambda: gate.results and gate.results[-1].stopped)
        result = gate.results[-1]
        assert 0 < result.new_tokens < 60 * 20  # stopped long before 60 s of music
        assert batches[-1].rows == [] and service.worker.queue_depth == 0
        assert metric(service, "musicrel_stopped_jobs_total", reason="disconnected") == 1
        assert events_of(stream(client, seconds="0.3"))[-1]["type"] == "result"  # the service carries on


def test_failures_after_the_start_are_error_events(tiny_checkpoint):
    gate = Gate()
    with serve(tiny_checkpoint, decoder=gate, batch_window_ms=0, request_timeout_s=1) as (client, service):
        gate.hold()  # generation never gets past its first step: the deadline passes
        events = events_of(stream(client, seconds="5", seed="1"))
        assert [e["type"] for e in events] == ["start", "error"]
        assert events[-1]["status"] == 504 and events[-1]["error"]["code"] == "timeout"
        wait_for(lambda: metric(service, "musicrel_stopped_jobs_total", reason="deadline") == 1)
        gate.opened.set()
    with serve(tiny_checkpoint, decoder=Broken, raise_errors=False) as (client, _):
        events = events_of(stream(client, seconds="0.3"))  # Broken fails this motif's admission
        assert [e["type"] for e in events] == ["start", "error"]
        error = {"code": "internal", "message": "internal error; it has been logged"}
        assert events[-1] == {"type": "error", "status": 500, "error": error}


@pytest.mark.parametrize(
    ("data", "fields", "status", "code"),
    [
        (b"RIFF\x00\x00\x00\x00WAVEfmt ", {}, 422, "not_midi"),
        (motif(0), {}, 422, "no_notes"),
        (MOTIF, {"seconds": "61"}, 422, "invalid_request"),
        (MOTIF, {"num_samples": "5"}, 422, "invalid_request"),
        (b"", {}, 422, "invalid_request"),
    ],
    ids=["wav", "no-notes", "seconds-over-limit", "samples-over-limit", "empty"],
)
def test_errors_before_the_stream_are_plain_json(client, data, fields, status, code):
    response = stream(client, data, **{"seconds": "0.3", **fields})
    assert response.status_code == status and response.headers["content-type"] == "application/json"
    assert error_of(response)["code"] == code


def test_the_plain_endpoints_limits_apply(tiny_checkpoint):
    with serve(tiny_checkpoint, max_upload_bytes=4096) as (client, service):
        response = stream(client, MOTIF + b"\x00" * 5000, seconds="0.3")
        assert response.status_code == 413 and error_of(response)["code"] == "too_large"
        service.draining = True
        response = stream(client, seconds="0.3")
        assert response.status_code == 503 and error_of(response)["code"] == "draining"

    gate = Gate()
    with serve(tiny_checkpoint, decoder=gate, max_queue=1, max_batch_rows=1, batch_window_ms=0) as pair:
        client, service = pair
        gate.hold()
        held: dict = {}
        first = threading.Thread(target=lambda: held.update(r=stream(client, seconds="0.3", seed="1")))
        first.start()
        assert gate.entered.wait(10)  # the first stream holds the worker's only row...
        second = threading.Thread(target=lambda: held.update(q=stream(client, seconds="0.3", seed="2")))
        second.start()
        wait_for(lambda: service.worker.queue_depth == 1)  # ...the second fills the queue...
        refused = stream(client, seconds="0.3")  # ...so a third is refused before its upload is read
        assert refused.status_code == 429 and error_of(refused)["code"] == "queue_full"
        assert int(refused.headers["retry-after"]) >= 1
        gate.opened.set()
        first.join(30)
        second.join(30)
        assert events_of(held["r"])[-1]["type"] == events_of(held["q"])[-1]["type"] == "result"
        assert metric(service, "musicrel_in_flight") == 0
        label = {"route": PATH, "method": "POST", "status": "200"}
        assert metric(service, "musicrel_http_requests_total", **label) == 2


def test_streams_from_the_engine_process(engine_app):
    client, _ = engine_app
    events = events_of(stream(client, **FIELDS))
    assert events[0]["type"] == "start" and events[-1]["type"] == "result"
    notes = [e for e in events if e["type"] == "note_on"]
    assert {e["sample"] for e in notes} == {0, 1}
    for sample in events[-1]["samples"]:
        assert len(apply(events, sample["index"])) == len(midi_notes(sample)) == sample["notes"]
    assert midis(plain_json(client)) == midis(events[-1])


def test_a_reroll_of_the_same_motif_is_not_parsed_again(app_client, monkeypatch):
    import server.tasks.continuation

    parsed: list = []
    real = server.tasks.continuation.prepare_primer
    monkeypatch.setattr(
        server.tasks.continuation, "prepare_primer", lambda *a, **k: parsed.append(1) or real(*a, **k)
    )
    client = app_client[0]
    again = motif(12)  # not posted by the other tests
    for seed in ("1", "2"):
        assert events_of(stream(client, again, seconds="0.3", seed=seed))[-1]["type"] == "result"
    assert len(parsed) == 1
    assert events_of(stream(client, again, seconds="0.3", primer_seconds="2"))[-1]["type"] == "result"
    assert len(parsed) == 2  # another primer window is another primer
