"""The HTTP API in-process (TestClient): every route, every field bound, every error code, both response
forms (the engine under load: test_engine_load.py)."""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Iterator

import httpx
import pretty_midi
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from musicrel.generation.sampling import SamplingParams
from server.settings import Settings
from tests.server.conftest import (
    FAST,
    MOTIF,
    error_of,
    metric,
    motif,
    post,
    serve,
)

MIDI_CODES = {
    "not_midi", "truncated", "bad_data_byte", "bad_event", "no_notes", "smpte_division", "zero_division",
    "too_large", "too_many_tracks", "too_many_events", "too_long", "no_such_track",
}  # fmt: skip


@pytest.fixture(scope="module")
def app_client(tiny_checkpoint) -> Iterator[tuple[TestClient, object]]:
    with serve(tiny_checkpoint, batch_window_ms=0) as pair:
        yield pair


@pytest.fixture
def client(app_client) -> TestClient:
    return app_client[0]


# ---- routes --------------------------------------------------------------------------------------


def test_health_ready_docs(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    form = spec["paths"]["/v1/continuations"]["post"]
    assert {"413", "422", "429", "503", "504"} <= set(form["responses"])


def test_model_info(client, tiny_checkpoint):
    from musicrel.midi.codec import EventCodec

    info = client.get("/v1/model").json()
    assert info["sha256"] == hashlib.sha256((tiny_checkpoint / "model.safetensors").read_bytes()).hexdigest()
    assert info["vocab_size"] == EventCodec().vocab_size == info["model"]["vocab_size"]
    assert info["model"]["n_layers"] == 1 and info["model"]["d_model"] == 32
    assert info["codec"]["step_ms"] == EventCodec().config.step_ms
    d, v, ff, L = 32, info["vocab_size"], 64, 256
    assert info["parameters"] > v * d + d * ff  # embeddings and the feed-forward block at least
    assert info["limits"]["max_seconds"] == Settings().max_seconds
    assert info["limits"]["defaults"]["top_p"] == SamplingParams().top_p
    assert info["model"]["max_seq_len"] == L


def test_model_info_says_how_the_weights_are_held(client, tiny_checkpoint):
    import pydantic

    # int8 by default, wherever the kernel takes a layer: here the feed-forward's output (64 inputs); under
    # auto the faster of int8 and float32 on this machine (a probe at load), said as held
    assert Settings().weights == "int8" and client.get("/v1/model").json()["weights"] == "int8"
    with serve(tiny_checkpoint, weights="auto") as (probed, _):
        assert probed.get("/v1/model").json()["weights"] in ("int8", "float32")
    with serve(tiny_checkpoint, weights="int8") as (quantized, _):
        assert quantized.get("/v1/model").json()["weights"] == "int8"
    with serve(tiny_checkpoint, weights="float32") as (as_trained, _):
        assert as_trained.get("/v1/model").json()["weights"] == "float32"
        assert post(as_trained, seconds="0.5").status_code == 200
    with pytest.raises(pydantic.ValidationError):
        Settings(weights="int4")


def test_examples_are_served_midi(client):
    examples = client.get("/v1/examples").json()
    assert examples, "server/static/examples holds the bundled motifs"
    for example in examples:
        assert example["url"] == f"/static/examples/{example['file']}"
        response = client.get(example["url"])
        assert response.status_code == 200
        assert pretty_midi.PrettyMIDI(io.BytesIO(response.content)).instruments


def test_root_serves_page_or_points_to_docs(client, tiny_checkpoint, tmp_path):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    with serve(tiny_checkpoint, static_dir=tmp_path, wait_ready=False) as (bare, _):
        assert bare.get("/").json()["docs"] == "/docs"
        assert bare.get("/v1/examples").json() == []
        assert error_of(bare.get("/static/x.js"))["code"] == "not_found"


def test_metrics_exposed(client, app_client):
    service = app_client[1]
    before = metric(service, "musicrel_http_requests_total", route="/healthz", method="GET", status="200")
    client.get("/healthz")
    text = client.get("/metrics").text
    for name in ("musicrel_queue_depth", "musicrel_in_flight", "musicrel_parse_seconds_bucket",
                 "musicrel_queue_seconds_bucket", "musicrel_generation_seconds_bucket",
                 "musicrel_tokens_generated_total"):  # fmt: skip
        assert name in text
    after = metric(service, "musicrel_http_requests_total", route="/healthz", method="GET", status="200")
    assert after == before + 1


def test_unknown_route_and_method_are_json(client):
    assert error_of(client.get("/v2/nothing"))["code"] == "not_found"
    assert error_of(client.put("/healthz"))["code"] == "method_not_allowed"


# ---- continuations: both response forms ----------------------------------------------------------


def test_midi_response(client, app_client):
    service = app_client[1]
    tokens_before = metric(service, "musicrel_tokens_generated_total")
    response = post(client, **FAST)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "audio/midi"
    assert response.headers["x-musicrel-seed"] == "7"
    new_tokens = int(response.headers["x-musicrel-tokens"])
    assert new_tokens > 0
    assert int(response.headers["x-musicrel-primer-tokens"]) > 0
    assert all(f"{k};dur=" in response.headers["server-timing"] for k in ("parse", "queue", "generate"))
    pm = pretty_midi.PrettyMIDI(io.BytesIO(response.content))
    assert pm.get_end_time() <= 0.3 + 0.05
    assert metric(service, "musicrel_tokens_generated_total") == tokens_before + new_tokens
    # The same seed gives the same continuation.
    assert post(client, **FAST).content == response.content


def test_json_response_has_every_sample(client):
    fields = {"num_samples": "2", "include_primer": "true", "seconds": "0.3", "temperature": "0.9"}
    response = post(client, json=True, **fields)
    assert response.status_code == 200, response.text
    body = response.json()
    assert len(body["samples"]) == 2
    assert body["settings"]["seed"] == body["seed"]  # drawn by the server and reported
    assert body["settings"]["num_samples"] == 2 and body["settings"]["temperature"] == 0.9
    assert body["new_tokens"] == sum(s["new_tokens"] for s in body["samples"])
    assert body["primer"]["notes"] == 16 and body["primer"]["tokens"] > 0
    assert set(body["timings"]) >= {"parse_ms", "queue_ms", "generation_ms", "total_ms"}
    for sample in body["samples"]:
        pm = pretty_midi.PrettyMIDI(io.BytesIO(base64.b64decode(sample["midi_base64"])))
        notes = sum(len(i.notes) for i in pm.instruments)
        assert notes == sample["notes"] >= 16  # include_primer: the motif's notes come first
    # A seed reproduces the first request.
    again = post(client, json=True, **fields, seed=str(body["seed"]))
    assert [s["midi_base64"] for s in again.json()["samples"]] == [s["midi_base64"] for s in body["samples"]]


def test_tracks_select_an_instrument(client):
    two = motif(8, programs=(0, 33))
    body = post(client, two, json=True, tracks="1", **FAST).json()
    assert body["primer"]["program"] == 33 and body["primer"]["notes"] == 8
    assert body["settings"]["tracks"] == "1"
    response = post(client, two, tracks="0,5", **FAST)
    assert response.status_code == 422 and error_of(response)["code"] == "no_such_track"


# ---- bounds --------------------------------------------------------------------------------------

OUT_OF_RANGE = [
    ("seconds", "0"), ("seconds", "-1"), ("seconds", "601"), ("seconds", "nan"), ("seconds", "abc"),
    ("seconds", "61"),  # above MUSICREL_MAX_SECONDS (60)
    ("temperature", "0"), ("temperature", "10.5"), ("temperature", "hot"),
    ("top_k", "0"), ("top_k", "4097"), ("top_k", "1.5"), ("top_k", "1000"),  # 1000 > vocabulary
    ("top_p", "0"), ("top_p", "1.01"),
    ("shift_temperature", "0"), ("shift_temperature", "10.5"), ("shift_temperature", "nan"),
    ("seed", "-1"), ("seed", str(2**32)),
    ("num_samples", "0"), ("num_samples", "65"), ("num_samples", "5"),  # above MUSICREL_MAX_NUM_SAMPLES (4)
    ("primer_seconds", "0"), ("primer_seconds", "3601"), ("primer_seconds", "121"),  # above the server max
    ("include_primer", "maybe"),
    ("tracks", "drums"), ("tracks", "0,-1"), ("tracks", "0;1"), ("tracks", "1" * 401), ("tracks", "2000"),
]  # fmt: skip


@pytest.mark.parametrize(("field", "value"), OUT_OF_RANGE)
def test_out_of_range_field_is_422(client, field, value):
    response = post(client, **{field: value})
    assert response.status_code == 422, response.text
    error = error_of(response)
    assert error["code"] == "invalid_request"
    assert error["field"] == field and field in error["message"]


def test_a_shift_temperature_reaches_the_sampler(client):
    """The same seed with the time shifts re-tempered is other music; at 1 it is the default's own.
    (Sharpened: the tiny random model's shifts are near uniform already, and each row's draws are the same
    numbers either way, so flattening them further moved few notes.)"""
    plain = post(client, seed="3", seconds="3")
    assert plain.status_code == 200, plain.text
    assert post(client, seed="3", seconds="3", shift_temperature="1").content == plain.content
    sharpened = post(client, seed="3", seconds="3", shift_temperature="0.25")
    assert sharpened.status_code == 200 and sharpened.content != plain.content


@pytest.mark.parametrize(("value", "limit"), [("1e6", "60"), ("61", "60"), ("601", "60")])
def test_a_field_above_the_servers_limit_is_told_that_limit(client, value, limit):
    """Above the schema's fixed bound (600) the message said "<= 600" while this server stops at 60."""
    error = error_of(post(client, seconds=value))
    assert (
        error["field"] == "seconds" and error["message"] == f"seconds: must be at most {limit} on this server"
    )
    error = error_of(post(client, num_samples="100"))
    assert error["field"] == "num_samples" and "at most 4 on this server" in error["message"]


@pytest.mark.parametrize(
    ("path", "field", "hint"),
    [
        ("/v1/continuations", "temprature", "did you mean temperature?"),
        ("/v1/continuations/stream", "chord", "did you mean chords?"),
        ("/v1/motifs", "seconds", "did you mean primer_seconds?"),
        ("/v1/continuations", "zzz", "fields: "),
    ],
)
def test_an_unknown_form_field_is_refused_by_name(client, path, field, hint):
    """A typo silently did nothing (the continuation ran at the default temperature)."""
    response = client.post(path, files={"file": ("m.mid", MOTIF, "audio/midi")}, data={**FAST, field: "1"}
                           if path != "/v1/motifs" else {field: "1"})  # fmt: skip
    assert response.status_code == 422, response.text
    error = error_of(response)
    assert error["code"] == "invalid_request" and error["field"] == field
    assert error["message"].startswith(f"{field}: no such field") and hint in error["message"]


def test_missing_file_is_422(client):
    response = client.post("/v1/continuations", data={"seconds": "1"})
    assert response.status_code == 422 and error_of(response) | {"message": ""} == {
        "code": "invalid_request", "field": "file", "message": ""
    }  # fmt: skip


def test_blank_optional_fields_mean_default(client):
    response = post(client, top_k="", seed="", seconds="0.3")
    assert response.status_code == 200, response.text
    assert int(response.headers["x-musicrel-seed"]) >= 0


# ---- bad uploads ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"RIFF\x00\x00\x00\x00WAVEfmt ", "not_midi"),
        (MOTIF[: len(MOTIF) // 2], "truncated"),
        (MOTIF[:10], "truncated"),
        (b"MThd\x00\x00\x00\x06\x00\x01\xff\xff\x00\x60", "too_many_tracks"),
        (motif(0), "no_notes"),
        (b"MThd\x00\x00\x00\x06\x00\x00\x00\x01\x01\xe0MTrk\x00\x00\x00\x02\x00\xf1", "truncated"),
    ],
    ids=["wav", "truncated", "header-only", "hostile-track-count", "no-notes", "cut-system-message"],
)
def test_bad_midi_is_422_with_codec_code(client, data, code):
    response = post(client, data, **FAST)
    assert response.status_code == 422
    assert error_of(response)["code"] == code


def test_shared_broken_files(client, broken_midi_files):
    expected = {"empty.mid": "no_notes", "ValueError_Control168.mid": "bad_data_byte"}
    for path in broken_midi_files:
        response = post(client, path.read_bytes(), **FAST)
        assert response.status_code == 422, (path.name, response.text)
        assert error_of(response)["code"] == expected.get(path.name, error_of(response)["code"])
        assert error_of(response)["code"] in MIDI_CODES


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_mangled_uploads_never_500(client, data):
    """Random bytes, truncations and byte flips of a valid file: 200 or 422 with a known code, never a 500."""
    kind = data.draw(st.sampled_from(["random", "truncate", "flip"]))
    if kind == "random":
        blob = data.draw(st.binary(max_size=300))
    elif kind == "truncate":
        blob = MOTIF[: data.draw(st.integers(0, len(MOTIF) - 1))]
    else:
        blob = bytearray(MOTIF)
        for _ in range(data.draw(st.integers(1, 4))):
            blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
        blob = bytes(blob)
    response = post(client, blob, seconds="0.05", seed="1")
    assert response.status_code in (200, 422), response.text
    if response.status_code == 422:
        # An empty file is out of the schema's bounds (minLength 1) rather than bad MIDI.
        expected = {"invalid_request"} if not blob else MIDI_CODES
        assert error_of(response)["code"] in expected
    else:
        pretty_midi.PrettyMIDI(io.BytesIO(response.content))


def test_oversize_upload_is_413_before_parsing(tiny_checkpoint):
    with serve(tiny_checkpoint, max_upload_bytes=4096) as (client, service):
        big = MOTIF + b"\x00" * 5000
        response = post(client, big, **FAST)
        assert response.status_code == 413 and error_of(response)["code"] == "too_large"

        def chunks():  # no Content-Length: the cap counts streamed bytes
            for _ in range(10):
                yield b"x" * 1024

        response = client.post(
            "/v1/continuations", content=chunks(), headers={"content-type": "multipart/form-data; boundary=b"}
        )
        assert "content-length" not in response.request.headers
        assert response.status_code == 413 and error_of(response)["code"] == "too_large"
        assert metric(service, "musicrel_parse_seconds_count") == 0  # nothing reached the MIDI parser
        assert post(client, MOTIF, **FAST).status_code == 200  # under the cap: fine
        assert metric(service, "musicrel_parse_seconds_count") == 1


def test_samples_report_what_they_copied_when_the_checkpoint_ships_a_novelty_index(
    client, tiny_checkpoint, tmp_path
):
    import shutil

    from musicrel.evaluation.novelty import INDEX_FILE, NoveltyIndex

    plain = post(client, json=True, seed=11, seconds=6).json()
    assert plain["samples"][0]["novelty"] is None
    assert client.get("/v1/model").json()["novelty_index"] is None
    # A "training set" holding the sample itself, transposed and later: all of it must be found there.
    notes = pretty_midi.PrettyMIDI(io.BytesIO(base64.b64decode(plain["samples"][0]["midi_base64"])))
    sample = [n for inst in notes.instruments for n in inst.notes]
    planted = [pretty_midi.Note(n.velocity, n.pitch - 3, n.start + 2.0, n.end + 2.0) for n in sample]
    other = [pretty_midi.Note(70, 50 + (5 * k) % 13, 0.3 * k, 0.3 * k + 0.2) for k in range(40)]
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, folder)
    NoveltyIndex.build([("other.mid", other), ("planted.mid", planted)]).save(folder / INDEX_FILE)

    with serve(folder, batch_window_ms=0) as (indexed, _):
        assert indexed.get("/v1/model").json()["novelty_index"] == {"pieces": 2, "notes": 40 + len(sample)}
        again = post(indexed, json=True, seed=11, seconds=6).json()
    assert again["samples"][0]["midi_base64"] == plain["samples"][0]["midi_base64"]
    copy = again["samples"][0]["novelty"]
    assert len(sample) >= 3 and copy["source"] == "planted.mid"
    assert copy["notes"] == len(sample) and copy["occurrences"] == 1


# ---- controls ------------------------------------------------------------------------------------


def test_controls_steer_and_are_echoed(client):
    fields = {"program": "40", "key": "C:major", "key_strength": "only", "chords": "C:0.2 G:0.2",
              "low_note": "55", "high_note": "79", "max_polyphony": "2", "density": "",
              "seconds": "1"}  # fmt: skip
    response = post(client, json=True, seed="3", **fields)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["settings"]["key"] == "C:major" and body["settings"]["program"] == 40
    assert body["settings"]["density"] is None  # blank: unset
    pm = pretty_midi.PrettyMIDI(io.BytesIO(base64.b64decode(body["samples"][0]["midi_base64"])))
    assert pm.instruments[0].program == 40
    in_key = (0, 2, 4, 5, 7, 9, 11)
    assert all(55 <= n.pitch <= 79 and n.pitch % 12 in in_key for n in pm.instruments[0].notes)
    assert any(t.text.startswith("musicrel controls=") for t in pm.text_events)


@pytest.mark.parametrize("name", ["Violin", " violin ", "VIOLIN", "40"])
def test_program_by_general_midi_name_or_number(client, name):
    body = post(client, json=True, program=name, seconds="2", seed="7").json()
    assert body["settings"]["program"] == 40 and body["controls"]["instrument"] == "Violin"
    pm = pretty_midi.PrettyMIDI(io.BytesIO(base64.b64decode(body["samples"][0]["midi_base64"])))
    assert pm.instruments[0].program == 40


def test_the_answer_names_the_instrument_and_why(client):
    """The motif's: the program that plays most of its notes (here a choir line over a piano part)."""
    choir_over_piano = motif(12, programs=(0, 52))  # as many choir notes as piano ones: no clear one
    piano = motif(12, programs=(0,))
    body = post(client, choir_over_piano, json=True, **FAST).json()
    assert (
        body["instrument"]["program"] == 0
        and "no instrument plays more than half" in body["instrument"]["reason"]
    )
    assert body["primer"]["instrument"] == "Acoustic Grand Piano"
    body = post(client, piano, json=True, program="Violin", **FAST).json()
    assert body["instrument"] == {"program": 40, "name": "Violin", "reason": "the program field"}
    assert body["primer"]["program"] == 0 and "plays every note" in body["primer"]["program_reason"]
    prepared = prepare(client, motif(12, programs=(71,))).json()
    assert prepared["primer"]["instrument"] == "Clarinet"


@pytest.mark.parametrize("name", ["Violinn", "Vio lin", "-1"])
def test_an_unknown_program_name_is_422_naming_the_field(client, name):
    response = post(client, program=name, **FAST)
    assert response.status_code == 422 and error_of(response)["field"] == "program", response.text


def test_the_json_answer_says_what_the_controls_applied_and_warns_of_clashes(client):
    fields = {"key": "auto", "chords": "C:0.5 E:0.5", "seconds": "1", "seed": "2"}
    body = post(client, json=True, **fields).json()
    key = body["controls"]["key"]
    assert body["controls"]["key_detected"] is True and ":" in key  # the key `auto` found
    assert [c["chord"] for c in body["controls"]["chords"]] == ["C", "E"]
    assert body["warnings"] and all(w.endswith(f"outside the key {key}") for w in body["warnings"])
    plain = post(client, json=True, **FAST).json()
    assert plain["controls"] is None and plain["warnings"] == []
    calm = post(client, json=True, key="C:major", chords="C:0.5 G:0.5", **FAST).json()
    assert calm["warnings"] == [] and calm["controls"]["key"] == "C:major"


@pytest.mark.parametrize(
    ("fields", "code", "field"),
    [
        ({"chords": "C:1 Q:1"}, "unknown_chord", "chords"),
        ({"chords": "C:-1"}, "invalid_controls", "chords"),
        ({"low_note": "70", "high_note": "60"}, "empty_range", "low_note"),
        ({"key": "C:nope"}, "unknown_key", "key"),
        ({"key_strength": "always", "key": "auto"}, "invalid_controls", "key_strength"),
        ({"chord_strength": "always", "chords": "C"}, "invalid_controls", "chord_strength"),
        ({"instruments": "Violin, kazoo"}, "invalid_controls", "instruments"),
        ({"instruments": "Violin, drums"}, "no_instruments", "instruments"),  # a piano model
    ],
)
def test_bad_control_is_422_with_its_code_and_field(client, fields, code, field):
    """`field` lets the page show the message beside that input."""
    response = post(client, **FAST, **fields)
    assert response.status_code == 422 and error_of(response)["code"] == code, response.text
    assert error_of(response)["field"] == field


def test_bad_control_is_refused_before_the_upload_is_parsed(client):
    """A control wrong whatever the motif is refused even with bytes that are not MIDI (parsing would say
    not_midi): no parse thread is spent on a request that cannot run."""
    response = client.post("/v1/continuations", data={"chords": "H7"}, files={"file": ("x.mid", b"junk")})
    assert response.status_code == 422 and error_of(response)["code"] == "unknown_chord", response.text


def test_model_info_lists_the_general_midi_names_the_page_offers(client):
    from musicrel.generation.controls import gm_program_names

    programs = client.get("/v1/model").json()["programs"]
    assert programs == gm_program_names() and len(programs) == 128
    assert programs[0] == "Acoustic Grand Piano"


@pytest.mark.parametrize(("field", "value"), [("program", "128"), ("low_note", "-1"), ("density", "0"),
                                              ("max_polyphony", "0"), ("chords", "C " * 600)])  # fmt: skip
def test_out_of_range_control_is_422_naming_the_field(client, field, value):
    response = post(client, **{field: value})
    assert response.status_code == 422 and error_of(response)["field"] == field, response.text


# ---- prepared motifs -----------------------------------------------------------------------------


def prepare(client: TestClient, data: bytes, **fields) -> httpx.Response:
    return client.post("/v1/motifs", files={"file": ("motif.mid", data, "audio/midi")}, data=fields)


def test_a_prepared_motif_is_not_parsed_again_by_its_continuations(client, monkeypatch):
    import server.tasks.continuation as continuations

    parses = []
    real = continuations.prepare_primer
    monkeypatch.setattr(continuations, "prepare_primer", lambda *a, **k: parses.append(1) or real(*a, **k))
    data = motif(11)  # bytes no other test sends: not in the parse cache yet
    first = prepare(client, data, primer_seconds="20", tracks="merge")
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["sha256"] == hashlib.sha256(data).hexdigest() and body["cached"] is False
    assert body["prefill_ms"] is not None and body["primer"]["notes"] == 11 and parses == [1]
    again = prepare(client, data, primer_seconds="20").json()
    assert again["cached"] is True and again["prefill_ms"] is None and parses == [1]

    response = post(client, data, json=True, primer_seconds="20", **FAST)
    assert response.status_code == 200 and parses == [1], "the continuation parsed the prepared motif again"
    # Other primer settings are another primer: parsed anew.
    assert post(client, data, primer_seconds="5", **FAST).status_code == 200 and parses == [1, 1]


def test_motif_end_says_where_the_continuation_starts_and_the_answer_says_what_was_read(client):
    data = motif(13)  # onsets every 0.2 s: 0.0 .. 2.4 s
    prepared = prepare(client, data, motif_end="1.1", primer_seconds="0.5").json()["primer"]
    assert prepared["end_time"] == pytest.approx(1.1) and prepared["start_time"] == pytest.approx(0.6)
    assert prepared["requested_seconds"] == 0.5 and prepared["cropped"] is False and prepared["notes"] == 3
    body = post(client, data, json=True, motif_end="1.1", primer_seconds="0.5", **FAST).json()
    assert body["primer"] | {"tokens": 0} == prepared | {"tokens": 0}
    assert body["settings"]["motif_end"] == 1.1
    whole = post(client, data, json=True, **FAST).json()["primer"]  # another primer, not the cached one
    assert whole["end_time"] == pytest.approx(2.58) and whole["start_time"] == 0.0


@pytest.mark.parametrize("value", ["0", "-3", "3601", "nan", "end"])
def test_a_bad_motif_end_is_422_naming_the_field(client, value):
    error = error_of(post(client, motif_end=value, **FAST))
    assert error["code"] == "invalid_request" and error["field"] == "motif_end"


def test_a_motif_end_before_the_first_note_is_no_notes(client):
    late = io.BytesIO()
    pm = pretty_midi.PrettyMIDI()
    pm.instruments.append(pretty_midi.Instrument(program=0))
    pm.instruments[0].notes.append(pretty_midi.Note(80, 60, 5.0, 6.0))
    pm.write(late)
    response = post(client, late.getvalue(), motif_end="2", **FAST)
    assert response.status_code == 422 and error_of(response)["code"] == "no_notes", response.text


@pytest.mark.parametrize(
    ("data", "fields", "code", "field"),
    [
        (b"", {}, "invalid_request", "file"),
        (b"not a midi file", {}, "not_midi", None),
        (MOTIF, {"primer_seconds": "0"}, "invalid_request", "primer_seconds"),
        (MOTIF, {"tracks": "piano"}, "invalid_request", "tracks"),
    ],
)
def test_preparing_a_bad_motif_is_a_typed_422(client, data, fields, code, field):
    response = prepare(client, data, **fields)
    assert response.status_code == 422, response.text
    assert error_of(response)["code"] == code and error_of(response).get("field") == field


def test_the_motifs_route_is_in_the_openapi_schema(client):
    operation = client.get("/openapi.json").json()["paths"]["/v1/motifs"]["post"]
    assert operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/PreparedMotif"
    )
    assert {"413", "422", "429", "503"} <= set(operation["responses"])


def test_every_form_route_documents_the_rules_its_fields_are_checked_by(client):
    """A form documented looser than it is checked is what the API fuzz reports as a valid request refused
    (a random `tracks` string on /v1/motifs, before its form was tailored like the continuations')."""
    from server.openapi import TRACKS_PATTERN

    spec = client.get("/openapi.json").json()
    for path in ("/v1/continuations", "/v1/continuations/stream", "/v1/motifs"):
        ref = spec["paths"][path]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]["$ref"]
        fields = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"]
        assert fields["tracks"]["pattern"] == TRACKS_PATTERN, path
        assert fields["primer_seconds"]["maximum"] <= Settings().max_primer_seconds, path
        assert "file" in fields, path
        assert spec["components"]["schemas"][ref.rsplit("/", 1)[1]]["additionalProperties"] is False
    import re

    program = spec["components"]["schemas"]["Body_create_continuation_v1_continuations_post"]["properties"][
        "program"
    ]
    number, name = program["anyOf"]
    assert number["maximum"] == 127 and number["type"] == "integer"
    assert re.match(name["pattern"], " violin ") and re.match(name["pattern"], "fx 1 (RAIN)")
    assert not re.match(name["pattern"], "Violinn") and not re.match(name["pattern"], "40")


def test_model_info_links_the_card_and_serves_it_at_its_own_url(client, tiny_checkpoint, tmp_path):
    """/v1/model describes in short: no card inline, a link to it (null without one), and the card is served
    at its own URL as Markdown; 404 JSON without a card or for a model the server has not."""
    import shutil

    info = client.get("/v1/model").json()
    assert "card" not in info and info["card_url"] is None  # the tiny checkpoint has no MODEL_CARD.md
    missing = client.get("/v1/model/card")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "no_card"
    unknown = client.get("/v1/model/drums/card")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "no_such_model"
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, folder)
    text = "# A tiny model\n\nIt continues motifs, badly. ♪\n"
    (folder / "MODEL_CARD.md").write_text(text)
    with serve(folder, batch_window_ms=0) as (carded, _):
        info = carded.get("/v1/model").json()
        assert "card" not in info and info["card_url"] == "/v1/model/card"
        for url in (info["card_url"], "/v1/model/continuation/card"):
            card = carded.get(url)
            assert card.status_code == 200 and card.text == text
            assert card.headers["content-type"].startswith("text/markdown")
        assert len(carded.get("/v1/model").content) < 10_000  # a summary, whatever the card's size
