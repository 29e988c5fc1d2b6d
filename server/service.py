"""What the app holds while it runs: what it reads of each checkpoint (server/model.py: codec and primer
window; the weights and the models' cards are the engine's), the generation worker, the parse limiter, and the
readiness / draining state."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from musicrel.generation.lru import LRU
from server.admission import Admission, Ticket
from server.engine import EngineProcess
from server.errors import ApiError
from server.metrics import Metrics
from server.model import (
    CheckpointView,
    LoadedModel,
    ModelCard,
    infill_folder,
    load_accompanist,
    load_infiller,
    load_instrumentalist,
    view_accompanist,
    view_infiller,
    view_instruments,
)
from server.schemas import AccompanimentParams
from server.settings import Settings
from server.worker import BatchPolicy, GenerationThread, GenerationWorker, warm_up

if TYPE_CHECKING:
    from musicrel.evaluation.novelty import NoveltyIndex
    from musicrel.generation.primer import Primer
    from musicrel.midi.codec import EventCodec

log = logging.getLogger("musicrel.server")

# The models a server may hold, by the names /v1/model uses.
MODELS = ("continuation", "accompaniment", "infill", "instruments")


class Service:
    def __init__(self, settings: Settings, metrics: Metrics, decoder: Callable[..., Any] | None = None):
        """`decoder(model, codec, max_rows, primer_cache=n)` makes the worker's running batch (DecodeBatch
        when None; tests pass a subclass that holds the worker or fails on purpose)."""
        self.settings = settings
        self.metrics = metrics
        self.decoder = decoder
        self.view: CheckpointView | None = None  # the continuation model, as read from its config
        self.codec: EventCodec | None = None  # its codec (the view's)
        self.loaded: LoadedModel | None = None  # the weights, held here only with MUSICREL_ENGINE=thread
        # The accompaniment model (MUSICREL_ACCOMPANY_CHECKPOINT), or why there is none.
        self.accompaniment: CheckpointView | None = None
        self.accompaniment_unavailable = "not loaded yet"
        self.accompanist: LoadedModel | None = None  # its weights, with MUSICREL_ENGINE=thread only
        # The infill model (MUSICREL_INFILL_CHECKPOINT), or why there is none.
        self.infill: CheckpointView | None = None
        self.infill_unavailable = "not loaded yet"
        self.infiller: LoadedModel | None = None  # its weights, with MUSICREL_ENGINE=thread only
        # The instruments model (MUSICREL_INSTRUMENTS_CHECKPOINT), for uploads the continuation model would
        # flatten, or why there is none.
        self.instruments: CheckpointView | None = None
        self.instruments_unavailable = "not loaded yet"
        self.instrumentalist: LoadedModel | None = None  # its weights, with MUSICREL_ENGINE=thread only
        self.novelty: NoveltyIndex | None = None
        self.worker: GenerationWorker | None = None
        self.admission = Admission(settings, metrics)
        self.parse_limiter: anyio.CapacityLimiter | None = None
        # Recently parsed motifs and the model that continues each, by (sha256 of the upload, primer_seconds,
        # motif_end, tracks, what the controls ask of the instruments model); used on the loop only.
        self.parsed_primers: LRU[tuple[Primer, str]] = LRU(settings.primer_cache)
        self.render_limiter: anyio.CapacityLimiter | None = None
        self.draining = False
        self.in_flight = 0  # continuation requests between arrival and answer (MetricsMiddleware)
        self._previous_sigterm: Any = None
        self._drain_task: asyncio.Task | None = None

    # ---- start-up --------------------------------------------------------------------------------

    def load(self) -> None:
        """Read both checkpoints (blocking: called in a thread during start-up). With the engine in its own
        process this process loads no weights: the views (codec, primer window) come from the configs, the
        models' cards from the engine once it is ready. With MUSICREL_ENGINE=thread the models load here, for
        the worker."""
        from musicrel.evaluation.novelty import INDEX_FILE, load_index

        folder = Path(self.settings.checkpoint)
        self.view = CheckpointView.read(folder)
        self.codec = self.view.codec
        if not self.uses_engine_process:
            self.loaded = LoadedModel.load(folder, device=self.settings.device, weights=self.settings.weights)
        # What a sample copied from the training data is reported when the checkpoint ships the index.
        self.novelty = load_index(folder) if (folder / INDEX_FILE).is_file() else None
        self.admission.calibrate(self.codec)
        self._load_accompaniment()
        self._load_infill()
        self._load_instruments()

    def _load_accompaniment(self) -> None:
        """No folder is no error: the service runs without the route (503 no_accompaniment_model)."""
        folder = self.settings.accompany_checkpoint
        self.accompaniment, self.accompaniment_unavailable = view_accompanist(folder)
        if self.accompaniment is None:
            why = self.accompaniment_unavailable
            (log.warning if "melody tokens" in why else log.info)("accompaniment: %s", why)
        elif not self.uses_engine_process:
            self.accompanist = load_accompanist(folder, weights=self.settings.weights)

    def _load_infill(self) -> None:
        """No folder is no error: the service runs without POST /v1/infills (503 infill_unavailable)."""
        folder = infill_folder(self.settings.infill_checkpoint, self.settings.checkpoint)
        self.infill, self.infill_unavailable = view_infiller(folder)
        if self.infill is None:
            why = self.infill_unavailable
            (log.warning if "infill tokens" in why else log.info)("infill: %s", why)
        elif not self.uses_engine_process:
            self.infiller = load_infiller(folder, weights=self.settings.weights)

    def _load_instruments(self) -> None:
        """No folder is no error: every upload then goes to the continuation model, as one piano stream."""
        assert self.view is not None
        folder = self.settings.instruments_checkpoint
        self.instruments, self.instruments_unavailable = view_instruments(folder, self.view)
        if self.instruments is None:
            log.info("instruments: %s", self.instruments_unavailable)
        elif not self.uses_engine_process:
            self.instrumentalist = load_instrumentalist(
                folder, self.view.folder, weights=self.settings.weights
            )

    def _views(self) -> dict[str, CheckpointView | None]:
        """Each of MODELS as this process reads it (None: the server has no such model)."""
        return {
            "continuation": self.view,
            "accompaniment": self.accompaniment,
            "infill": self.infill,
            "instruments": self.instruments,
        }

    def view_of(self, model: str) -> CheckpointView:
        """The view of the engine's model `model` (a job request's `model`) that the server has."""
        view = self._views()[model]
        assert view is not None  # a request names only a model the server has
        return view

    def model_card(self, name: str) -> ModelCard | None:
        """The card of model `name` (one of MODELS): from the model loaded here, or from the engine once it
        is ready; None before, and when the server has no such model."""
        if self._views()[name] is None:
            return None
        here = {
            "continuation": self.loaded,
            "accompaniment": self.accompanist,
            "infill": self.infiller,
            "instruments": self.instrumentalist,
        }[name]
        if here is not None:
            return here.card
        ready = self.worker.cards if isinstance(self.worker, EngineProcess) else None
        if ready is None:
            return None
        return {
            "continuation": ready.card,
            "accompaniment": ready.accompaniment,
            "infill": ready.infill,
            "instruments": ready.instruments,
        }[name]

    def infill_info(self) -> dict[str, Any] | None:
        """What /v1/model says of the infill model: null when the route is unavailable."""
        from musicrel.generation.span import MAX_SPAN_SECONDS

        card = self.model_card("infill")
        if card is None:
            return None
        info = {key: value for key, value in card.info.items() if key != "codec"}
        return {**info, "max_span_seconds": MAX_SPAN_SECONDS}

    @property
    def info(self) -> dict[str, Any]:
        """What /v1/model says of the continuation model; empty until it is loaded."""
        card = self.model_card("continuation")
        if card is None:
            return {}
        novelty = self.novelty and {"pieces": len(self.novelty.names), "notes": self.novelty.notes}
        return {**card.info, "novelty_index": novelty}

    def instruments_info(self) -> dict[str, Any] | None:
        """What /v1/model says of the instruments model: null when the server has none (every upload then
        goes to the continuation model)."""
        card = self.model_card("instruments")
        if card is None:
            return None
        info = {key: value for key, value in card.info.items() if key != "codec"}
        assert self.instruments is not None
        return {**info, "fills": self.instruments.infills}

    def accompaniment_info(self) -> dict[str, Any] | None:
        """What /v1/model says of the accompaniment model: null when the route is unavailable."""
        card = self.model_card("accompaniment")
        if card is None:
            return None
        info = {key: value for key, value in card.info.items() if key != "codec"}
        # The page sets its shared sampling fields to these when it switches to accompanying.
        defaults = AccompanimentParams().model_dump(include={"temperature", "top_k", "top_p"})
        return {**info, "max_melody_seconds": self.settings.max_melody_seconds, "defaults": defaults}

    @property
    def uses_engine_process(self) -> bool:
        """A decoder given in code (tests) can only run in this process."""
        return self.settings.engine == "process" and self.decoder is None

    def start(self) -> None:
        s = self.settings
        self.parse_limiter = anyio.CapacityLimiter(s.parse_threads)
        # Writing a finished result's MIDI has threads of its own: behind the parse limiter, a finished
        # continuation waited for every upload queued to be parsed (a burst of large files: all answers came
        # at the end, 76 s, though each had generated within 2 s).
        self.render_limiter = anyio.CapacityLimiter(s.parse_threads)
        if self.uses_engine_process:
            self.worker = EngineProcess(s, self.metrics, on_dequeue=self.admission.departed)
        else:
            assert self.loaded is not None  # load() loads the model here for a worker in this process
            self.worker = GenerationThread(
                self.loaded.model,
                self.codec,
                BatchPolicy.from_settings(s),
                accompanist=self.accompanist,
                infiller=self.infiller,
                instrumentalist=self.instrumentalist,
                metrics=self.metrics,
                decoder=self.decoder,
                warmup=partial(warm_up, self.codec) if s.warmup else None,
                on_dequeue=self.admission.departed,
            )
        self.worker.start()

    def stop(self) -> None:
        self.draining = True
        if self.worker is not None:
            self.worker.stop(timeout=self.settings.drain_timeout_s)
        if self._previous_sigterm is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, self._previous_sigterm)

    # ---- state -----------------------------------------------------------------------------------

    @property
    def warm(self) -> bool:
        return self.worker is not None and self.worker.ready.is_set()

    @property
    def ready(self) -> bool:
        return self.warm and not self.draining

    def not_ready_reason(self, draining: bool | None = None) -> tuple[str, str]:
        if self.draining if draining is None else draining:
            return "draining", "the service is shutting down; retry on another instance"
        if self.worker is not None and self.worker.failed:
            return "not_ready", self.worker.failed
        return "not_ready", "the model is loading or warming up"

    def check_accepting(self, draining: bool) -> None:
        """`draining`: whether the service was draining when the request arrived."""
        if draining or not self.warm:
            code, message = self.not_ready_reason(draining)
            raise ApiError(503, code, message, headers={"Retry-After": str(self.settings.retry_after_s)})

    def admit(self, draining: bool, size: int | None = None) -> Ticket:
        """Before a continuation's upload (`size` bytes, None if chunked) is read: 503 unless accepting, 429
        when the queue is full."""
        self.check_accepting(draining)
        assert self.worker is not None  # check_accepting refuses until the worker is warm
        return self.admission.admit(self.worker.queue_depth, size)

    # ---- draining on SIGTERM ---------------------------------------------------------------------

    def install_sigterm_handler(self) -> None:
        """On SIGTERM: turn /readyz to 503 and refuse new work at once, let the requests in flight finish
        (up to MUSICREL_DRAIN_TIMEOUT_S), and only then hand the signal to uvicorn, which closes the sockets,
        waits for open responses and runs the lifespan shutdown. A second SIGTERM skips the wait."""
        if threading.current_thread() is not threading.main_thread():
            return  # signals can only be caught in the main thread (TestClient runs the app elsewhere)
        previous = signal.getsignal(signal.SIGTERM)
        if not callable(previous):
            return  # not under uvicorn's signal handling: leave the default behaviour alone
        loop = asyncio.get_running_loop()
        self._previous_sigterm = previous

        def on_sigterm(signum: int, frame: Any) -> None:
            if self.draining:
                previous(signum, frame)
                return
            self.draining = True
            log.info(
                "SIGTERM: draining %d request(s) for up to %.0f s",
                self.in_flight,
                self.settings.drain_timeout_s,
            )
            loop.call_soon_threadsafe(self._start_drain, loop, previous, signum)

        signal.signal(signal.SIGTERM, on_sigterm)

    def _start_drain(self, loop: asyncio.AbstractEventLoop, handler: Any, signum: int) -> None:
        self._drain_task = loop.create_task(self._drain_then(handler, signum))

    async def _drain_then(self, handler: Any, signum: int) -> None:
        deadline = time.monotonic() + self.settings.drain_timeout_s
        while self.in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.in_flight:
            log.warning("drain timeout: %d request(s) still running", self.in_flight)
        handler(signum, None)
