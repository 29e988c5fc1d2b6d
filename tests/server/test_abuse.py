"""Issue 15's holes, each pinned: slow and concurrent uploads (408, 429 before any read), the queue refusing
before the upload is read with a Retry-After from its measured drain, the schema's file bounds, and messages
that name what is wrong. In-process (the ASGI app driven directly, so a body can trickle or stall); against a
real uvicorn over raw sockets in test_live.py."""

from __future__ import annotations

import math
import threading
import time

import anyio
import pytest

from musicrel.errors import InvalidMidiError
from server.admission import Admission, DrainMeter
from server.errors import ApiError
from server.metrics import Metrics
from server.settings import Settings
from tests.server.conftest import (
    FAST,
    MOTIF,
    Gate,
    concurrently,
    error_of,
    metric,
    post,
    serve,
    wait_for,
)

BOUNDARY = "b0undary"


def multipart(data: bytes = MOTIF, closed: bool = True, **fields: str) -> bytes:
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    ]
    parts.append(
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="m.mid"\r\n'
        "Content-Type: audio/midi\r\n\r\n".encode()
        + data
        + b"\r\n"
    )
    return b"".join(parts) + (f"--{BOUNDARY}--\r\n".encode() if closed else b"")


def scope_for(path: str = "/v1/continuations", chunked: bool = True, length: int | None = None) -> dict:
    headers = [(b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode())]
    if chunked:
        headers.append((b"transfer-encoding", b"chunked"))
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "client": ("127.0.0.1", 1), "server": ("test", 80), "headers": headers,
    }  # fmt: skip


def call(client, receive, scope: dict | None = None) -> tuple[int, dict, float]:
    """Drive the app with `receive` as the client's side: (status, headers, seconds to the response start)."""
    answer: dict = {}

    async def run() -> None:
        start = time.monotonic()

        async def send(message):
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
                answer["headers"] = {k.decode(): v.decode() for k, v in message["headers"]}
                answer["after"] = time.monotonic() - start

        await client.app(scope or scope_for(), receive, send)

    client.portal.call(run)
    return answer["status"], answer["headers"], answer["after"]


def trickle(body: bytes, every_s: float):
    """A receive that hands the body over one byte per `every_s` seconds, as a slow-loris client would."""
    position = 0

    async def receive():
        nonlocal position
        if position >= len(body):
            await anyio.sleep_forever()
        await anyio.sleep(every_s)
        position += 1
        chunk = body[position - 1 : position]
        return {"type": "http.request", "body": chunk, "more_body": position < len(body)}

    return receive


async def stalled():
    await anyio.sleep_forever()


def stalled_until(release: threading.Event):
    """A receive that sends nothing until `release` is set, then the whole upload at once."""
    sent = False

    async def receive():
        nonlocal sent
        while sent or not release.is_set():
            await anyio.sleep(0.01)
        sent = True
        return {"type": "http.request", "body": multipart(**FAST), "more_body": False}

    return receive


# ---- hole 1: slow uploads are cut off, and only so many at once ------------------------------------------


def test_a_trickled_upload_gets_408_after_the_grace_period(tiny_checkpoint):
    with serve(tiny_checkpoint, upload_grace_s=0.5, upload_min_bytes_per_s=1024) as (client, service):
        status, headers, after = call(client, trickle(multipart(**FAST), every_s=0.05))
        assert status == 408, status
        assert 0.5 <= after < 2.0, after  # not held until the body (1 byte / 50 ms) is complete
        assert headers.get("connection") == "close"  # uvicorn drops the trickler instead of reading on
        assert metric(service, "musicrel_parse_seconds_count") == 0
        assert post(client, **FAST).status_code == 200  # a normal upload is unaffected


def test_a_body_that_stops_arriving_gets_408_by_the_upload_deadline(tiny_checkpoint):
    # Rate check off: only the body deadline can end it.
    with serve(tiny_checkpoint, upload_timeout_s=0.5, upload_min_bytes_per_s=0) as (client, _):
        status, _, after = call(client, stalled)
        assert status == 408 and 0.5 <= after < 2.0, (status, after)
        response = client.post("/v1/continuations", content=b"x", headers={"content-type": "text/plain"})
        assert response.status_code != 408  # a body that arrives is not cut off


def test_uploads_in_progress_are_bounded(tiny_checkpoint):
    with serve(tiny_checkpoint, max_uploads=2, upload_timeout_s=1.5, upload_min_bytes_per_s=0) as (client, _):
        held = [threading.Thread(target=call, args=(client, stalled)) for _ in range(2)]
        for thread in held:
            thread.start()
        middleware = uploads_middleware(client)
        wait_for(lambda: middleware.uploading == 2)
        status, headers, after = call(client, stalled)  # a third stalled body: refused before any read
        assert status == 429 and after < 0.5, (status, after)
        assert headers["retry-after"] and headers.get("connection") == "close"
        for thread in held:
            thread.join(10)
        assert middleware.uploading == 0  # the 408s gave their places back
        assert post(client, **FAST).status_code == 200


def uploads_middleware(client):
    """The app's UploadLimitMiddleware instance (built on the first request)."""
    from server.middleware import UploadLimitMiddleware

    app = client.app.middleware_stack
    while not isinstance(app, UploadLimitMiddleware):
        app = app.app
    return app


# ---- hole 2: a full queue refuses before the upload is read, with a measured Retry-After -----------------


def test_a_full_queue_refuses_before_reading_the_upload(tiny_checkpoint):
    gate = Gate()
    with serve(tiny_checkpoint, decoder=gate, max_queue=1, batch_window_ms=0, max_batch_rows=1) as (
        client,
        service,
    ):
        gate.hold()
        threads = [threading.Thread(target=post, args=(client,), kwargs=FAST)]
        threads[0].start()
        assert gate.entered.wait(10)  # one generating...
        threads.append(threading.Thread(target=post, args=(client,), kwargs=FAST))
        threads[1].start()
        wait_for(lambda: service.worker.queue_depth == 1)  # ...and one queued: the queue is full
        reads = 0

        async def counting_receive():
            nonlocal reads
            reads += 1
            await anyio.sleep_forever()

        status, headers, after = call(client, counting_receive)
        assert status == 429 and reads == 0, (status, reads)  # refused with the body unread
        assert after < 0.5 and int(headers["retry-after"]) >= 1
        gate.opened.set()
        for thread in threads:
            thread.join(30)


def test_drain_meter_counts_only_gaps_with_a_queue():
    meter = DrainMeter(alpha=0.5)
    assert meter.wait_s(10) is None  # nothing measured yet
    meter.departed(1, waiting=0, now=100.0)  # the queue emptied: the gap after it was idle
    meter.departed(1, waiting=2, now=200.0)
    assert meter.wait_s(10) is None  # ... so it is not a measurement
    meter.departed(1, waiting=1, now=202.0)
    assert meter.seconds_per_job == pytest.approx(2.0)
    meter.departed(4, waiting=3, now=206.0)  # four at once after 4 s: 1 s each, weighing as four
    assert meter.seconds_per_job == pytest.approx(2.0 + (1 - 0.5**4) * (1.0 - 2.0))
    assert meter.wait_s(10) == pytest.approx(10 * meter.seconds_per_job)


def test_drain_meter_measures_a_burst_from_its_first_arrival():
    """The first departure of a burst already says how fast the queue drains: measured from the arrival that
    ended the idle spell (before, the first gap was lost, and a burst whose first request took 2.5 s to parse
    was told the configured 2 s, then measured from a 0.1 s gap between two parses ending together)."""
    meter = DrainMeter(alpha=0.5)
    meter.arrived(now=10.0)
    meter.arrived(now=10.1)  # the clock runs from the first
    meter.departed(1, waiting=1, now=12.5)
    assert meter.seconds_per_job == pytest.approx(2.5)
    meter.departed(1, waiting=0, now=12.6)
    assert meter.seconds_per_job == pytest.approx(2.5 + 0.5 * (0.1 - 2.5))
    meter.arrived(now=100.0)  # after an idle spell: the idle time is not counted
    meter.departed(1, waiting=0, now=101.0)
    assert meter.seconds_per_job == pytest.approx(0.5 * 1.3 + 0.5 * 1.0)


def test_a_request_that_ends_before_its_job_is_queued_is_a_departure():
    admission = Admission(Settings(max_queue=4), Metrics())
    first, second = admission.admit(queue_depth=0), admission.admit(queue_depth=0)
    time.sleep(0.05)
    first.release()  # e.g. its upload was not MIDI (422): its place is free, and that is a drain
    assert admission.admitted == 1 and admission.drain.seconds_per_job >= 0.05
    measured = admission.drain.seconds_per_job
    second.handed_over()  # queued for the worker: not a departure (the worker reports that one)
    assert admission.admitted == 0 and admission.drain.seconds_per_job == measured
    second.release()  # already handed over: nothing happens
    assert admission.admitted == 0 and admission.drain.seconds_per_job == measured


def test_a_request_refused_by_an_upload_bound_frees_its_place_without_measuring_the_drain():
    admission = Admission(Settings(max_queue=4), Metrics())
    tickets = [admission.admit(queue_depth=0) for _ in range(3)]
    time.sleep(0.02)
    tickets[0].release(served=False)  # e.g. 429 too_many_uploads: it left at once, having cost nothing
    assert admission.admitted == 2 and admission.drain.seconds_per_job is None
    time.sleep(0.05)
    tickets[1].release()  # a real departure: measured from the burst's first arrival, the refusal ignored
    assert admission.drain.seconds_per_job >= 0.07
    tickets[2].release(served=False)  # the last one: nothing waits, the clock stops
    assert admission.drain._since is None


def test_uploads_refused_in_a_burst_do_not_shorten_retry_after(tiny_checkpoint, monkeypatch):
    """Through the app: two admitted uploads stall (one upload slot: the second is refused 429
    too_many_uploads). That refusal frees a place but measures no drain, so the next 429 queue_full still
    carries the estimate, not a drain of milliseconds."""
    with serve(tiny_checkpoint, max_queue=2, max_uploads=1, upload_timeout_s=3, upload_min_bytes_per_s=0,
               retry_after_s=99) as (client, service):  # fmt: skip
        release = threading.Event()
        held = threading.Thread(target=call, args=(client, stalled_until(release)))
        held.start()
        wait_for(lambda: uploads_middleware(client).uploading == 1)
        status, _, _ = call(client, stalled)
        assert status == 429  # too_many_uploads, after admission
        assert service.admission.drain.seconds_per_job is None
        release.set()  # the stalled body arrives (it waited out its 3 s deadline before, for no check)
        held.join(10)
        assert not held.is_alive()


def test_retry_after_is_the_measured_drain_time_clamped():
    settings = Settings(max_queue=4, retry_after_s=2, request_timeout_s=30)
    admission = Admission(settings, Metrics())
    assert admission.retry_after_s(4) == 2  # nothing measured: the configured value
    admission.drain.seconds_per_job = 1.6
    assert admission.retry_after_s(4) == 7  # ceil(4 x 1.6)
    admission.drain.seconds_per_job = 0.01
    assert admission.retry_after_s(4) == 1  # never 0
    admission.drain.seconds_per_job = 100.0
    assert admission.retry_after_s(4) == 30  # never past the request deadline
    tickets = [admission.admit(queue_depth=1) for _ in range(3)]
    with pytest.raises(Exception) as refused:
        admission.admit(queue_depth=1)
    assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "30"}
    tickets[0].release()
    tickets[0].release()  # idempotent: releasing twice frees one place
    assert admission.admitted == 2
    admission.admit(queue_depth=1)


def test_retry_after_follows_the_queue_drain_under_load(tiny_checkpoint):
    """Jobs one at a time (one row): the bound drains one request per generation once the first is parsed
    (that first gap, arrival to start, counts too). The measured rate lies between the generation time and
    the whole request's, and Retry-After comes from it, not from the configured fallback."""
    with serve(tiny_checkpoint, max_queue=3, max_batch_rows=1, batch_window_ms=0, retry_after_s=99) as (
        client,
        service,
    ):
        results: list = []
        lock = threading.Lock()

        def one(i: int) -> None:
            response = post(client, json=True, seconds="2", seed=str(i))
            with lock:
                results.append(response)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        wait_for(lambda: service.admission.drain.seconds_per_job is not None, 60)
        response = post(client, **FAST)
        for thread in threads:
            thread.join(60)
        accepted = [r.json() for r in results if r.status_code == 200]
        assert len(accepted) == 3, [r.text for r in results]
        generation_s = min(r["timings"]["generation_ms"] / 1000 for r in accepted)
        total_s = max(r["timings"]["total_ms"] / 1000 for r in accepted)
        assert 0.5 * generation_s <= service.admission.drain.seconds_per_job <= 2 * total_s
        if response.status_code == 429:  # the queue may have drained by then on a fast machine
            assert int(response.headers["retry-after"]) != 99  # measured, not the configured fallback


def test_a_cold_burst_is_told_the_time_to_parse_and_generate_what_is_ahead():
    """Before anything has left the queue there is no drain rate: Retry-After prices the uploads admitted
    (their Content-Length at the parse speed measured at start-up) and the jobs queued (the mean generation
    time so far, shared by the batch's rows), instead of the configured value."""
    settings = Settings(max_queue=3, retry_after_s=2, request_timeout_s=120, max_batch_rows=4)
    admission = Admission(settings, Metrics())
    admission.parse_s_per_byte = 3.3e-6
    tickets = [admission.admit(0, size=1_000_000), admission.admit(0, size=2_000_000), admission.admit(0)]
    with pytest.raises(ApiError) as refused:
        admission.admit(0, size=1000)
    # 3 MB known, the chunked upload priced at their mean (1.5 MB): 4.5 MB x 3.3 us = 14.85 s
    assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "15"}
    tickets[1].handed_over()  # parsed and queued: its bytes are no longer ahead of the parser
    assert admission.retry_after_s(3) == 7  # 1 MB and the chunked one at 1 MB: 6.6 s
    admission.queue_depth = 5
    admission.metrics.generation_seconds.observe(10.0)
    assert admission.retry_after_s(3) == 18  # 7 jobs ahead x 10 s / 4 rows: generation is the slower stage
    admission.drain.seconds_per_job = 0.5
    assert admission.retry_after_s(3) == 2  # a measured drain wins over any estimate
    for ticket in tickets:
        ticket.release()
    assert (admission.admitted, admission.sized, admission.bytes_admitted) == (0, 0, 0)


def test_the_service_calibrates_its_parse_speed_and_prices_the_uploads_it_admitted(
    tiny_checkpoint, monkeypatch, real_midi_files
):
    from musicrel.generation.primer import prepare_primer
    from musicrel.midi.codec import EventCodec
    from server.tasks import continuation as continuations

    release = threading.Event()

    def held(*args):  # the parser is busy: nothing leaves the queue bound
        release.wait(30)
        raise InvalidMidiError("not MIDI", code="not_midi")

    monkeypatch.setattr(continuations, "_motif", held)
    big = MOTIF + b"\0" * 1_500_000
    with serve(tiny_checkpoint, max_queue=2, retry_after_s=99, fresh_calibration=True) as (client, service):
        admission = service.admission
        real = max(real_midi_files, key=lambda p: p.stat().st_size).read_bytes()
        start = time.perf_counter()
        prepare_primer(EventCodec(), real)
        real_rate = (time.perf_counter() - start) / len(real)
        calibrated = admission.parse_s_per_byte
        assert real_rate / 3 < calibrated < 3 * real_rate, (calibrated, real_rate)
        threads = [threading.Thread(target=post, args=(client, big), kwargs=FAST) for _ in range(2)]
        for thread in threads:
            thread.start()
        wait_for(lambda: _parsing(client) == 2)
        assert admission.drain.seconds_per_job is None  # nothing has left: the cold case
        assert admission.sized == 2 and admission.bytes_admitted > 3_000_000  # each Content-Length counted
        refused = post(client, **FAST)
        expected = math.ceil(admission.bytes_admitted * admission.parse_s_per_byte)
        assert refused.status_code == 429 and refused.headers["retry-after"] == str(max(1, expected))
        release.set()
        for thread in threads:
            thread.join(30)
        assert admission.bytes_admitted == 0


def test_a_finished_continuation_is_not_held_behind_uploads_being_parsed(tiny_checkpoint, monkeypatch):
    """One parse thread, busy with a slow upload: a continuation that has finished generating is answered
    anyway (its MIDI was written on the parse threads, behind every queued parse)."""
    from server.tasks import continuation as continuations

    slow = b"MThd-slow"
    release = threading.Event()
    parse = continuations._motif

    def prepare(service, data, *args):
        if data.startswith(slow):
            release.wait(30)
            raise InvalidMidiError("not MIDI", code="not_midi")
        return parse(service, data, *args)

    monkeypatch.setattr(continuations, "_motif", prepare)
    gate = Gate()
    with serve(tiny_checkpoint, decoder=gate, parse_threads=1, batch_window_ms=0) as (client, _):
        gate.hold()
        answers: dict = {}
        first = threading.Thread(target=lambda: answers.setdefault("first", post(client, **FAST)))
        first.start()
        assert gate.entered.wait(10)  # parsed, now generating
        second = threading.Thread(target=lambda: answers.setdefault("second", post(client, slow, **FAST)))
        second.start()
        wait_for(lambda: _parsing(client) == 1)  # the slow upload holds the only parse thread
        gate.opened.set()
        first.join(10)
        try:
            assert "first" in answers, "the finished continuation waited for the slow parse"
            assert answers["first"].status_code == 200
        finally:
            release.set()
            second.join(30)
        assert answers["second"].status_code == 422


def _parsing(client) -> int:
    """Parse threads busy now."""
    return int(client.app.state.service.parse_limiter.borrowed_tokens)


# ---- holes 4 and 5: the schema and the messages say what is actually wrong ---------------------------------


def test_schema_says_the_file_may_not_be_empty_and_the_service_agrees(client):
    spec = client.get("/openapi.json").json()
    body = spec["paths"]["/v1/continuations"]["post"]["requestBody"]["content"]["multipart/form-data"]
    ref = body["schema"]["$ref"].rsplit("/", 1)[1]
    file_schema = spec["components"]["schemas"][ref]["properties"]["file"]
    assert file_schema["minLength"] == 1 and file_schema["contentMediaType"] == "audio/midi"
    response = post(client, b"", **FAST)
    assert response.status_code == 422
    assert error_of(response) == {
        "code": "invalid_request", "field": "file", "message": "file: the upload is empty (0 bytes)"
    }  # fmt: skip
    for status in ("400", "408", "413", "422", "429"):
        assert status in spec["paths"]["/v1/continuations"]["post"]["responses"]


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf"])
def test_a_non_finite_number_is_named_as_such(client, value):
    response = post(client, seconds=value)
    assert response.status_code == 422
    error = error_of(response)
    assert error["field"] == "seconds" and "finite number" in error["message"], error
    assert "600" not in error["message"]


def test_a_multipart_body_without_its_closing_boundary_is_called_truncated(client):
    headers = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}
    response = client.post("/v1/continuations", content=multipart(closed=False, **FAST), headers=headers)
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["code"] == "bad_request"
    assert "closing boundary" in error["message"] and "Field required" not in error["message"]
    # The same body closed is fine: the check reads the delimiter, not the part.
    response = client.post("/v1/continuations", content=multipart(**FAST), headers=headers)
    assert response.status_code == 200, response.text


@pytest.fixture(scope="module")
def client(tiny_checkpoint):
    with serve(tiny_checkpoint, batch_window_ms=0) as (client, _):
        yield client


# ---- the suite's abuse cases: bodies, fields, content types and parameters a client should not send -------


def test_a_never_ending_chunked_body_is_413_once_past_the_cap_and_no_more_is_read(tiny_checkpoint):
    chunk = b"x" * 4096
    with serve(tiny_checkpoint, max_upload_bytes=64 * 1024) as (client, service):
        read = 0

        head = multipart(**FAST).split(b"MThd")[0]  # a well-formed form up to the file's first byte

        async def endless():  # ... whose file part never ends
            nonlocal read
            read += 1
            return {"type": "http.request", "body": head if read == 1 else chunk, "more_body": True}

        status, _, after = call(client, endless)
        assert status == 413 and after < 1.0, (status, after)
        assert read <= 64 * 1024 // len(chunk) + 2  # memory bounded: the cap and one chunk, not the stream
        assert uploads_middleware(client).uploading == 0
        assert metric(service, "musicrel_parse_seconds_count") == 0


def test_thousands_of_fields_are_400_quickly(client):
    fields = {f"f{i}": "1" for i in range(5000)}
    headers = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}
    start = time.monotonic()
    response = client.post("/v1/continuations", content=multipart(**fields, **FAST), headers=headers)
    assert response.status_code == 400, response.text
    assert time.monotonic() - start < 5
    assert "fields" in error_of(response)["message"].lower()
    assert post(client, **FAST).status_code == 200


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/json", b'{"file": "TVRoZA==", "seconds": 1}'),
        ("text/plain", b"MThd"),
        ("application/x-www-form-urlencoded", b"file=MThd&seconds=1"),
        ("multipart/form-data", multipart(**FAST)),  # no boundary parameter
        ("multipart/form-data; boundary=other", multipart(**FAST)),  # not the body's boundary
        ("application/octet-stream", MOTIF),
        (None, MOTIF),
    ],
)
def test_a_wrong_content_type_is_a_4xx_naming_the_problem(client, content_type, body):
    headers = {"content-type": content_type} if content_type else {}
    response = client.post("/v1/continuations", content=body, headers=headers)
    assert response.status_code in (400, 415, 422), (response.status_code, response.text)
    assert error_of(response)["code"] in ("bad_request", "invalid_request")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seconds", "1e308"), ("seconds", "-0"), ("seconds", "0x10"), ("seconds", "1" * 5000),
        ("seed", "-1"), ("seed", str(2**64)), ("seed", "1.5"), ("num_samples", "100000"),
        ("top_k", "0"), ("top_p", "1.0000001"), ("temperature", "-1"), ("tracks", "0," * 300),
        ("tracks", "99999"), ("include_primer", "maybe"), ("primer_seconds", "1e400"),
    ],
)  # fmt: skip
def test_hostile_parameters_are_422_naming_the_field(client, field, value):
    response = post(client, **{**FAST, field: value})
    assert response.status_code == 422, (field, value, response.text)
    error = error_of(response)
    assert error["code"] in ("invalid_request", "no_such_track") and len(error["message"]) < 500
    if error["code"] == "invalid_request":
        assert error["field"] == field


def test_extreme_but_valid_sampling_fails_no_request_of_its_batch(tiny_checkpoint):
    """temperature 1e-45 and top_p 1e-46 are in bounds: the sampler once turned them into index -1, and the
    decoding step failed every request of the batch with a 500 (schemathesis found it)."""
    with serve(tiny_checkpoint, batch_window_ms=1500) as (client, _):
        fields = [{"temperature": "1e-45"}, {"top_p": "1e-46"}, {}]
        responses = concurrently(lambda i: post(client, json=True, seconds="1", seed=str(i), **fields[i]), 3)
        assert [r.status_code for r in responses] == [200, 200, 200], [r.text for r in responses]
        assert max(r.json()["batch"]["requests"] for r in responses) > 1  # they really shared a batch
        assert all(r.json()["new_tokens"] > 0 for r in responses)


# ---- faults ----------------------------------------------------------------------------------------------


def test_a_parse_that_hangs_costs_its_own_request_not_the_server(tiny_checkpoint, monkeypatch):
    """One parse thread, and a parse that never returns: its request gets 504 at the request deadline and the
    thread's place is given back, so the next upload is parsed (before, both waited for ever)."""
    from server.tasks import continuation as continuations

    hang = threading.Event()
    parse = continuations._motif

    def prepare(service, data, *args):
        if data.startswith(b"MThd-hang"):
            hang.wait(60)
        return parse(service, data, *args)

    monkeypatch.setattr(continuations, "_motif", prepare)
    with serve(tiny_checkpoint, parse_threads=1, request_timeout_s=1.5) as (client, _):
        try:
            start = time.monotonic()
            hung = post(client, b"MThd-hang", **FAST)
            assert hung.status_code == 504 and error_of(hung)["code"] == "timeout", hung.text
            assert time.monotonic() - start < 5
            start = time.monotonic()
            assert post(client, **FAST).status_code == 200  # the only parse thread is still stuck
            assert time.monotonic() - start < 5
        finally:
            hang.set()
