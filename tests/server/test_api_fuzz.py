"""schemathesis on the app's own OpenAPI, in-process, with every check it has: no 5xx, no response outside
the schema, no schema-valid request refused, no invalid one accepted. A short run (a few examples per
operation, positive and negative); `musicrel bench reliability --fuzz-api` is the long one against uvicorn.

A schema cannot say "a Standard MIDI File": positive cases upload a real motif (with the generated fields),
so any refusal is a failure; negative cases send what schemathesis makes of the file. The
bytes themselves are fuzzed by tests/musicrel/midi/test_parser_fuzz.py.

schemathesis' pytest plugin breaks on pytest 9 (`Function._nodeid`), so its strategies are driven with plain
hypothesis here."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.core.failures import FailureGroup

from server.app import create_app
from server.settings import Settings
from tests.server.conftest import MOTIF

# Per operation and mode; every check still runs on every operation. The long run sets more
# (`musicrel bench reliability --fuzz-api N`) and keeps the server's own limits.
LONG_RUN = "MUSICREL_FUZZ_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("MUSICREL_FUZZ_EXAMPLES", "6"))
# The short run's operator limits: the form's bounds come from them, so the schema is fuzzed as it is
# served, while a positive case asks for at most 20 s of music (the default length, which a case leaving the
# field out gets anyway) and 2 samples: the longest cases (60 s, 4 samples, streamed) were most of its time.
SHORT_LIMITS = {} if LONG_RUN else {"max_seconds": 20.0, "max_num_samples": 2}
READ_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def leaping_checkpoint(tmp_path_factory) -> Path:
    """A tiny model whose every step draws from one fixed distribution: time shifts of 0.5-1 s first, then
    notes, the rest far behind. Its first choice is a long shift whatever the temperatures (the shifts' lead
    survives their own temperature at its maximum, 10), so the greedy cases hypothesis likes (temperature
    1e-300, top_p 1e-250) end 20 s of music in about 40 steps; a random model's first choice can be a token
    that moves no time, and such a case ran its 4,000 steps (13 s of CPU). Sampled cases still write notes."""
    import torch

    from musicrel.midi.codec import EventCodec
    from musicrel.model.checkpoint import save_model
    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import MusicTransformer

    torch.manual_seed(0)
    codec = EventCodec()
    config = ModelConfig(
        vocab_size=codec.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=256
    )
    model = MusicTransformer(config)
    logits = torch.full((codec.vocab_size,), -5.0)
    steps = codec.config.max_shift_steps
    logits[codec.time_shift_offset + steps // 2 : codec.time_shift_offset + steps] = 8.0
    for offset in (codec.note_on_offset, codec.note_off_offset):
        logits[offset + 48 : offset + 85] = 6.0  # C3-C6
    with torch.no_grad():  # the last hidden state is the constant e_0, so the logits are the head's column 0
        model.ln_f.weight.zero_()
        model.ln_f.bias.zero_()
        model.ln_f.bias[0] = 1.0
        model.head.weight[:, 0] = logits
    folder = tmp_path_factory.mktemp("leaping_checkpoint")
    save_model(model, folder, codec=codec)
    return folder


# One app for the file: schemathesis' ASGI transport keeps an app's lifespan running until the process exits.
@pytest.fixture(scope="module")
def schema(leaping_checkpoint, tiny_accompany_checkpoint, tiny_infill_checkpoint):
    load_all_checks()
    settings = Settings(
        checkpoint=leaping_checkpoint,
        accompany_checkpoint=tiny_accompany_checkpoint,
        infill_checkpoint=tiny_infill_checkpoint,
        engine="thread",
        batch_window_ms=0,
        **SHORT_LIMITS,
    )
    app = create_app(settings)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    # The worker warms up in a thread of its own after the lifespan's start: a case sent before that is
    # answered 503 not_ready, rightly, and counted by the checks as a server error (it happened in CI).
    ready, deadline = schema["/readyz"]["GET"], time.monotonic() + 60
    while ready.Case().call().status_code != 200:
        assert time.monotonic() < deadline, "the app never became ready"
        time.sleep(0.02)
    return schema


def operations(schema) -> list:
    return [result.ok() for result in schema.get_all_operations()]


def with_motif(case):
    """The file a real motif, and any track index its only instrument, 0: which indices exist depends on the
    file, which the schema cannot say either (422 no_such_track); low_note <= high_note."""
    if isinstance(case.body, dict) and "file" in case.body:
        case.body["file"] = MOTIF
        if isinstance(case.body.get("track"), int):  # the accompaniment's melody track: the only one
            case.body["track"] = 0
        # Nor which spans it has music before and after (422 span_outside_music, nothing_before, ...): an
        # infill's span is one the motif (3.2 s of notes) can fill.
        # Bars too (which bars a file has is the file's): a span in bars becomes that one in seconds.
        if "first_bar" in case.body and "last_bar" in case.body:
            del case.body["first_bar"], case.body["last_bar"]
            case.body["start"], case.body["end"] = 1.0, 2.0
        if "start" in case.body and "end" in case.body:
            case.body["start"], case.body["end"] = 1.0, 2.0
        if isinstance(case.body.get("tracks"), str):
            case.body["tracks"] = re.sub("[0-9]+", "0", case.body["tracks"])
        # Nor which kind of model is served: a piano model refuses a list of instruments (422 no_instruments).
        if isinstance(case.body.get("instruments"), str) and case.body["instruments"].strip().lower() not in (
            "motif", "any", "",
        ):  # fmt: skip
            case.body["instruments"] = "motif"
        # Nor can it say that the lowest note is at most the highest (422 empty_range).
        low, high = case.body.get("low_note"), case.body.get("high_note")
        if isinstance(low, int) and isinstance(high, int) and low > high:
            case.body["low_note"], case.body["high_note"] = high, low
    return case


@pytest.mark.long(15)
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_every_operation_passes_every_check(schema, mode):
    checks = CHECKS.get_all()
    assert len(checks) >= 10  # all of them, not a default subset
    failures: list[str] = []
    unsatisfiable: list[str] = []
    calls = 0
    for operation in operations(schema):
        strategy = operation.as_strategy(mode)
        if mode == GenerationMode.POSITIVE:
            strategy = strategy.map(with_motif)

        @given(case=strategy)
        @settings(
            max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        def run(case) -> None:
            nonlocal calls
            calls += 1
            try:
                # schemathesis' default read timeout is 10 s between bytes: a stream of 20 s of sparse music
                # (a density of 35 notes/s under a 1-note cap and pitch 0 alone: 1,900 steps, 12 notes) went
                # quiet that long while other test files loaded both cores (CI's two xdist workers)
                case.call_and_validate(checks=checks, timeout=READ_TIMEOUT_S)
            except FailureGroup as group:  # collected, so one run reports every operation that fails
                failures.append(f"{case.operation.label}: {group}")

        try:
            run()
        except Unsatisfiable:  # no parameters and no body: nothing can be made invalid
            unsatisfiable.append(operation.label)
    assert "POST /v1/continuations" not in unsatisfiable
    assert calls >= EXAMPLES  # the run really sent requests
    assert not failures, "\n\n".join(failures[:5])


def test_the_continuation_route_is_in_the_fuzzed_schema(schema):
    labels = {operation.label for operation in operations(schema)}
    assert "POST /v1/continuations" in labels and "GET /v1/model" in labels
