"""A piano server with an instruments model (MUSICREL_INSTRUMENTS_CHECKPOINT; the rule: `wants_instruments`
of musicrel.midi.instruments): an upload the piano models would flatten (drums, or more than one instrument in
the tracks read) is continued and filled by the instruments model, each instrument on its own track, the same
notes as the library's run of that model; a piano upload stays on the piano models; the controls decide where
they ask (`program`: one instrument, the piano model; `instruments`: others, the instruments model);
/v1/model describes it; without one, every upload goes to the continuation model as before."""

from __future__ import annotations

import base64
import io
import json

import pretty_midi
import pytest

from musicrel.generation.continuation import continue_midi
from musicrel.generation.infill import infill
from musicrel.generation.span import InfillParams
from tests.musicrel.generation.test_continuation_tracks import (
    ENSEMBLES,
    as_bytes,
    layout,
    many_instruments,
    program_change_inside_a_track,
    quartet,
)
from tests.musicrel.generation.test_infill_tracks import (
    BAND,
    END,
    START,
    check_only_chosen_changed,
    three_tracks,
    tiny,
)
from tests.server.conftest import MOTIF, error_of, metric, serve

FIELDS = {"seconds": "1.5", "seed": "3", "num_samples": "2"}
SPAN = {"start": str(START), "end": str(END), "seed": "6", "num_samples": "2"}


@pytest.fixture(scope="module")
def band_checkpoint(tmp_path_factory):
    """A tiny random model with instruments and infill tokens, saved as a checkpoint."""
    from musicrel.model.checkpoint import save_model

    folder = tmp_path_factory.mktemp("tiny_instruments_route")
    save_model(tiny(BAND), folder, codec=BAND)
    return folder


@pytest.fixture(scope="module")
def served(tiny_checkpoint, tiny_accompany_checkpoint, tiny_infill_checkpoint, band_checkpoint):
    """Piano continuation, accompaniment and infill models, and the instruments model beside them (float32:
    the library's run of the same weights gives the same notes)."""
    with serve(
        tiny_checkpoint,
        accompany_checkpoint=tiny_accompany_checkpoint,
        infill_checkpoint=tiny_infill_checkpoint,
        instruments_checkpoint=band_checkpoint,
        weights="float32",
        batch_window_ms=0,
    ) as (client, service):
        yield client, service


def post(client, data: bytes, path: str = "/v1/continuations", **fields):
    return client.post(
        path,
        files={"file": ("music.mid", data, "audio/midi")},
        data=fields,
        headers={"accept": "application/json"},
    )


def midi_of(sample: dict) -> pretty_midi.PrettyMIDI:
    return pretty_midi.PrettyMIDI(io.BytesIO(base64.b64decode(sample["midi_base64"])))


def notes_of(pm: pretty_midi.PrettyMIDI) -> list[list[tuple]]:
    return [[(n.pitch, n.velocity, n.start, n.end) for n in i.notes] for i in pm.instruments]


def as_file(pm: pretty_midi.PrettyMIDI) -> pretty_midi.PrettyMIDI:
    """A PrettyMIDI made in memory as a file of it reads back (the server answers with files)."""
    return pretty_midi.PrettyMIDI(io.BytesIO(as_bytes(pm)))


@pytest.mark.parametrize("name", sorted(ENSEMBLES))
def test_an_ensemble_is_continued_by_the_instruments_model_as_the_library_does(served, band_checkpoint, name):
    client, _ = served
    upload = ENSEMBLES[name]()
    data = as_bytes(upload)
    response = post(client, data, **FIELDS, include_primer="true")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "instruments"
    assert [(t["name"], t["program"], t["drum"]) for t in body["tracks"]] == layout(upload)
    from musicrel.model.checkpoint import load_codec, load_model

    model, codec = load_model(band_checkpoint, weights="float32"), load_codec(band_checkpoint)
    library = continue_midi(model, data, codec=codec, seconds=1.5, seed=3, num_samples=2, include_primer=True)
    for sample, expected in zip(body["samples"], library, strict=True):
        pm = midi_of(sample)
        assert layout(pm)[: len(upload.instruments)] == layout(upload)
        assert notes_of(pm) == notes_of(as_file(expected))


def test_seventeen_instruments_and_a_program_change_inside_a_track_go_to_the_instruments_model(served):
    client, _ = served
    many = post(client, as_bytes(many_instruments(17)), **FIELDS)
    assert many.status_code == 200, many.text
    assert many.json()["model"] == "instruments" and len(many.json()["tracks"]) == 18
    # one track, two programs: two instruments, as pretty_midi reads it
    winds = post(client, program_change_inside_a_track(), **FIELDS)
    assert winds.status_code == 200, winds.text
    assert winds.json()["model"] == "instruments"
    assert [(t["name"], t["program"]) for t in winds.json()["tracks"]] == [("Winds", 73), ("Winds", 68)]


def test_the_instruments_models_tokens_are_counted_in_the_metrics(served):
    client, service = served
    before = metric(service, "musicrel_tokens_generated_total")
    response = post(client, as_bytes(quartet()), **FIELDS)
    assert response.status_code == 200 and response.json()["model"] == "instruments"
    assert metric(service, "musicrel_tokens_generated_total") == before + response.json()["new_tokens"]


def test_a_piano_upload_stays_on_the_piano_model(served):
    client, _ = served
    response = post(client, MOTIF, **FIELDS)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "continuation" and body["tracks"] is None
    plain = client.post("/v1/continuations", files={"file": ("m.mid", MOTIF, "audio/midi")}, data=FIELDS)
    assert plain.headers["x-musicrel-model"] == "continuation"


def test_the_controls_choose_where_they_ask(served):
    client, _ = served
    # program: one instrument for every note, what the piano model writes (one track)
    one = post(client, as_bytes(quartet()), **FIELDS, program="40")
    assert one.status_code == 200, one.text
    assert one.json()["model"] == "continuation" and one.json()["tracks"] is None
    written = [midi_of(s).instruments for s in one.json()["samples"]]
    assert all(len(tracks) <= 1 and all(t.program == 40 for t in tracks) for tracks in written), written
    assert any(written)  # (a sample of this random model may play nothing: its file then has no track)
    # instruments: others than the motif's, which only the instruments model can write
    more = post(client, MOTIF, **FIELDS, instruments="Violin, Cello")
    assert more.status_code == 200, more.text
    assert more.json()["model"] == "instruments"
    # one track of a quartet is one instrument: the piano model continues it
    alone = post(client, as_bytes(quartet()), **FIELDS, tracks="3")
    assert alone.status_code == 200 and alone.json()["model"] == "continuation"


def test_the_stream_says_the_model_and_each_notes_track(served):
    client, _ = served
    response = client.post(
        "/v1/continuations/stream",
        files={"file": ("q.mid", as_bytes(quartet()), "audio/midi")},
        data={**FIELDS, "seconds": "3"},
    )
    assert response.status_code == 200, response.text
    events = [json.loads(line) for line in response.text.splitlines()]
    assert events[0]["type"] == "start" and events[0]["model"] == "instruments"
    assert len(events[0]["tracks"]) == 4
    ons = [e for e in events if e["type"] == "note_on"]
    assert ons and all("track" in e and "instrument" in e for e in ons)
    assert events[-1]["type"] == "result" and events[-1]["model"] == "instruments"


def test_an_ensembles_span_is_filled_by_the_instruments_model_and_the_rest_kept(served, band_checkpoint):
    client, _ = served
    data = as_bytes(three_tracks(programs=(40, 41, 42)))
    source = pretty_midi.PrettyMIDI(io.BytesIO(data))  # as the server reads it
    response = post(client, data, "/v1/infills", **SPAN, tracks="1")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "instruments" and body["tracks"] == [1]
    from musicrel.model.checkpoint import load_codec, load_model

    model, codec = load_model(band_checkpoint, weights="float32"), load_codec(band_checkpoint)
    library = infill(
        model, source, START, END, codec=codec, params=InfillParams(seed=6, num_samples=2, tracks=(1,))
    )
    for sample, expected in zip(body["samples"], library.midis, strict=True):
        out = midi_of(sample)
        check_only_chosen_changed(source, out, (1,), START, END)
        assert notes_of(out) == notes_of(as_file(expected))
    piano = post(client, as_bytes(three_tracks()), "/v1/infills", **SPAN)
    assert piano.status_code == 200, piano.text
    assert piano.json()["model"] == "infill"


def test_an_accompaniment_that_asks_for_instruments_is_written_by_the_instruments_model(served):
    client, _ = served
    melody = pretty_midi.PrettyMIDI(initial_tempo=100)
    tune = pretty_midi.Instrument(73, name="Flute")
    tune.notes = [pretty_midi.Note(90, 67 + (k * 5) % 12, 0.5 * k, 0.5 * k + 0.45) for k in range(12)]
    melody.instruments.append(tune)
    data = as_bytes(melody)
    path = "/v1/accompaniments"
    asked = post(client, data, path, seed="2", instruments="Violin, Cello")
    assert asked.status_code == 200, asked.text
    assert asked.json()["model"] == "instruments"
    out = midi_of(asked.json()["samples"][0])
    assert (out.instruments[0].name, out.instruments[0].program) == ("Flute", 73)
    assert [(n.pitch, n.start) for n in out.instruments[0].notes] == [
        (n.pitch, n.start) for n in as_file(melody).instruments[0].notes
    ]
    assert {t.program for t in out.instruments[1:] if t.notes} <= {40, 42}
    plain = post(client, data, path, seed="2")
    assert plain.status_code == 200 and plain.json()["model"] == "accompaniment"
    assert post(client, data, path, seed="2", program="40").json()["model"] == "accompaniment"


def test_a_prepared_ensemble_motif_is_prefilled_by_the_instruments_model(served):
    client, service = served
    shared = service.worker.beside_models["instruments"]
    kept = lambda: 0 if shared._batch is None else len(shared._batch._primers)  # noqa: E731
    lied = ENSEMBLES["lied"]()
    lied.instruments[0].notes[0].velocity = 99  # a motif no other test parsed
    data = as_bytes(lied)
    before = kept()
    prepared = client.post("/v1/motifs", files={"file": ("lied.mid", data, "audio/midi")})
    assert prepared.status_code == 200, prepared.text
    assert prepared.json()["cached"] is False and prepared.json()["prefill_ms"] is not None
    assert kept() == before + 1  # its K/V kept in the batch the continuation joins
    response = post(client, data, **FIELDS)
    assert response.status_code == 200 and response.json()["model"] == "instruments"
    assert kept() == before + 1  # found there: no second prefill of it


def test_v1_model_describes_the_instruments_model(served, band_checkpoint):
    client, _ = served
    info = client.get("/v1/model").json()
    assert info["instruments"]["checkpoint"] == str(band_checkpoint)
    assert info["instruments"]["fills"] is True and info["instruments"]["card_url"] is None
    assert client.get("/v1/model/instruments/card").json()["error"]["code"] == "no_card"


def test_without_an_instruments_model_every_upload_goes_to_the_continuation_model(tiny_checkpoint):
    with serve(tiny_checkpoint, batch_window_ms=0) as (client, _):
        assert client.get("/v1/model").json()["instruments"] is None
        response = post(client, as_bytes(quartet()), **FIELDS)
        assert response.status_code == 200 and response.json()["model"] == "continuation"
        drums = post(client, as_bytes(ENSEMBLES["drums"]()), **FIELDS)
        assert drums.status_code == 422 and error_of(drums)["code"] == "no_notes"


def test_a_continuation_model_with_instruments_needs_none_beside_it(band_checkpoint):
    with serve(band_checkpoint, instruments_checkpoint=band_checkpoint, batch_window_ms=0) as (
        client,
        service,
    ):
        assert (
            service.instruments is None and "hears every instrument itself" in service.instruments_unavailable
        )
        response = post(client, as_bytes(quartet()), **FIELDS)
        assert response.status_code == 200 and response.json()["model"] == "continuation"
        assert len(response.json()["tracks"]) == 4


def test_the_engine_process_runs_the_instruments_model(tiny_checkpoint, band_checkpoint):
    with serve(tiny_checkpoint, engine="process", instruments_checkpoint=band_checkpoint) as (client, _):
        assert client.get("/v1/model").json()["instruments"]["checkpoint"] == str(band_checkpoint)
        response = post(client, as_bytes(quartet()), **FIELDS)
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "instruments" and len(response.json()["tracks"]) == 4


def test_the_instruments_models_jobs_share_one_batch_and_keep_their_own_tokens(band_checkpoint):
    """Two continuations in turn on one SharedBatch (each generator steps it once a turn): each gets the very
    tokens it gets alone; one closed half-way leaves the batch at once, the other goes on unchanged."""
    from musicrel.generation.decode_batch import generate_batch
    from musicrel.generation.primer import prepare_primer
    from musicrel.generation.sampling import SamplingParams
    from server.jobs import Continue
    from server.model import LoadedModel
    from server.worker import SharedBatch

    loaded = LoadedModel.load(band_checkpoint, weights="float32")
    primers = [prepare_primer(loaded.codec, as_bytes(make())) for make in (quartet, ENSEMBLES["band"])]
    # 4 s: no row can end within the three turns below (a time shift is at most 1 s)
    params = [SamplingParams(seconds=4.0, seed=5, num_samples=2), SamplingParams(seconds=4.0, seed=9)]
    alone = [
        generate_batch(loaded.model, loaded.codec, [(p, q)])[0] for p, q in zip(primers, params, strict=True)
    ]

    shared = SharedBatch(loaded, max_rows=3)
    jobs = [Continue(p, q, model="instruments").steps(shared) for p, q in zip(primers, params, strict=True)]
    results: dict[int, object] = {}
    while len(results) < 2:
        for k, steps in enumerate(jobs):
            if k not in results:
                try:
                    next(steps)
                except StopIteration as done:
                    results[k] = done.value
    for k in range(2):
        assert [t.tolist() for t in results[k].tokens] == [t.tolist() for t in alone[k].tokens]
    assert shared.rows == 0

    jobs = [Continue(p, q, model="instruments").steps(shared) for p, q in zip(primers, params, strict=True)]
    for _ in range(3):
        for steps in jobs:
            next(steps)
    assert shared.rows == 3
    jobs[0].close()  # the client left
    assert shared.rows == 1
    while True:
        try:
            next(jobs[1])
        except StopIteration as done:
            last = done.value
            break
    assert [t.tolist() for t in last.tokens] == [t.tolist() for t in alone[1].tokens]
    assert shared.rows == 0


def test_a_shared_batch_that_fails_fails_its_jobs_and_starts_afresh(band_checkpoint, monkeypatch):
    from musicrel.generation.decode_batch import DecodeBatch
    from musicrel.generation.primer import prepare_primer
    from musicrel.generation.sampling import SamplingParams
    from server.jobs import Continue
    from server.model import LoadedModel
    from server.worker import SharedBatch

    loaded = LoadedModel.load(band_checkpoint, weights="float32")
    primer = prepare_primer(loaded.codec, as_bytes(quartet()))
    params = SamplingParams(seconds=1.0, seed=1)
    shared = SharedBatch(loaded, max_rows=2)
    first, second = (Continue(primer, params, model="instruments").steps(shared) for _ in range(2))
    next(first), next(second)
    real = DecodeBatch.step
    monkeypatch.setattr(DecodeBatch, "step", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        next(first)
    with pytest.raises(RuntimeError, match="batch failed"):
        next(second)
    monkeypatch.setattr(DecodeBatch, "step", real)
    again = Continue(primer, params, model="instruments").steps(shared)
    while True:
        try:
            next(again)
        except StopIteration as done:
            assert len(done.value.tokens[0]) > 0
            break
    assert shared.rows == 0
