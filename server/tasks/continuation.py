"""POST /v1/continuations and /v1/continuations/stream: a motif in, its continuations out (whole, or their
notes while they are generated); and POST /v1/motifs, a motif parsed and its primer prefilled ahead of them.

The motif is parsed here (a parse cache keeps the last MUSICREL_PRIMER_CACHE, so a re-roll is not parsed
again), the job joins the engine's running batch, and the samples' MIDI is rendered from their tokens here,
on a render thread, with what each copied from the training data when the checkpoint ships a novelty index.
A model with instruments keeps the motif's tracks: the answer lists them (`tracks`, and each sample's own),
the stream's note_on says each note's `track` and `instrument`, and `program` is refused (422
program_with_instruments: docs/INSTRUMENTS.md).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
from fastapi import UploadFile

from musicrel.evaluation.novelty import longest_copy
from musicrel.generation.controls import gm_program_name
from musicrel.generation.primer import Primer, prepare_primer, refuse_program, render_result
from musicrel.generation.sampling import SamplingParams
from musicrel.generation.streaming import NoteStream
from musicrel.midi.instruments import asked_instruments, wants_instruments
from server.admission import Ticket
from server.jobs import Continue, Job
from server.openapi import form_limits
from server.schemas import (
    BatchInfo,
    ContinuationParams,
    ContinuationResponse,
    ContinuationTimings,
    Copy,
    InstrumentInfo,
    PreparedMotif,
    PrimerInfo,
    Sample,
    TrackInfo,
)
from server.service import Service
from server.submit import parse_on_thread, read_upload, wait_for_result
from server.tasks.base import NoteSource, Parsed, Task, b64, job_timings, midi_bytes, ms, submit

if TYPE_CHECKING:
    from musicrel.generation.sampling import ContinuationResult

log = logging.getLogger("musicrel.server")

# Preparing a motif decodes one token: enough for the engine to prefill the primer and keep its K/V.
PREPARE_SAMPLING = SamplingParams(seconds=0.01, max_new_tokens=1, seed=0, num_samples=1)


def primer_key(data: bytes, params: ContinuationParams, asked: bool | None = None) -> tuple:
    return (hashlib.sha256(data).digest(), params.primer_seconds, params.motif_end, params.tracks, asked)


def _motif(
    service: Service, data: bytes, params: ContinuationParams, asked: bool | None
) -> tuple[Primer, str]:
    """(the primer, the engine's model that continues it): the upload read once, routed (the instruments
    model takes what the continuation model would flatten: `wants_instruments`) and cut by that model's
    codec."""
    assert service.view is not None  # admitted only once loaded
    view, model, tracks = service.view, Continue.model, params.track_selection()
    pm = view.codec.read(data)
    if service.instruments is not None and wants_instruments(pm, tracks, asked):
        view, model = service.instruments, "instruments"
    primer = prepare_primer(
        view.codec,
        pm,
        primer_seconds=params.primer_seconds,
        tracks=tracks,
        max_tokens=view.max_primer_tokens,
        motif_end=params.motif_end,
    )
    return primer, model


async def parse_motif(
    service: Service, data: bytes, params: ContinuationParams, asked: bool | None = None
) -> tuple[Primer, str]:
    """The motif to continue and the engine's model that continues it (on a parse thread, unless it is one of
    the last MUSICREL_PRIMER_CACHE motifs parsed with the same primer settings); the codec's InvalidMidiError
    for unusable MIDI. `asked`: what the controls say of the instruments model (`asked_instruments`)."""
    # The same motif again (a re-roll with another seed) is not parsed again: a dense file's parse and
    # primer window take 100-600 ms on 2 busy cores, most of the wait for a streamed first note.
    key = primer_key(data, params, asked)
    parsed = service.parsed_primers.get(key)
    if parsed is not None:
        return parsed
    parsed = await parse_on_thread(service, partial(_motif, service, data, params, asked))
    service.parsed_primers.put(key, parsed)
    return parsed


def primer_info(primer: Primer, tokens: int) -> PrimerInfo:
    return PrimerInfo(
        tokens=int(tokens),
        start_time=float(primer.start_time),
        end_time=float(primer.end_time),
        requested_seconds=float(primer.requested_seconds or primer.end_time - primer.start_time),
        cropped=bool(primer.cropped),
        tempo=float(primer.tempo),
        program=int(primer.program),
        instrument=gm_program_name(primer.program),
        program_reason=primer.program_reason,
        notes=len(primer.notes),
    )


def instrument_info(primer: Primer, applied: dict | None) -> InstrumentInfo:
    """The instrument the samples are written with: the program field's when set, else the motif's."""
    if applied and "program" in applied:
        return InstrumentInfo(
            program=applied["program"], name=applied["instrument"], reason="the program field"
        )
    program = int(primer.program)
    return InstrumentInfo(program=program, name=gm_program_name(program), reason=primer.program_reason)


def motif_tracks(primer: Primer) -> list[TrackInfo] | None:
    """The motif's tracks, which every sample's file starts with; None for a piano model."""
    return None if primer.tracks is None else [TrackInfo(**t) for t in primer.tracks.describe()]


def write_samples(
    codec, primer: Primer, params: SamplingParams, result: ContinuationResult, novelty=None
) -> list[Sample]:
    """Each sample's MIDI file (rendered from its tokens here, on a render thread, never in the decoding
    loop) and its description; with a novelty index, what it copied (the generated notes alone: the motif
    may itself be a training piece)."""
    out = []
    midis = render_result(codec, primer, result, params.include_primer)
    for i, (midi, tokens) in enumerate(zip(midis, result.tokens, strict=True)):
        sample = Sample(
            index=i,
            midi_base64=b64(midi_bytes(midi)),
            new_tokens=len(tokens),
            notes=sum(len(inst.notes) for inst in midi.instruments),
            duration_s=round(float(midi.get_end_time()), 4),
            tracks=None if primer.tracks is None else primer.tracks.describe_file(midi),
            novelty=None if novelty is None else Copy(**longest_copy(novelty, codec, tokens)),
        )
        out.append(sample)
    return out


class ContinuationTask(Task):
    name = "continuation"
    path = "/v1/continuations"
    form = ContinuationParams
    response = ContinuationResponse
    summary = "Continue an uploaded MIDI motif"
    file_description = (
        "the MIDI motif: a Standard MIDI File (it starts with MThd). An empty part is out of bounds (422 "
        "invalid_request); bytes that are not usable MIDI get 422 with the codec's code (not_midi, ...)"
    )
    midi_description = "audio/midi (sample 0); JSON with every sample for Accept: application/json"
    stream_summary = "Continue an uploaded MIDI motif, streaming its notes as they are generated"
    stream_description = (
        "NDJSON events, one JSON object per line: `start` (seed, settings, primer), `note_on` / `note_off` "
        "/ `note_drop` per sample as generation goes, then `result` (the plain JSON response, every "
        "sample's MIDI in base64) or `error` (status and the error body the plain endpoint would have "
        "answered). Failures before the job is queued are plain JSON errors."
    )
    warnings_header = False

    def limits(self, service: Service) -> dict[str, float]:
        codec = service.codec
        return form_limits(service.settings, codec.vocab_size if codec is not None else None)

    async def parse(self, service: Service, data: bytes, form: Any) -> tuple[Any, Continue, Primer]:
        params = form.library_params()
        primer, model = await parse_motif(service, data, form, asked_instruments(params.controls))
        refuse_program(primer, params.controls)
        return form, Continue(primer, params, model), primer

    async def answer(
        self, service: Service, request: Parsed, job: Job, result: ContinuationResult
    ) -> ContinuationResponse:
        primer, model = request.found, request.job.model
        # the novelty index is of the continuation model's training data
        novelty = service.novelty if model == Continue.model else None
        samples = await anyio.to_thread.run_sync(
            write_samples,
            service.view_of(model).codec,
            primer,
            request.job.params,
            result,
            novelty,
            limiter=service.render_limiter,
        )
        timings = ContinuationTimings(
            **job_timings(request, job, time.monotonic()),
            prefill_ms=ms(result.timings["prefill"]) if "prefill" in result.timings else None,
            decode_ms=ms(result.timings["decode"]) if "decode" in result.timings else None,
        )
        log.info(
            "continuation: seed=%d primer=%d new=%d batch=%d/%d parse=%.0fms queue=%.0fms gen=%.0fms",
            result.seed,
            result.primer_tokens,
            result.new_tokens,
            job.batch_jobs,
            job.batch_rows,
            timings.parse_ms,
            timings.queue_ms,
            timings.generation_ms,
        )
        return ContinuationResponse(
            seed=int(result.seed),
            settings=request.form.model_copy(update={"seed": int(result.seed)}),
            primer=primer_info(primer, result.primer_tokens),
            samples=samples,
            new_tokens=int(result.new_tokens),
            stopped=bool(result.stopped),
            instrument=instrument_info(primer, result.controls),
            tracks=motif_tracks(primer),
            model=model,
            controls=result.controls,
            warnings=list(result.warnings),
            timings=timings,
            batch=BatchInfo(requests=job.batch_jobs, rows=job.batch_rows),
        )

    def headers(self, answer: ContinuationResponse) -> dict[str, str]:
        return {
            "X-Musicrel-Tokens": str(answer.samples[0].new_tokens),
            "X-Musicrel-Primer-Tokens": str(answer.primer.tokens),
            "X-Musicrel-Samples": str(len(answer.samples)),
            "X-Musicrel-Stopped": str(answer.stopped).lower(),
            "X-Musicrel-Model": answer.model,
        }

    def note_source(self, service: Service, request: Parsed) -> NoteSource:
        primer, n, codec = request.found, request.form.num_samples, service.view_of(request.job.model).codec
        return NoteSource([
            NoteStream(codec, primer.tokens, primer.tail_steps,
                       placer=None if primer.tracks is None else primer.tracks.placer())
            for _ in range(n)
        ])  # fmt: skip

    def start_fields(self, request: Parsed) -> dict[str, Any]:
        primer = primer_info(request.found, len(request.found.tokens))
        fields: dict[str, Any] = {"model": request.job.model, "primer": primer.model_dump(mode="json")}
        tracks = motif_tracks(request.found)
        if tracks is not None:  # a model with instruments: the tracks the notes' `track` indices refer to
            fields["tracks"] = [t.model_dump(mode="json") for t in tracks]
        return fields


async def prepare_motif(
    service: Service,
    file: UploadFile,
    params: ContinuationParams,
    ticket: Ticket | None,
    is_disconnected: Callable[[], Awaitable[bool]],
) -> PreparedMotif | None:
    """Parse the motif and prefill its primer now, so that a continuation of it (the same bytes,
    primer_seconds, motif_end and tracks) finds both in the caches (MUSICREL_PRIMER_CACHE, least recently
    used first out) and starts decoding at once. None when the client left."""
    start = time.monotonic()
    data = await read_upload(file)
    cached = primer_key(data, params) in service.parsed_primers
    primer, model = await parse_motif(service, data, params)
    parsed = time.monotonic()
    prefill_ms = None
    if not cached:  # prefilled in the batch of the model that will continue it (its primer cache)
        deadline = start + service.settings.request_timeout_s
        job = submit(service, Continue(primer, PREPARE_SAMPLING, model), deadline, ticket)
        result = await wait_for_result(job, is_disconnected, service.settings.disconnect_poll_s)
        if result is None:
            return None
        prefill_ms = ms(result.timings["prefill"]) if "prefill" in result.timings else None
    return PreparedMotif(
        sha256=hashlib.sha256(data).hexdigest(),
        primer=primer_info(primer, len(primer.tokens)),
        cached=cached,
        parse_ms=ms(parsed - start),
        prefill_ms=prefill_ms,
    )


CONTINUATION = ContinuationTask()
