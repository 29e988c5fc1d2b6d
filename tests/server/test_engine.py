"""The engine process (MUSICREL_ENGINE=process, the default): the same answers as the in-process worker, the
queue bound kept by the server, metrics and cancellations across the pipe, and a dead engine."""

from __future__ import annotations

import pickle
import threading

import pytest

from musicrel.errors import GenerationError, InvalidMidiError
from server.engine import MAX_RESTARTS, _picklable
from tests.server.conftest import (
    FAST,
    concurrently,
    error_of,
    metric,
    post,
    post_then_leave,
    serve,
    wait_for,
)


def started(service) -> bool:
    """Whether a job the engine runs has begun decoding (the engine reported it)."""
    return any(job.started_at for job in list(service.worker._jobs.values()))


@pytest.fixture(scope="module")
def one_row(tiny_checkpoint):
    """One engine process for the tests of a request that leaves or an engine that dies: one row in the batch
    (a second request waits for the first's), 600 s of music allowed (a generation no deadline stops), and
    the client checked every 20 ms. An engine start costs seconds of CPU; a killed one is replaced by the
    service, as the tests that kill it check, so the next test finds it ready again."""
    with serve(
        tiny_checkpoint, engine="process", batch_window_ms=0, disconnect_poll_s=0.02, max_seconds=600,
        max_batch_rows=1, request_timeout_s=60,
    ) as pair:  # fmt: skip
        yield pair


def test_errors_cross_the_pipe_with_their_code():
    for error in (
        GenerationError("too long", code="primer_too_long"),
        InvalidMidiError("bad", code="truncated"),
    ):
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and back.code == error.code and str(back) == str(error)

    class Local(Exception):  # defined in a function: pickle cannot find it again
        pass

    sent = _picklable(Local("boom"))
    assert isinstance(sent, RuntimeError) and "Local: boom" in str(sent)


def test_engine_process_answers_like_the_thread_engine(tiny_checkpoint):
    answers = {}
    for engine in ("thread", "process"):
        with serve(tiny_checkpoint, engine=engine) as (client, service):
            response = post(client, json=True, seconds="1.0", seed="11", num_samples="2")
            assert response.status_code == 200, response.text
            body = response.json()
            answers[engine] = [s["midi_base64"] for s in body["samples"]]
            # The engine's metric updates reach the server's registry.
            assert metric(service, "musicrel_tokens_generated_total") == body["new_tokens"] > 0
            assert metric(service, "musicrel_batched_jobs_total") == 1
            assert metric(service, "musicrel_batch_rows_count") >= max(
                s["new_tokens"] for s in body["samples"]
            )
            assert body["timings"]["generation_ms"] > 0 and body["timings"]["queue_ms"] >= 0
        if engine == "process":
            assert service.worker._process.returncode == 0  # stopped cleanly with the app
    assert answers["process"] == answers["thread"]


def test_engine_queue_bound_is_kept_by_the_server(tiny_checkpoint):
    # Idle, the engine waits up to the batch window for a second request to fill its 2 rows: the first one
    # stays queued meanwhile, so the queue (1) is full and the next request is refused at once (in
    # milliseconds; the first then waits out the rest of the window).
    with serve(tiny_checkpoint, engine="process", max_queue=1, max_batch_rows=2, batch_window_ms=2000) as (
        client,
        service,
    ):
        first: dict = {}
        waiting = threading.Thread(target=lambda: first.update(r=post(client, **FAST)))
        waiting.start()
        wait_for(lambda: service.worker.queue_depth == 1)
        response = post(client, **FAST)
        assert response.status_code == 429 and error_of(response)["code"] == "queue_full"
        waiting.join(60)
        assert first["r"].status_code == 200
        assert service.worker.queue_depth == 0
        assert metric(service, "musicrel_queue_depth") == 0


def test_concurrent_requests_share_the_engine_batch(tiny_checkpoint):
    # The window ends once the waiting requests fill the rows: four rows start as soon as all four are in.
    with serve(tiny_checkpoint, engine="process", batch_window_ms=5000, max_batch_rows=4) as (
        client,
        service,
    ):
        responses = concurrently(lambda i: post(client, json=True, seconds="0.3", seed=str(i)), 4)
        assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
        assert sorted(r.json()["seed"] for r in responses) == [0, 1, 2, 3]
        assert max(r.json()["batch"]["requests"] for r in responses) > 1
        assert metric(service, "musicrel_batches_total") < 4


def test_a_client_that_leaves_stops_its_generation_in_the_engine(one_row):
    client, service = one_row
    before = metric(service, "musicrel_stopped_jobs_total", reason="disconnected")
    # The client leaves once its generation has begun.
    messages = post_then_leave(client, {"seconds": "600"}, lambda: started(service))
    assert messages[0]["status"] == 499
    # Only the cancel message can stop it: 600 s of music is thousands of steps, and no deadline is near.
    wait_for(lambda: metric(service, "musicrel_stopped_jobs_total", reason="disconnected") == before + 1, 30)
    assert post(client, **FAST).status_code == 200


def test_a_dead_engine_fails_its_requests_and_is_replaced(one_row):
    client, service = one_row
    result: dict = {}
    running = threading.Thread(target=lambda: result.update(r=post(client, seconds="600")))
    running.start()
    wait_for(lambda: started(service), 30)
    first = service.worker._process
    first.kill()  # as the OOM killer would
    running.join(30)
    assert result["r"].status_code == 503 and "engine" in error_of(result["r"])["message"]
    assert client.get("/healthz").status_code == 200  # alive: a new engine is starting
    wait_for(lambda: client.get("/readyz").status_code == 200, 60)
    assert service.worker._process is not first and first.returncode == -9
    assert post(client, **FAST).status_code == 200


def test_an_engine_that_keeps_dying_fails_liveness(tiny_checkpoint):
    with serve(tiny_checkpoint, engine="process") as (client, service):
        killed: list = []
        for _ in range(MAX_RESTARTS + 1):  # each replacement dies before it is ready
            wait_for(lambda: service.worker._process not in killed, 30)
            process = service.worker._process
            process.kill()
            killed.append(process)
        wait_for(lambda: service.worker.failed is not None, 30)
        assert service.worker._process in killed  # no engine after the last death
        for route in ("/healthz", "/readyz"):
            response = client.get(route)
            assert response.status_code == 503 and "times in a row" in error_of(response)["message"]
        refused = post(client, **FAST)
        assert refused.status_code == 503


def test_an_engine_that_cannot_load_says_why(tiny_checkpoint):
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA: the engine must fail to load on device cuda")
    # The server's own copy loads on the CPU; the engine's, on the configured device, cannot.
    with serve(tiny_checkpoint, engine="process", device="cuda", wait_ready=False) as (client, service):
        wait_for(lambda: service.worker.failed is not None, 60)
        response = client.get("/readyz")
        assert response.status_code == 503
        assert "loading the checkpoint failed" in error_of(response)["message"]
        assert not service.worker.ready.is_set()


def test_a_client_that_leaves_frees_its_row_for_the_next_request(one_row):
    """One row in the batch: the request that leaves holds it with 600 s of music to go; the next request can
    only run once the cancel has freed that row."""
    client, service = one_row
    before = metric(service, "musicrel_stopped_jobs_total", reason="disconnected")
    messages = post_then_leave(client, {"seconds": "600"}, lambda: started(service))
    assert messages[0]["status"] == 499
    response = post(client, json=True, **FAST)
    assert response.status_code == 200, response.text
    assert response.json()["batch"] == {"requests": 1, "rows": 1}  # decoded alone: the row was free
    assert metric(service, "musicrel_stopped_jobs_total", reason="disconnected") == before + 1


def test_a_dead_engine_fails_only_the_requests_it_was_decoding(one_row):
    """One row: the first request decodes, the second waits in the engine's queue. The engine is killed:
    the first is 503, the second never started and is served by the replacement."""
    client, service = one_row
    wait_for(lambda: client.get("/readyz").status_code == 200, 60)  # an engine killed before is replaced
    answers: dict = {}
    running = threading.Thread(target=lambda: answers.update(a=post(client, seconds="600")))
    running.start()
    wait_for(lambda: started(service), 30)
    queued = threading.Thread(target=lambda: answers.update(b=post(client, json=True, **FAST)))
    queued.start()
    wait_for(lambda: service.worker.queue_depth == 1, 30)
    first = service.worker._process
    first.kill()
    running.join(30)
    queued.join(90)
    assert answers["a"].status_code == 503 and "engine" in error_of(answers["a"])["message"]
    assert answers["b"].status_code == 200, answers["b"].text
    assert service.worker._process is not first and service.worker.queue_depth == 0


def test_the_pipe_carries_typed_messages_and_tokens_not_midi():
    """Every message is a dataclass that pickles as it is sent; a finished job crosses as its tokens (the
    server renders them)."""
    import pickle

    import numpy as np

    from musicrel.generation.decode_batch import ContinuationResult
    from server.jobs import Finished, Progress, Started
    from server.messages import CancelJob, JobUpdate, MetricUpdate, Ready, Stop, SubmitJob
    from server.model import ModelCard

    result = ContinuationResult(
        tokens=[np.arange(5)], seed=3, primer_tokens=4, new_tokens=5, seconds=0.1, timings={"decode": 0.0}
    )
    messages = [
        SubmitJob(1, None, 2.0, stream=True), CancelJob(1, "disconnected"), Stop(None),
        Ready(ModelCard({"parameters": 1})),
        JobUpdate(1, Started(1.0)), JobUpdate(1, Progress([[1, 2]])),
        MetricUpdate("stopped", ("x",), "inc", ()),
        JobUpdate(1, Finished(result), {"stop_reason": None}),
    ]  # fmt: skip
    for message in messages:
        again = pickle.loads(pickle.dumps(message))
        assert type(again) is type(message)
    sent = pickle.loads(pickle.dumps(messages[-1]))
    assert [t.tolist() for t in sent.event.result.tokens] == [[0, 1, 2, 3, 4]]
    assert not hasattr(sent.event.result, "midis")
