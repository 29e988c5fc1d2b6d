"""The seed round trip on every route: the seed a seedless request reports (header, JSON, stream event) is in
the one range every seed field accepts (musicrel.generation.sampling.SEED_RANGE), and sending it back gives
the same music. The range's edges are accepted and refused alike on every route."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from musicrel.generation.sampling import MAX_SEED
from tests.server.conftest import MOTIF, error_of, serve
from tests.server.test_accompaniments import MELODY
from tests.server.test_infills import TUNE

CONTINUATION = {"seconds": "0.5", "num_samples": "2"}
ACCOMPANIMENT = {"num_samples": "2"}
INFILL = {"start": "5", "end": "7", "num_samples": "2"}


@pytest.fixture(scope="module")
def client(tiny_checkpoint, tiny_accompany_checkpoint, tiny_infill_checkpoint) -> Iterator[TestClient]:
    with serve(
        tiny_checkpoint,
        accompany_checkpoint=tiny_accompany_checkpoint,
        infill_checkpoint=tiny_infill_checkpoint,
        batch_window_ms=0,
        max_melody_seconds=30,
    ) as (client, _):
        yield client


def continuation(client: TestClient, json_: bool = False, **fields: str) -> httpx.Response:
    headers = {"accept": "application/json"} if json_ else {}
    files = {"file": ("motif.mid", MOTIF, "audio/midi")}
    response = client.post("/v1/continuations", files=files, data={**CONTINUATION, **fields}, headers=headers)
    assert response.status_code == 200, response.text
    return response


def stream(client: TestClient, **fields: str) -> list[dict]:
    files = {"file": ("motif.mid", MOTIF, "audio/midi")}
    response = client.post("/v1/continuations/stream", files=files, data={**CONTINUATION, **fields})
    assert response.status_code == 200, response.text
    events = [json.loads(line) for line in response.text.splitlines()]
    assert events[0]["type"] == "start" and events[-1]["type"] == "result", events[-1]
    assert int(response.headers["x-musicrel-seed"]) == events[0]["seed"]
    return events


def accompaniment(client: TestClient, json_: bool = False, **fields: str) -> httpx.Response:
    headers = {"accept": "application/json"} if json_ else {}
    files = {"file": ("melody.mid", MELODY, "audio/midi")}
    response = client.post(
        "/v1/accompaniments", files=files, data={**ACCOMPANIMENT, **fields}, headers=headers
    )
    assert response.status_code == 200, response.text
    return response


def infill(client: TestClient, json_: bool = False, **fields: str) -> httpx.Response:
    headers = {"accept": "application/json"} if json_ else {}
    files = {"file": ("tune.mid", TUNE, "audio/midi")}
    response = client.post("/v1/infills", files=files, data={**INFILL, **fields}, headers=headers)
    assert response.status_code == 200, response.text
    return response


def infill_stream(client: TestClient, **fields: str) -> list[dict]:
    files = {"file": ("tune.mid", TUNE, "audio/midi")}
    response = client.post("/v1/infills/stream", files=files, data={**INFILL, **fields})
    assert response.status_code == 200, response.text
    events = [json.loads(line) for line in response.text.splitlines()]
    assert events[0]["type"] == "start" and events[-1]["type"] == "result", events[-1]
    assert int(response.headers["x-musicrel-seed"]) == events[0]["seed"]
    return events


def in_range(seed: int) -> int:
    assert isinstance(seed, int) and 0 <= seed <= MAX_SEED, seed
    return seed


def midis(body: dict) -> list[bytes]:
    return [base64.b64decode(s["midi_base64"]) for s in body["samples"]]


def test_a_continuations_reported_seed_header_repeats_its_midi(client):
    first = continuation(client)
    seed = in_range(int(first.headers["x-musicrel-seed"]))
    again = continuation(client, seed=str(seed))
    assert again.headers["x-musicrel-seed"] == str(seed)
    assert again.content == first.content


def test_a_continuations_reported_json_seed_repeats_every_sample(client):
    first = continuation(client, json_=True).json()
    seed = in_range(first["seed"])
    assert first["settings"]["seed"] == seed
    again = continuation(client, json_=True, seed=str(seed)).json()
    assert again["seed"] == seed and midis(again) == midis(first)


def per_sample(events: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for event in events:
        out.setdefault(event["sample"], []).append(event)
    return out


def test_a_streams_announced_seed_repeats_the_stream(client):
    first = stream(client)
    seed = in_range(first[0]["seed"])
    assert first[-1]["seed"] == seed
    again = stream(client, seed=str(seed))
    assert again[0]["seed"] == seed
    # Every note event of each sample, in order. How the samples' events interleave depends on when the
    # engine's progress updates cross the pipe (timing), not on the seed.
    assert per_sample(again[1:-1]) == per_sample(first[1:-1])
    assert midis(again[-1]) == midis(first[-1])
    # The plain route gives the same music for the seed the stream drew.
    assert midis(continuation(client, json_=True, seed=str(seed)).json()) == midis(first[-1])


def test_an_accompaniments_reported_json_seed_repeats_every_sample(client):
    first = accompaniment(client, json_=True).json()
    seed = in_range(first["seed"])
    assert first["settings"]["seed"] == seed
    again = accompaniment(client, json_=True, seed=str(seed)).json()
    assert again["seed"] == seed and midis(again) == midis(first)


def test_an_accompaniments_reported_seed_header_repeats_its_midi(client):
    first = accompaniment(client)
    seed = in_range(int(first.headers["x-musicrel-seed"]))
    assert accompaniment(client, seed=str(seed)).content == first.content


def test_an_infills_reported_json_seed_repeats_every_sample(client):
    first = infill(client, json_=True).json()
    seed = in_range(first["seed"])
    assert first["settings"]["seed"] == seed
    again = infill(client, json_=True, seed=str(seed)).json()
    assert again["seed"] == seed and midis(again) == midis(first)


def test_an_infills_reported_seed_header_repeats_its_midi(client):
    first = infill(client)
    seed = in_range(int(first.headers["x-musicrel-seed"]))
    again = infill(client, seed=str(seed))
    assert again.headers["x-musicrel-seed"] == str(seed) and again.content == first.content


def test_an_infill_streams_announced_seed_repeats_the_stream(client):
    first = infill_stream(client)
    seed = in_range(first[0]["seed"])
    assert first[-1]["seed"] == seed
    again = infill_stream(client, seed=str(seed))
    assert again[0]["seed"] == seed
    assert per_sample(again[1:-1]) == per_sample(first[1:-1])
    assert midis(again[-1]) == midis(first[-1])
    assert midis(infill(client, json_=True, seed=str(seed)).json()) == midis(first[-1])


ROUTE_INPUTS = {
    "/v1/continuations": (MOTIF, CONTINUATION),
    "/v1/continuations/stream": (MOTIF, CONTINUATION),
    "/v1/accompaniments": (MELODY, ACCOMPANIMENT),
    "/v1/infills": (TUNE, INFILL),
    "/v1/infills/stream": (TUNE, INFILL),
}


@pytest.mark.parametrize("route", list(ROUTE_INPUTS))
def test_the_range_is_the_same_on_every_route(client, route):
    data, fields = ROUTE_INPUTS[route]
    files = {"file": ("in.mid", data, "audio/midi")}
    fields = {**fields, "num_samples": "1"}
    top = client.post(route, files=files, data={**fields, "seed": str(MAX_SEED)})
    assert top.status_code == 200, top.text
    assert top.headers["x-musicrel-seed"] == str(MAX_SEED)
    past = client.post(route, files=files, data={**fields, "seed": str(MAX_SEED + 1)})
    assert past.status_code == 422 and error_of(past)["field"] == "seed"
