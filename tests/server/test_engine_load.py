"""The engine behind the HTTP API (in-process): micro-batching, back-pressure, deadlines, disconnects,
draining, failures that fail alone, `musicrel serve`'s settings and threads, and the novelty answers."""

from __future__ import annotations

import threading

import pytest

from musicrel.generation.decode_batch import DecodeBatch
from server.settings import Settings
from tests.server.conftest import (
    FAST,
    MOTIF,
    Broken,
    Gate,
    concurrently,
    error_of,
    metric,
    motif,
    post,
    post_then_leave,
    serve,
    wait_for,
)

# ---- load: micro-batching, queue, deadline, disconnect, drain ------------------------------------


def test_concurrent_requests_share_batches(tiny_checkpoint):
    n = 6
    # The window ends once the waiting requests fill the rows: n rows start as soon as all n are in.
    with serve(tiny_checkpoint, batch_window_ms=5000, max_batch_rows=n) as (client, service):
        batches_before = metric(service, "musicrel_batches_total")
        responses = concurrently(lambda i: post(client, json=True, seconds="0.3", seed=str(i)), n)
        assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
        batches = metric(service, "musicrel_batches_total") - batches_before
        assert metric(service, "musicrel_batched_jobs_total") == n
        assert batches < n
        assert max(r.json()["batch"]["requests"] for r in responses) > 1
        assert sorted(r.json()["seed"] for r in responses) == list(range(n))  # each got its own answer


def test_queue_full_is_429_and_deadline_is_504(tiny_checkpoint):
    gate = Gate()
    with serve(
        tiny_checkpoint, decoder=gate, max_queue=1, batch_window_ms=0, max_batch_rows=1, request_timeout_s=2
    ) as (client, service):
        gate.hold()
        first: dict = {}
        waiting = threading.Thread(target=lambda: first.update(r=post(client, **FAST)))
        waiting.start()
        assert gate.entered.wait(10)  # the first request holds the worker ...
        second: dict = {}
        queued = threading.Thread(target=lambda: second.update(r=post(client, **FAST)))
        queued.start()
        wait_for(lambda: service.worker.queue_depth == 1)
        # ... the second fills the queue, so a third is turned away at once.
        response = post(client, **FAST)
        assert response.status_code == 429 and error_of(response)["code"] == "queue_full"
        assert int(response.headers["retry-after"]) >= 1
        assert metric(service, "musicrel_rejected_total", reason="queue_full") == 1
        # The held requests reach their deadline: 504, and their generation is stopped, not run to the end.
        waiting.join(30)
        queued.join(30)
        assert first["r"].status_code == 504 and error_of(first["r"])["code"] == "timeout"
        assert second["r"].status_code == 504
        wait_for(lambda: metric(service, "musicrel_stopped_jobs_total", reason="deadline") >= 2)
        assert metric(service, "musicrel_stopped_jobs_total", reason="deadline") == 2
        assert gate.results[-1].stopped and gate.results[-1].new_tokens == 0
        gate.opened.set()
        assert post(client, **FAST).status_code == 200  # the service carries on


def test_client_disconnect_stops_generation(tiny_checkpoint):
    gate = Gate()
    with serve(tiny_checkpoint, decoder=gate, batch_window_ms=0, disconnect_poll_s=0.02) as pair:
        client, service = pair
        gate.hold()
        # The client leaves once its generation has begun.
        messages = post_then_leave(client, {"seconds": "30"}, gate.entered.is_set)
        wait_for(lambda: gate.results)
        assert messages[0]["status"] == 499
        result = gate.results[-1]
        assert result.stopped and result.new_tokens == 0  # 30 s of music asked for, nothing generated
        assert metric(service, "musicrel_stopped_jobs_total", reason="disconnected") == 1


def test_not_ready_until_warm(tiny_checkpoint):
    gate = Gate(open_=False)  # holds the warm-up generation
    with serve(tiny_checkpoint, decoder=gate, wait_ready=False) as (client, service):
        response = client.get("/readyz")
        assert response.status_code == 503 and error_of(response)["code"] == "not_ready"
        assert client.get("/healthz").status_code == 200  # alive, just not ready
        refused = post(client, **FAST)
        assert refused.status_code == 503 and error_of(refused)["code"] == "not_ready"
        assert "retry-after" in refused.headers
        gate.opened.set()
        assert service.worker.ready.wait(30)
        assert client.get("/readyz").status_code == 200


def test_draining_refuses_new_work(tiny_checkpoint):
    with serve(tiny_checkpoint) as (client, service):
        service.draining = True  # what SIGTERM sets (the real signal is tested in test_live.py)
        ready = client.get("/readyz")
        assert ready.status_code == 503 and error_of(ready)["code"] == "draining"
        refused = post(client, **FAST)
        assert refused.status_code == 503 and error_of(refused)["code"] == "draining"
        assert client.get("/healthz").status_code == 200


def test_unexpected_failure_is_json_500(tiny_checkpoint):
    with serve(tiny_checkpoint, decoder=Broken, raise_errors=False) as (client, _):
        response = post(client, **FAST)
        assert response.status_code == 500
        assert error_of(response)["code"] == "internal" and "boom" not in response.text


def test_a_job_that_fails_admission_fails_alone(tiny_checkpoint):
    short = motif(n_notes=3)  # under 40 primer tokens
    data = [short, MOTIF, short]
    # The three start together as soon as they fill the three rows (the window is an upper bound).
    with serve(
        tiny_checkpoint, decoder=Broken, raise_errors=False, batch_window_ms=5000, max_batch_rows=len(data)
    ) as (client, service):
        responses = concurrently(lambda i: post(client, data[i], json=True, seconds="0.3", seed=str(i)), 3)
        assert [r.status_code for r in responses] == [200, 500, 200], [r.text for r in responses]
        assert metric(service, "musicrel_batched_jobs_total") == 2  # the good two (warm-up is not counted)
        assert sorted(responses[i].json()["seed"] for i in (0, 2)) == [0, 2]


def test_a_request_joins_the_running_batch(tiny_checkpoint):
    """Continuous batching: a request arriving while another decodes is admitted at the next step and
    decoded alongside it; it does not wait for the running one to finish."""
    gate = Gate()
    with serve(tiny_checkpoint, decoder=gate, batch_window_ms=0) as (client, service):
        gate.hold()
        first: dict = {}
        running = threading.Thread(
            target=lambda: first.update(r=post(client, json=True, seconds="10", seed="1"))
        )
        running.start()
        assert gate.entered.wait(10)  # 10 s of music: hundreds of steps to go
        second: dict = {}
        joining = threading.Thread(target=lambda: second.update(r=post(client, json=True, **FAST)))
        joining.start()
        wait_for(lambda: service.worker.queue_depth == 1)
        gate.opened.set()
        joining.join(30)
        running.join(60)
        a, b = first["r"].json(), second["r"].json()
        assert a["batch"] == b["batch"] == {"requests": 2, "rows": 2}
        assert b["new_tokens"] > 0 and a["new_tokens"] > b["new_tokens"]
        assert metric(service, "musicrel_batches_total") == 2  # one admission each
        steps = metric(service, "musicrel_batch_rows_count")
        assert metric(service, "musicrel_batch_rows_sum") > steps  # some steps decoded both rows


# ---- musicrel serve ------------------------------------------------------------------------------


def test_serve_refuses_a_missing_checkpoint_or_bad_setting(tmp_path, tiny_checkpoint, capsys, monkeypatch):
    from musicrel.cli import main

    monkeypatch.delenv("MUSICREL_CHECKPOINT", raising=False)  # serve sets it for its workers; undone after
    assert main(["serve", "--checkpoint", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "checkpoint_missing" in err and "nope" in err

    monkeypatch.setenv("MUSICREL_MAX_QUEUE", "0")
    assert main(["serve", "--checkpoint", str(tiny_checkpoint)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "MUSICREL_MAX_QUEUE" in err


@pytest.mark.parametrize("threads", [1, 2])
def test_torch_threads_apply_in_the_generation_thread(tiny_checkpoint, threads):
    """OpenMP's thread count is per calling thread: the setting must be applied by the worker itself."""
    import torch

    seen: list = []

    def decoder(model, codec, max_rows, **options):
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return DecodeBatch(model, codec, max_rows, **options)

    before = torch.get_num_threads()
    with serve(tiny_checkpoint, decoder=decoder, torch_threads=threads) as (client, _):
        assert post(client, **FAST).status_code == 200
    assert seen and seen[0] == ("musicrel-generation", threads)
    torch.set_num_threads(before)


def test_auto_torch_threads_are_chosen_in_the_generation_thread(tiny_checkpoint, monkeypatch):
    """The default: the worker asks runtime.threads, for its batch's rows, keeping a CPU for requests."""
    import torch

    import musicrel.runtime.threads as policy
    from musicrel.runtime.threads import ThreadChoice

    asked: list = []

    def choose(rows, reserve=0.0, sampler=None, sample_s=0.1):
        asked.append((threading.current_thread().name, rows, reserve))
        return ThreadChoice(3, 4.0, 0.5, rows, reserve)

    monkeypatch.setattr(policy, "choose_threads", choose)
    monkeypatch.setattr(policy, "cpu_budget", lambda: 4.0)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # an explicit count would win over the choice
    seen: list = []

    def decoder(model, codec, max_rows, **options):
        seen.append(torch.get_num_threads())
        return DecodeBatch(model, codec, max_rows, **options)

    before = torch.get_num_threads()
    assert Settings().torch_threads == "auto"
    with serve(tiny_checkpoint, decoder=decoder, max_batch_rows=8) as (client, _):
        assert post(client, **FAST).status_code == 200
    assert asked[0] == ("musicrel-generation", 8, 1.0) and seen[0] == 3
    torch.set_num_threads(before)


def test_a_sample_of_fewer_than_two_notes_has_no_copy_and_fails_nothing(tiny_checkpoint, tmp_path):
    """Issue 23: its novelty record has no start time, which the response model refused: a 500 for the
    whole request, the good samples with it, and an error line at the end of the stream."""
    import json

    from musicrel.bench.genfuzz import with_novelty_index

    folder = with_novelty_index(tiny_checkpoint, tmp_path / "ckpt")
    one_note = motif(1)
    with serve(folder, batch_window_ms=0) as (indexed, _):
        plain = post(indexed, one_note, json=True, seconds="0.01", seed="1", num_samples="4")
        stream = indexed.post(
            "/v1/continuations/stream",
            files={"file": ("motif.mid", one_note, "audio/midi")},
            data={"seconds": "0.01", "seed": "1"},
        )
    assert plain.status_code == 200, plain.text
    short = [sample for sample in plain.json()["samples"] if sample["notes"] < 2]
    assert short, "no sample of fewer than two notes: the test no longer reaches the case"
    for sample in short:
        assert sample["novelty"]["notes"] == 0 and sample["novelty"]["start_time"] is None
    last = json.loads(stream.text.splitlines()[-1])
    assert last["type"] == "result", last
