"""POST /v1/accompaniments in-process (TestClient) with a tiny random accompaniment model: both answer forms,
the melody kept as it was, reproducible seeds, every error of the melody with its status, the 503 without a
model, the form's bounds, admission and metrics."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Iterator

import httpx
import pretty_midi
import pytest
from fastapi.testclient import TestClient

from musicrel.generation.accompaniment import ACCOMPANIMENT_NAME
from tests.server.conftest import error_of, metric, serve, wait_for

FIELDS = {"seed": "7"}


def melody(
    n: int = 12, step: float = 0.4, chords: bool = False, tracks: int = 1, drums: bool = False
) -> bytes:
    """A rising and falling tune on track 0; more tracks (a bass line) when asked; `chords`: a triad at
    every onset instead of one note; `drums`: only a drum track."""
    pm = pretty_midi.PrettyMIDI(initial_tempo=100)
    tune = pretty_midi.Instrument(program=73, name="MELODY", is_drum=drums)
    for k in range(n):
        start = 0.5 + k * step
        for interval in (0, 4, 7) if chords else (0,):
            tune.notes.append(pretty_midi.Note(90, 64 + (k * 5) % 12 + interval, start, start + 0.3))
    pm.instruments.append(tune)
    for t in range(1, tracks):
        bass = pretty_midi.Instrument(program=32 + t, name=f"BASS{t}")
        bass.notes = [pretty_midi.Note(70, 40 + t, 0.5 + k * 0.8, 1.2 + k * 0.8) for k in range(n // 2)]
        pm.instruments.append(bass)
    buffer = io.BytesIO()
    pm.write(buffer)
    return buffer.getvalue()


MELODY = melody()


def post(client: TestClient, data: bytes = MELODY, json: bool = False, **fields) -> httpx.Response:
    headers = {"accept": "application/json"} if json else {}
    return client.post(
        "/v1/accompaniments",
        files={"file": ("melody.mid", data, "audio/midi")},
        data={**FIELDS, **fields},
        headers=headers,
    )


def notes_of(inst: pretty_midi.Instrument) -> list[tuple]:
    return [(n.pitch, round(n.start, 3), round(n.end, 3), n.velocity) for n in inst.notes]


def read(data: bytes) -> pretty_midi.PrettyMIDI:
    return pretty_midi.PrettyMIDI(io.BytesIO(data))


@pytest.fixture(scope="module")
def client(tiny_checkpoint, tiny_accompany_checkpoint) -> Iterator[tuple[TestClient, object]]:
    with serve(
        tiny_checkpoint,
        accompany_checkpoint=tiny_accompany_checkpoint,
        batch_window_ms=0,
        max_melody_seconds=30,
    ) as pair:
        yield pair


# ---------------------------------------------------------------- answers
def test_midi_answer_keeps_the_melody_and_adds_the_accompaniment_track(client):
    c, _ = client
    r = post(c)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "audio/midi"
    assert r.headers["x-musicrel-seed"] == "7"
    assert r.headers["x-musicrel-melody-track"] == "0"
    assert 'filename="accompaniment-7.mid"' in r.headers["content-disposition"]
    assert "generate;dur=" in r.headers["server-timing"]
    out, given = read(r.content), read(MELODY)
    assert [i.name for i in out.instruments] == ["MELODY", ACCOMPANIMENT_NAME]
    assert out.instruments[0].program == 73 and out.instruments[1].program == 0  # piano by default
    assert notes_of(out.instruments[0]) == notes_of(given.instruments[0])  # the melody, unchanged
    accompaniment = out.instruments[1].notes
    assert accompaniment, "the random tiny model wrote no note at all"
    assert int(r.headers["x-musicrel-notes"]) == len(accompaniment)
    # It follows the melody: nothing after the melody's end and the library's 1 s tail.
    assert max(n.end for n in accompaniment) <= given.get_end_time() + 1.0 + 0.5


def test_json_answer_has_every_sample_and_a_seed_that_repeats(client):
    c, _ = client
    r = post(c, json=True, num_samples="2", seed="11", program="Acoustic Bass")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["seed"] == 11 and body["melody_track"] == 0 and body["melody_notes"] == 12
    assert body["settings"]["track"] == 0 and body["settings"]["program"] == 32
    assert body["instrument"] == "Acoustic Bass"
    assert body["seconds"] > 0 and body["real_time_factor"] > 0
    assert set(body["timings"]) == {"parse_ms", "queue_ms", "generation_ms", "total_ms"}
    assert [s["index"] for s in body["samples"]] == [0, 1]
    files = [base64.b64decode(s["midi_base64"]) for s in body["samples"]]
    for sample, data in zip(body["samples"], files, strict=True):
        pm = read(data)
        assert [i.name for i in pm.instruments] == ["MELODY", ACCOMPANIMENT_NAME]
        assert pm.instruments[1].program == 32
        assert sample["notes"] == len(pm.instruments[1].notes)
    assert files[0] != files[1], "two samples of one request should differ"
    again = post(c, json=True, num_samples="2", seed="11", program="Acoustic Bass").json()
    assert [s["midi_base64"] for s in again["samples"]] == [s["midi_base64"] for s in body["samples"]]
    # Sample 0 of a batch is the single answer of the same seed (per-row seeds, as a continuation's).
    single = post(c, seed="11", program="32")
    assert single.content == files[0]


def test_the_track_field_picks_the_melody_of_a_file_with_several(client):
    c, _ = client
    data = melody(tracks=3)
    r = post(c, data, json=True, track="0")
    assert r.status_code == 200, r.text
    out = read(base64.b64decode(r.json()["samples"][0]["midi_base64"]))
    assert [i.name for i in out.instruments] == ["MELODY", ACCOMPANIMENT_NAME]  # the others left out
    r = post(c, data, track="2")
    assert r.status_code == 200 and r.headers["x-musicrel-melody-track"] == "2"
    assert read(r.content).instruments[0].name == "BASS2"


def test_controls_are_applied_and_reported(client):
    c, _ = client
    r = post(c, json=True, key="auto", low_note="48", high_note="60", key_strength="only")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["controls"]["key_detected"] is True and body["controls"]["key"]
    part = read(base64.b64decode(body["samples"][0]["midi_base64"])).instruments[1].notes
    assert all(48 <= n.pitch <= 60 for n in part)


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("data", "fields", "code", "field"),
    [
        (melody(tracks=2), {}, "which_track", "track"),
        (MELODY, {"track": "5"}, "no_such_track", "track"),
        (melody(chords=True), {}, "melody_has_chords", "track"),
        (melody(drums=True), {}, "no_notes", None),
        (melody(n=100, step=0.4), {}, "too_long", None),  # 40 s, above this app's 30 s
        (b"not a midi file at all", {}, "not_midi", None),
    ],
)
def test_a_melody_it_cannot_accompany_is_a_clear_422(client, data, fields, code, field):
    c, _ = client
    r = post(c, data, **fields)
    assert r.status_code == 422, r.text
    error = error_of(r)
    assert error["code"] == code
    assert error.get("field") == field


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"seeed": "1"}, "seeed"),
        ({"seconds": "10"}, "seconds"),  # a continuation's field: not one of this form's
        ({"temperature": "0"}, "temperature"),
        ({"temperature": "nan"}, "temperature"),
        ({"num_samples": "5"}, "num_samples"),  # above MUSICREL_MAX_NUM_SAMPLES (4)
        ({"track": "-1"}, "track"),
        ({"program": "Kazoo Deluxe"}, "program"),
        ({"low_note": "70", "high_note": "60"}, "low_note"),
        ({"chords": "H:2"}, "chords"),
    ],
)
def test_bad_fields_are_422_naming_the_field(client, fields, field):
    c, _ = client
    r = post(c, **fields)
    assert r.status_code == 422, r.text
    assert error_of(r)["field"] == field


def test_an_empty_upload_is_422(client):
    c, _ = client
    r = post(c, b"")
    assert r.status_code == 422 and error_of(r)["field"] == "file"


def test_without_a_model_the_route_is_503_and_the_model_info_says_so(tiny_checkpoint, tmp_path):
    with serve(tiny_checkpoint, accompany_checkpoint=tmp_path / "nothing") as (c, _):
        r = post(c)
        assert r.status_code == 503, r.text
        assert error_of(r)["code"] == "no_accompaniment_model"
        assert c.get("/v1/model").json()["accompaniment"] is None
        assert post(c, b"").status_code == 503  # refused before the upload is looked at
        # The continuation routes are untouched by the missing model.
        continued = c.post("/v1/continuations", files={"file": ("m.mid", MELODY)}, data={"seconds": "0.3"})
        assert continued.status_code == 200, continued.text


def test_a_checkpoint_without_melody_tokens_is_not_served(tiny_checkpoint):
    with serve(tiny_checkpoint, accompany_checkpoint=tiny_checkpoint) as (c, _):
        r = post(c)
        assert r.status_code == 503 and error_of(r)["code"] == "no_accompaniment_model"
        assert "melody tokens" in error_of(r)["message"]


def test_model_info_describes_the_accompaniment_model(client, tiny_accompany_checkpoint):
    c, _ = client
    info = c.get("/v1/model").json()["accompaniment"]
    assert info["checkpoint"] == str(tiny_accompany_checkpoint)
    assert info["max_melody_seconds"] == 30 and info["parameters"] > 0 and len(info["sha256"]) == 64


def test_past_the_deadline_is_504(tiny_checkpoint, tiny_accompany_checkpoint):
    with serve(tiny_checkpoint, accompany_checkpoint=tiny_accompany_checkpoint, request_timeout_s=0.05) as (
        c,
        service,
    ):
        r = post(c, melody(n=60, step=0.4))  # 24 s of melody: well over 50 ms on the tiny model
        assert r.status_code == 504, r.text
        assert error_of(r)["code"] == "timeout"
        assert service.admission.admitted == 0  # the ticket went back


# ---------------------------------------------------------------- admission, metrics, docs
def test_counted_in_flight_and_refused_while_draining(client):
    c, service = client
    before = metric(
        service, "musicrel_http_requests_total", route="/v1/accompaniments", method="POST", status="200"
    )
    assert post(c).status_code == 200
    after = metric(
        service, "musicrel_http_requests_total", route="/v1/accompaniments", method="POST", status="200"
    )
    assert after == before + 1
    assert service.in_flight == 0 and service.admission.admitted == 0
    service.draining = True
    try:
        r = post(c)
        assert r.status_code == 503 and error_of(r)["code"] == "draining"
    finally:
        service.draining = False


def test_upload_limit_applies(tiny_checkpoint, tiny_accompany_checkpoint):
    with serve(tiny_checkpoint, accompany_checkpoint=tiny_accompany_checkpoint, max_upload_bytes=1024) as (
        c,
        _,
    ):
        r = post(c, melody(n=200))
        assert r.status_code == 413 and error_of(r)["code"] == "too_large"


def test_openapi_documents_the_form(client):
    c, _ = client
    document = c.get("/openapi.json").json()
    operation = document["paths"]["/v1/accompaniments"]["post"]
    assert {"200", "422", "503"} <= set(operation["responses"])
    assert "no_accompaniment_model" in operation["responses"]["503"]["description"]
    ref = operation["requestBody"]["content"]["multipart/form-data"]["schema"]["$ref"].rsplit("/", 1)[1]
    body = document["components"]["schemas"][ref]
    assert body["additionalProperties"] is False
    assert {"file", "track", "seed", "program", "key", "chords", "max_polyphony"} <= set(body["properties"])
    assert "seconds" not in body["properties"] and "primer_seconds" not in body["properties"]
    assert body["properties"]["num_samples"]["maximum"] == 4


# ---------------------------------------------------------------- through the engine
def test_the_engine_process_accompanies_and_the_server_process_holds_no_weights(client, engine_app):
    thread_client, _ = client
    expected = post(thread_client, json=True, num_samples="2", seed="5").json()
    c, service = engine_app
    r = post(c, json=True, num_samples="2", seed="5")
    assert r.status_code == 200, r.text
    assert service.loaded is None and service.accompanist is None  # cards and codecs only
    assert c.get("/v1/model").json()["accompaniment"]["parameters"] > 0
    assert [s["midi_base64"] for s in r.json()["samples"]] == [s["midi_base64"] for s in expected["samples"]]


def test_a_full_queue_refuses_an_accompaniment_with_429(tiny_checkpoint, tiny_accompany_checkpoint):
    from tests.server.conftest import FAST, Gate
    from tests.server.conftest import post as post_continuation

    gate = Gate()
    with serve(
        tiny_checkpoint,
        decoder=gate,
        accompany_checkpoint=tiny_accompany_checkpoint,
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
        wait_for(lambda: service.worker.queue_depth == 1)  # ... an accompaniment waits in its queue ...
        refused = post(c)  # ... and the next one is turned away at once
        assert refused.status_code == 429 and error_of(refused)["code"] == "queue_full"
        assert int(refused.headers["retry-after"]) >= 1
        gate.opened.set()
        holding.join(30)
        queued.join(30)
        assert answers["first"].status_code == 200 and answers["second"].status_code == 200
        assert float(answers["second"].headers["x-musicrel-timing-queue-ms"]) > 0


def test_a_continuation_does_not_wait_for_long_accompaniments(tiny_checkpoint, tiny_accompany_checkpoint):
    """Two long accompaniments in flight: a short continuation is answered while both still run (they step
    beside the batch, in turn, not one after another before it)."""
    from tests.server.conftest import post as post_continuation

    with serve(
        tiny_checkpoint,
        accompany_checkpoint=tiny_accompany_checkpoint,
        batch_window_ms=0,
        max_melody_seconds=600,
    ) as (c, service):
        # 40 s of melody: hundreds of steps each, where the continuation takes tens
        long_tune = melody(n=100, step=0.4)
        answers: list = []
        threads = [threading.Thread(target=lambda: answers.append(post(c, long_tune))) for _ in range(2)]
        for t in threads:
            t.start()
        wait_for(lambda: len(service.worker._side) == 2, 30)
        continued = post_continuation(c, json=True, seconds="0.5", seed="3")
        assert continued.status_code == 200, continued.text
        assert len(service.worker._side) == 2 and not answers  # both accompaniments still running
        for t in threads:
            t.join(120)
        assert [a.status_code for a in answers] == [200, 200]


def test_an_accompaniment_past_its_deadline_is_stopped_in_the_engine(
    tiny_checkpoint, tiny_accompany_checkpoint
):
    with serve(
        tiny_checkpoint,
        accompany_checkpoint=tiny_accompany_checkpoint,
        engine="process",
        request_timeout_s=1.0,
        max_melody_seconds=600,
    ) as (c, service):
        r = post(c, melody(n=600, step=0.4))  # 240 s of melody: seconds of decoding on the tiny model
        assert r.status_code == 504 and error_of(r)["code"] == "timeout", r.text
        wait_for(lambda: metric(service, "musicrel_stopped_jobs_total", reason="deadline") == 1, 30)
        assert service.worker.queue_depth == 0 and service.admission.admitted == 0
        assert post(c).status_code == 200  # the engine carries on


def test_a_client_that_leaves_stops_its_accompaniment_in_the_engine(engine_app):
    from tests.server.conftest import post_then_leave

    c, service = engine_app  # the client checked every 20 ms, 600 s of melody allowed

    def started() -> bool:
        return any(job.started_at for job in list(service.worker._jobs.values()))

    before = metric(service, "musicrel_stopped_jobs_total", reason="disconnected")
    long_tune = melody(n=600, step=0.4)  # 240 s of melody: no deadline is near when the client leaves
    messages = post_then_leave(c, {}, started, path="/v1/accompaniments", data=long_tune)
    assert messages[0]["status"] == 499
    wait_for(lambda: metric(service, "musicrel_stopped_jobs_total", reason="disconnected") == before + 1, 30)
    assert post(c).status_code == 200  # the engine carries on


def test_a_model_with_instruments_accompanies_on_a_track_per_instrument(tiny_checkpoint, tmp_path):
    """An instruments model as the accompaniment model: the melody track comes back note for note, the
    instruments it writes on tracks of their own, `instruments` chooses them, `program` is refused."""
    import base64
    import io

    import pretty_midi

    from musicrel.model.checkpoint import save_model
    from tests.musicrel.generation.test_continuation_tracks import CODEC, instruments_model

    save_model(instruments_model(max_seq_len=128), tmp_path / "band", codec=CODEC)
    pm = pretty_midi.PrettyMIDI(initial_tempo=100)
    piano = pretty_midi.Instrument(program=0, name="Piano")
    piano.notes = [pretty_midi.Note(60, 48 + k % 5, 0.5 * k, 0.5 * k + 0.4) for k in range(8)]
    voice = pretty_midi.Instrument(program=68, name="Voice")
    voice.notes = [pretty_midi.Note(90, 67 + k % 5, 0.5 * k + 0.1, 0.5 * k + 0.4) for k in range(8)]
    pm.instruments += [piano, voice]
    buffer = io.BytesIO()
    pm.write(buffer)
    data = buffer.getvalue()
    with serve(tiny_checkpoint, accompany_checkpoint=tmp_path / "band") as (c, _):
        r = post(c, data, json=True, track="1", seed="3", instruments="Cello")
        assert r.status_code == 200, r.text
        body = r.json()
        out = pretty_midi.PrettyMIDI(io.BytesIO(base64.b64decode(body["samples"][0]["midi_base64"])))
        voice_back, *others = out.instruments
        assert (voice_back.name, voice_back.program) == ("Voice", 68)
        given = pretty_midi.PrettyMIDI(io.BytesIO(data)).instruments[1].notes
        assert [(n.pitch, n.start, n.end) for n in voice_back.notes] == [
            (n.pitch, n.start, n.end) for n in given
        ]
        assert all((t.name, t.program) == ("Cello", 42) for t in others)
        assert body["instrument"] in ("Cello", "none") and body["controls"]["instruments"] == ["Cello"]
        refused = post(c, data, track="1", program="40")
        assert refused.status_code == 422 and error_of(refused)["code"] == "program_with_instruments"
        alone = post(c, data, track="1", instruments="Oboe")  # the voice's own program: nothing to write
        assert alone.status_code == 422 and error_of(alone)["code"] == "only_the_melodys_instrument"
        named = post(c, data, json=True, track="1", seed="3", instruments="Oboe, Cello")
        assert named.status_code == 200, named.text
        assert any("Oboe plays the melody" in w for w in named.json()["warnings"])
        assert named.json()["controls"]["instruments"] == ["Cello"]  # what was written
