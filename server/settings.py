"""Service settings: every limit is an environment variable prefixed MUSICREL_ (e.g. MUSICREL_MAX_QUEUE)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from musicrel.model.weights import DECODE_WEIGHTS, DEFAULT_DECODE_WEIGHTS

STATIC_DIR = Path(__file__).resolve().parent / "static"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MUSICREL_", extra="ignore")

    checkpoint: Path = Field(
        Path("checkpoints/default"), description="Folder with config.json + model.safetensors"
    )
    device: str = Field("cpu", description="torch device the model runs on (cpu, cuda, cuda:1, ...)")
    # int8 (the default): every layer the CPU's int8 kernel takes (held-out NLL within 0.001 nats/token);
    # auto: int8 where a probe at load finds it decodes faster here (musicrel.model.checkpoint says why it is
    # not the default), else float32; float32: the weights as trained.
    weights: Literal[DECODE_WEIGHTS] = Field(DEFAULT_DECODE_WEIGHTS, description="weights while decoding")
    # "process": the model and the decoding loop live in a child process, so request handling (multipart,
    # MIDI parsing and writing, HTTP) never competes with decoding for the GIL: a Python thread busy 5 % of
    # the time made decoding steps 10-25 % slower in the same process. "thread": all in this process.
    engine: Literal["process", "thread"] = Field("process", description="where the decoding loop runs")
    # Generation runs on a worker thread, where several OpenMP threads measured up to 2x SLOWER than one on a
    # 2-core machine (in the engine process too: 752 vs 1,004 tokens/s at concurrency 8, the same serially),
    # as they compete with request handling for the cores (`musicrel bench serve --torch-threads N` measures
    # yours). "auto": the CPUs other processes leave free, less one for request handling, at most one per two
    # rows (runtime.threads; re-checked every few seconds while decoding, so a neighbour that starts later
    # is met): 1 on that machine, more on one with free cores. A number fixes it; None keeps torch's
    # default (one per core, whatever else runs).
    torch_threads: Annotated[int, Field(ge=1, le=256)] | Literal["auto"] | None = Field(
        "auto", description="torch.set_num_threads for generation"
    )

    # Bodies beyond this are refused with 413 before any multipart parsing.
    max_upload_bytes: int = Field(2_000_000, ge=1024)
    # A slow upload holds a connection and a task for as long as it trickles: past the grace period its
    # average rate must stay above upload_min_bytes_per_s, and the whole body must arrive within
    # upload_timeout_s (else 408, connection closed). Kestrel's default minimum is 240 B/s after 5 s; a MIDI
    # motif is tens of KB, so 1 KB/s refuses trickles sooner and still lets a slow phone through.
    upload_timeout_s: float = Field(60.0, gt=0, description="longest time a request body may take to arrive")
    upload_min_bytes_per_s: float = Field(1024.0, ge=0, description="slowest average upload rate; 0: off")
    upload_grace_s: float = Field(5.0, ge=0, description="time an upload has before its rate is checked")
    max_uploads: int = Field(32, ge=1, description="request bodies being received at once; more get 429")
    # Continuation requests admitted and not yet generating (uploading, parsing or queued for the worker);
    # one more gets 429 before its upload is read.
    max_queue: int = Field(64, ge=1)
    retry_after_s: int = Field(
        2, ge=1, description="Retry-After with 503, and with 429 until the queue's drain rate is measured"
    )
    # Continuous batching: requests join the running batch between decoding steps. Only when the worker is
    # idle does the first request wait this long for others to start with it (one shared prefill).
    batch_window_ms: float = Field(20.0, ge=0, le=10_000)
    max_batch_rows: int = Field(
        16, ge=1, le=1024, description="samples decoded together in the running batch (its KV cache size)"
    )
    # A primer's K/V is a few MB at most (max_seq_len x layers x d_model x 2 floats): cheap to keep, and users
    # re-roll the same motif with new seeds. The server process keeps as many parsed motifs (no parse again).
    primer_cache: int = Field(
        16,
        ge=0,
        le=1024,
        description="recent distinct motifs whose parse and K/V are kept (a re-roll skips both); 0: off",
    )
    # The upload has its own bounds above; this one runs from the end of the upload to the answer.
    request_timeout_s: float = Field(120.0, gt=0, description="per-request deadline, parsing to answer (504)")
    drain_timeout_s: float = Field(
        30.0, ge=0, description="after SIGTERM, how long in-flight requests may run"
    )
    parse_threads: int = Field(2, ge=1, le=64, description="threads that parse uploaded MIDI")
    disconnect_poll_s: float = Field(
        0.1, gt=0, le=5, description="how often a waiting request checks its client"
    )

    # Bounds of the request fields beyond the fixed sanity bounds in schemas.py.
    max_seconds: float = Field(60.0, gt=0, le=600, description="longest continuation a request may ask for")
    max_primer_seconds: float = Field(120.0, gt=0, le=3600)
    max_num_samples: int = Field(4, ge=1, le=64)

    # The accompaniment model (POST /v1/accompaniments, server/tasks/accompaniment.py): loaded at start-up
    # when the folder holds a checkpoint; without one the route answers 503 no_accompaniment_model.
    accompany_checkpoint: Path = Field(
        Path("checkpoints/accompany"),
        description="folder of the accompaniment model (melody tokens, or instruments)",
    )
    # An accompaniment is generated as long as its melody (about 4x real time on 2 cores), one at a time.
    max_melody_seconds: float = Field(300.0, gt=0, le=3600, description="longest melody accompanied (422)")

    # The infill model (POST /v1/infills, server/tasks/infill.py): loaded at start-up when the folder holds a
    # checkpoint whose codec has infill tokens; without one the route answers 503 infill_unavailable.
    # Unset: the continuation checkpoint when it fills gaps itself, else checkpoints/infill
    # (server.model.infill_folder).
    infill_checkpoint: Path | None = Field(
        None,
        description="folder of the infill model (FUTURE/PAST/FILL tokens); default: the continuation "
        "checkpoint when it has them, else checkpoints/infill",
    )

    # The instruments model (musicrel.midi.instruments.wants_instruments routes to it): when the continuation
    # model hears one piano stream, an upload it would flatten (drums, or more than one instrument in the
    # tracks read: a quartet, a band) is continued by this one, each instrument on its own track, and filled
    # by it too when it fills gaps; a piano upload stays on the piano models. Loaded at start-up when the
    # folder holds a checkpoint whose codec has instruments; a folder without one turns the routing off.
    instruments_checkpoint: Path = Field(
        Path("checkpoints/multi"),
        description="folder of the model for uploads with drums or several instruments (instruments codec)",
    )

    warmup: bool = Field(True, description="run a tiny generation before reporting ready")
    static_dir: Path = STATIC_DIR
