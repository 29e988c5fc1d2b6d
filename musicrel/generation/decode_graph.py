"""The decode step with fixed shapes, for a GPU: `StaticStep`, what `DecodeBatch.step` runs in its "static"
and "graph" modes (issue 43). On a GPU a step of the shipped model took 4.9 ms at batch 1 (H200, 2026-11-26):
the model 2.6 ms and the grammar, controls and sampler 2.3 ms, both a few hundred kernels too small to fill
the GPU, each waiting on its launch. A CUDA graph launches them all at once, and it replays only what has
fixed shapes and addresses; so here:

- every tensor a step reads or writes per row (`slots`: the sampler's settings, the rows' random streams, the
  grammar's and density loop's state) lives in a buffer of `bucket(n)` rows, the live rows first: the graph of
  a bucket serves any number of live rows up to it. The rows past the live ones are padding, left as they
  were (a copy of a real row's state, or a row that left): rows never read one another (the model, the
  grammar and the sampler all work row by row), so padding never changes a live row's tokens (tested);
- the step runs at `bucket(n)` rows on those buffers (`_body`), and each state a step replaces instead of
  editing in place is copied back into its buffer at the end, so the buffers always hold the state and a
  replay moves them on by one step;
- the model's forward is `MusicTransformer.decode_static`: the rows' shared length is a tensor on the device
  (`pos`), attention runs over the whole preallocated cache, masked;
- which rows ended goes to the host without a wait and is read at the next step (`Ended`);
- between steps the live objects hold views of the buffers' first n rows, so everything else (admit, rows
  leaving, streaming) works on them as before; a change of the rows (`select`, `extend`) makes new tensors,
  and the next step copies them back into the buffers (`bind`).

"static" runs `_body` as it is (the CPU tests run it: the logic, the padding, the buckets); "graph" captures
it once per bucket and settings (`signature`) after one eager step (the warm-up) and replays it. Capture
that fails falls back to "static" for the batch, logged once.

Admission on a GPU (`rows_that_fit`): the KV cache is preallocated for the rows the batch admits, at the whole
window, so the batch takes at most the rows whose cache fits KV_MEMORY_SHARE of the GPU's free memory at its
start (the rest: prefill's activations, the graphs, the primer cache, the other models).
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from musicrel.generation.controls import DensityLoop
from musicrel.generation.grammar import _GRAMMAR_ROWS, Grammar

log = logging.getLogger(__name__)

STEP_MODES = ("auto", "eager", "static", "graph")
# What "auto" means in this process when set (a device check's rerun with the eager step on a GPU, say):
# one of STEP_MODES; DecodeBatch's own argument, when not "auto", wins.
STEP_MODE_ENV = "MUSICREL_DECODE_STEP"
# what a row carries in `decode_rows.LiveRows`, per row
ROW_FIELDS = ("pending", "temperature", "top_k", "top_p", "shift_temperature", "drawn", "max_new")
RANDOM_FIELDS = ("state", "step")
KV_MEMORY_SHARE = 0.5  # of the GPU's free memory at a batch's start, for its preallocated KV cache
# StaticSteps a batch keeps (buckets x the settings that change a step's operations), the least recently used
# dropped past it: 11 buckets for 1,024 rows, a few settings each
MAX_STATIC_STEPS = 32


def buckets(max_rows: int) -> list[int]:
    """Every bucket a batch of max_rows rows steps at, smallest first."""
    return sorted({bucket(n, max_rows) for n in (1 << i for i in range(max_rows.bit_length() + 1))})


def bucket(n: int, max_rows: int) -> int:
    """The rows a step of `n` live rows runs at: the next power of two, at most max_rows (a graph per bucket:
    11 at most for 1,024 rows; the padding costs at most what the live rows cost)."""
    if n < 1:
        raise ValueError(f"a step needs a row, got {n}")
    return min(max_rows, 1 << (n - 1).bit_length())


def rows_that_fit(model, rows: int, free_bytes: int, share: float = KV_MEMORY_SHARE) -> int:
    """The rows of `rows` whose whole-window KV cache (`kv_bytes_per_row`) fits `share` of `free_bytes`, at
    least 1."""
    return max(1, min(rows, int(share * free_bytes) // model.kv_bytes_per_row()))


def resolve_mode(mode: str, model, device: torch.device) -> str:
    """`mode` (STEP_MODES) for this model and device: "auto" is what STEP_MODE_ENV says when set, else
    "graph" on a GPU for a model `decode_static` takes, else "eager" (the CPU's step, unchanged). ValueError
    for another name."""
    if mode == "auto":
        mode = os.environ.get(STEP_MODE_ENV) or "auto"
    if mode not in STEP_MODES:
        raise ValueError(f"step mode must be one of {', '.join(STEP_MODES)}, got {mode!r}")
    if mode == "auto":
        return "graph" if device.type == "cuda" and model.supports_static else "eager"
    if mode != "eager" and not model.supports_static:
        return "eager"
    if mode == "graph" and device.type != "cuda":
        return "static"  # nothing to capture: the same step, run as it is
    return mode


def slots(live) -> list[tuple[object, str]]:
    """(object, attribute) of every per-row tensor a step reads or writes, in a fixed order. The random
    streams' state is brought up to date first (an eager step's `RowRandom.ahead` leaves it behind)."""
    live.random.flush()
    grammar = live.grammar
    return (
        [(live, name) for name in ROW_FIELDS]
        + [(live.random, name) for name in RANDOM_FIELDS]
        + [(grammar, name) for name in _GRAMMAR_ROWS]
        + [(grammar.density, name) for name in DensityLoop.ROWS]
    )


def supported(live) -> bool:
    """Whether a static step takes these rows: the continuation grammar itself (a subclass may carry state
    per row that `slots` does not name), without instruments (whose step asks the device)."""
    return type(live.grammar) is Grammar and live.grammar.inst is None


def signature(live) -> tuple:
    """What a captured step depends on besides the bucket: the Python flags that choose its operations and
    each state's shape past the rows (a chord schedule's length) and dtype. (`any_control` alone chooses
    none: with no control rule on, `Grammar._steer` runs no operation, so rows given empty controls share
    the graph of rows given none.)"""
    g = live.grammar
    flags = (live.truncate, live.reshape, live.scale, g.any_density, g.any_pitch, g.any_chords, g.any_cap)
    shapes = tuple((tuple(getattr(o, n).shape[1:]), getattr(o, n).dtype) for o, n in slots(live))
    return (type(g), flags, shapes)


class StaticStep:
    """One bucket's step for `batch` (a DecodeBatch whose cache is preallocated at the whole window): buffers
    of `rows` rows for every slot, the position on the device, and once captured its CUDA graph."""

    def __init__(self, batch, rows: int):
        live = batch.live
        n = len(batch.rows)
        self.rows = rows
        self.buffers: list[Tensor] = []
        for obj, name in slots(live):
            value = getattr(obj, name)
            buf = value.new_empty((rows, *value.shape[1:]))
            buf[n:] = value[:1]  # padding: a real row's state (rows never read one another)
            self.buffers.append(buf)
        self.pos = torch.zeros(1, dtype=torch.long, device=batch.device)
        self.pos_at: int | None = None  # the length `pos` holds, as the host last set or moved it
        k, v = batch._cache.k, batch._cache.v
        self.cache = replace(batch._cache, k=k[:, :rows], v=v[:, :rows], left_pad=batch.left_pad[:rows])
        self.vocab = batch.model.cfg.vocab_size
        self.graph = None
        self.done: Tensor | None = None  # the captured step's (rows,) bool output
        self.warm = False  # one eager step ran at these shapes (before a capture)
        # what a graph reads beyond the buffers and the model (the grammar's codec tables), kept alive with it
        self.kept: tuple = ()
        self.views: list[Tensor] = []

    def bound(self, batch) -> bool:
        """Whether the live objects still hold this step's views of their rows (no row joined or left)."""
        views = self.views
        if not views or views[0].size(0) != len(batch.rows):
            return False
        return all(
            getattr(obj, name) is view for (obj, name), view in zip(slots(batch.live), views, strict=True)
        )

    def bind(self, batch) -> None:
        """The live rows' state into the buffers' first n rows, the live objects holding views of them; the
        position from the batch's length. Only what changed since the last step is copied."""
        n = len(batch.rows)
        pairs = slots(batch.live)
        if len(self.views) != len(pairs) or self.views[0].size(0) != n:
            self.views = [buf[:n] for buf in self.buffers]
        for (obj, name), view in zip(pairs, self.views, strict=True):
            value = getattr(obj, name)
            if value is not view:
                view.copy_(value)
                setattr(obj, name, view)
        if self.pos_at != batch.length:
            self.pos.fill_(batch.length)
            self.pos_at = batch.length

    def _body(self, batch) -> Tensor:
        """One step of every buffer row: (rows,) bool, the rows that are done; the tokens are `pending`'s
        buffer. Runs as it is, or under capture (then it only records): it asks the device nothing."""
        live, grammar = batch.live, batch.live.grammar
        pairs = slots(live)
        for (obj, name), buf in zip(pairs, self.buffers, strict=True):
            setattr(obj, name, buf)
        logits = batch.model.decode_static(live.pending, self.cache, self.pos)
        token = live.draw(logits, batch.shifts)
        # a padding row must never index past the vocabulary (on a GPU that is a device-side assert)
        live.pending = grammar.advance(token.clamp_(max=self.vocab - 1))
        live.drawn += 1
        done = grammar.finished() | (live.drawn >= live.max_new)
        self.pos += 1
        for (obj, name), buf in zip(pairs, self.buffers, strict=True):
            value = getattr(obj, name)
            if value is not buf:  # replaced, not edited in place: back into the buffer
                buf.copy_(value)
            setattr(obj, name, buf)
        return done

    def run(self, batch, capture: bool, bound: bool = False) -> tuple[Tensor, Tensor]:
        """One step of the live rows (bound first, unless `bound` says they are): their (n,) tokens and (n,)
        done flags. With `capture`, the second step at these shapes captures the graph and every later one
        replays it."""
        if not bound:
            self.bind(batch)
        elif self.pos_at != batch.length:  # an eager step or a slide moved the rows' length
            self.pos.fill_(batch.length)
            self.pos_at = batch.length
        n = len(batch.rows)
        if capture and self.graph is None and self.warm:
            self._capture(batch)
        if self.graph is not None:
            self.graph.replay()
            done = self.done
        elif capture and not self.warm:
            # The warm-up, a real step, on the stream the capture will use (torch.cuda.graphs' recipe: lazy
            # initialisation, such as a BLAS handle's workspace, must not happen under capture).
            stream = self._stream(batch)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                done = self._body(batch)
            torch.cuda.current_stream().wait_stream(stream)
            self.warm = True
        else:
            done = self._body(batch)
            self.warm = True
        self.pos_at += 1
        if self.graph is None:  # `_body` left the full buffers in the objects (a replay changes none)
            for (obj, name), view in zip(slots(batch.live), self.views, strict=True):
                setattr(obj, name, view)
        return self.views[0], done[:n]

    def _capture(self, batch) -> None:
        live = batch.live
        live.grammar._constants()  # made now, outside the graph's memory
        graph = torch.cuda.CUDAGraph()
        stream = self._stream(batch)
        torch.cuda.synchronize()
        # capture_begin/end, not torch.cuda.graph(): that one also empties the allocator's caches (and in
        # some versions collects garbage) at every capture, stalling the engine's thread for every stream.
        # thread_local: the service's other threads may use CUDA meanwhile (their calls are not captured).
        try:
            with torch.cuda.stream(stream):
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    done = self._body(batch)
                finally:
                    graph.capture_end()
        except Exception:  # noqa: BLE001 - any failure of capture: the same step, uncaptured
            log.exception("capturing the decode step at %d rows failed: it runs uncaptured", self.rows)
            batch.step_mode = "static"
            # nothing recorded ran: the buffers hold the step's input; the objects may hold capture's tensors
            for (obj, name), view in zip(slots(live), self.views, strict=True):
                setattr(obj, name, view)
            return
        torch.cuda.current_stream().wait_stream(stream)
        # Captured, nothing ran: the buffers still hold this step's input. What the graph reads besides them
        # (the grammar's codec tables, the model) stays alive with it.
        self.graph, self.done, self.kept = graph, done, (live.grammar, live.grammar._constants())
        for (obj, name), view in zip(slots(live), self.views, strict=True):
            setattr(obj, name, view)  # `_body` left the full buffers in the objects

    @staticmethod
    def _stream(batch):
        """The batch's side stream for warm-ups and captures (one per batch, made when first needed)."""
        stream = getattr(batch, "_capture_stream", None)
        if stream is None:
            stream = batch._capture_stream = torch.cuda.Stream(device=batch.device)
        return stream


class Ended:
    """A static step's (n,) flags of the rows that ended, on their way to the host: copied without waiting
    (pinned memory on a GPU) and read at the next step, after that step is queued behind it."""

    def __init__(self, done: Tensor):
        if done.is_cuda:
            self.flags = torch.empty(done.shape, dtype=done.dtype, pin_memory=True)
            self.flags.copy_(done, non_blocking=True)
            self.event: torch.cuda.Event | None = torch.cuda.Event()
            self.event.record()
        else:
            self.flags, self.event = done.clone(), None

    def read(self, rows: int) -> np.ndarray:
        """(rows,) bool: the flags, False for the rows admitted since."""
        if self.event is not None:
            self.event.synchronize()  # that step only: the one queued since runs on
        late = np.zeros(rows, dtype=bool)
        late[: len(self.flags)] = self.flags.numpy()
        return late
