"""Continuous batching, the one decode loop: `DecodeBatch` decodes the rows of many jobs together, one token
each per step, while jobs join and leave between steps. A job (`decode_job.DecodeJob`) is a prompt, a grammar
with one row per sample, its sampling settings and seed: a continuation (`continuation_job`, what `admit`
makes of a primer and `SamplingParams`; `generate_batch` runs a list of them to completion), an accompaniment
(`generation.accompaniment`: the melody's grammar) or an infill (`generation.infill.infill_job`: the
fill-in-the-middle prompt, the gap's grammar); the server's engine steps the last two beside its continuation
batch. `continue_midi`, the one-call library entry, is `generation.continuation`'s. A finished job's result
holds tokens: the caller renders them (`primer.render_result`), so no row waits while another job's MIDI is
written, and the engine process ships tokens, not MIDI objects.

The rows' per-row state is `decode_rows.LiveRows`, the fixed-shape step `decode_graph.StaticStep`. Over 450
lines on purpose: admit, step, the window slide and swap-remove all edit one cache layout (live rows first,
one shared length, per-row left padding), and they are read together or not at all.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from musicrel.errors import GenerationError, is_int
from musicrel.generation.decode import eval_mode, prefill
from musicrel.generation.decode_graph import (
    MAX_STATIC_STEPS,
    Ended,
    StaticStep,
    bucket,
    buckets,
    resolve_mode,
    rows_that_fit,
    supported,
)
from musicrel.generation.decode_graph import signature as decode_graph_signature
from musicrel.generation.decode_job import DecodeJob, check_params, check_tokens, continuation_job
from musicrel.generation.decode_rows import LiveJob, LiveRow, LiveRows
from musicrel.generation.grammar import Grammar
from musicrel.generation.lru import LRU
from musicrel.generation.primer import Primer
from musicrel.generation.sampling import ContinuationResult, SamplingParams, row_seed
from musicrel.midi.codec import shift_steps

log = logging.getLogger(__name__)


class DecodeBatch:
    """Continuous batching: the rows of many jobs decode together, one token each per `step()`, and jobs join
    (`admit`) and leave (done or stopped) between steps, so no row waits for a batch to finish.

    One KV cache of max_rows rows (growing up to max_seq_len positions) holds every row; live rows are its
    first rows and share one length, each with its own left padding. A row's K/V never depend on where it sits
    in the cache (relative schemes use distances; the absolute one counts from the row's first real token), so
    rows are copied and shifted along the cache freely:
    - admit: a primer minus its last token is prefilled in a small cache (once per distinct primer, e.g. for
      every sample of a job) and copied to end at the shared length (the running rows shift right first when
      it is longer). Its last token becomes the row's pending token, so in `step` every row does the same:
      feed the pending token, sample the next one. With `primer_cache` > 0 the K/V of that many recent
      distinct primers are kept: the same motif again (say with another seed) needs no prefill at all.
    - a row that leaves is replaced by a kept row from the end of the live block (swap-remove): only the rows
      that move are copied, so rows have no lasting order. Padding that no kept row needs any more is dropped
      only when it is a quarter of the length or more, as that copies every row;
    - when the shared length reaches the window, rows whose context fills it slide (the last half window is
      prefilled again, as `generate` does) and the others shift left.
    Each row samples from its own stream (`RowRandom`) seeded by row_seed(job seed, sample index): a job draws
    the same random numbers whatever it shares the batch with and whenever it is admitted, and its tokens are
    the same up to the floating point of the batch's size (the CPU's GEMM sums a row in another order when
    the batch has more rows, about 1e-6 on a logit; int8 weights' bfloat16 activations magnify it, so int8
    rows do drift into other tokens: docs/API.md "How it runs").

    A step is the model's forward and a fixed few batched tensor operations (the grammar, the sampler, the
    stopping test); it asks the device one thing (whether a row is done) and runs no Python per row: the
    drawn tokens are kept as one tensor per step and written into the rows' histories when something reads
    them or rows leave (`_flush`).

    `step_mode` (decode_graph.STEP_MODES): "eager" the step above, what a CPU runs ("auto" there); "static"
    the same step at fixed shapes (rows padded to a bucket, the cache preallocated at the whole window for
    max_rows rows, the position on the device: `decode_graph.StaticStep`); "graph" (a GPU's "auto") that
    step captured in a CUDA graph per bucket and replayed. Both ask the device nothing while no row ends:
    which rows ended is read a step late (`Ended`), a row that ended drawing one token past its end, which
    is dropped as it leaves (the same tokens). On a GPU max_rows is cut to the rows whose cache fits the
    memory free at the start (`decode_graph.rows_that_fit`).
    """

    @torch.inference_mode()
    def __init__(self, model, codec, max_rows: int, primer_cache: int = 0, step_mode: str = "auto"):
        for name, value, low in (("max_rows", max_rows, 1), ("primer_cache", primer_cache, 0)):
            if not is_int(value) or value < low:
                raise GenerationError(
                    f"{name} must be an integer >= {low}, got {value!r}", code="invalid_params"
                )
        self.model, self.codec, self.max_rows, self.primer_cache = model, codec, max_rows, primer_cache
        self._decode = model.decoder()  # the model's one-token step, made once: it holds the weights
        self.shifts = slice(codec.time_shift_offset, codec.velocity_offset)
        self._primers: LRU[tuple[Tensor, Tensor]] = LRU(primer_cache)  # K/V of recent primers
        self.window = model.cfg.max_seq_len
        self.keep_last = max(1, self.window // 2)  # tokens a row keeps when its window slides
        self.device = next(model.parameters()).device
        try:
            self.step_mode = resolve_mode(step_mode, model, self.device)
        except ValueError as exc:
            raise GenerationError(str(exc), code="invalid_params") from None
        if self.step_mode != "eager" and self.device.type == "cuda":
            fit = rows_that_fit(model, max_rows, torch.cuda.mem_get_info(self.device)[0])
            if fit < max_rows:
                log.warning("%d rows of KV cache fit the GPU's free memory, not %d: the batch takes %d",
                            fit, max_rows, fit)  # fmt: skip
                self.max_rows = max_rows = fit
        # k, v (n_layers, max_rows, H, max_len, D); max_len grows as needed, up to the window (at once for
        # a static step: its shapes never change).
        self._cache = model.new_cache(
            max_rows, self.window if self.step_mode != "eager" else min(self.window, 64)
        )
        self._static: dict[tuple, StaticStep] = {}  # by bucket and signature
        self._static_now: StaticStep | None = None  # the last step's
        self._ended: Ended | None = None  # the last static step's ended rows, not read yet
        self.left_pad = torch.zeros(max_rows, dtype=torch.long, device=self.device)  # (max_rows,)
        self.length = 0  # positions the live rows share
        # per live row, in batch order; the grammar's class is the first job's once one is admitted
        self.live = LiveRows.start(
            [], [], Grammar(codec, [], [], device=self.device), model.cfg.vocab_size, self.device
        )
        self._ids = itertools.count()
        self._shift_steps = shift_steps(codec)
        self._steps: list[Tensor] = []  # tokens drawn since the last _flush, (n,) each, rows in batch order
        self._view: tuple | None = None  # (cache buffers, rows, the view of them the model decodes with)
        self._live_jobs: list[int] = []
        self._by_job: dict[int, list[LiveRow]] | None = None  # `generated`'s index, None when rows changed

    @property
    def rows(self) -> list[LiveRow]:
        return self.live.rows

    @property
    def free_rows(self) -> int:
        return self.max_rows - len(self.rows)

    @property
    def live_jobs(self) -> list[int]:
        """Ids of the jobs still decoding, in the order they were admitted (rows themselves have no order)."""
        return list(self._live_jobs)

    def _flush(self) -> None:
        """Write the tokens drawn since the last flush into the rows' histories (their order has not changed
        since: every change of the rows flushes first)."""
        if not self._steps:
            return
        block = torch.stack(self._steps, dim=1).cpu().numpy()  # (n, steps)
        self._steps.clear()
        k = block.shape[1]
        for row, tokens in zip(self.rows, block, strict=True):
            row.history[row.filled : row.filled + k] = tokens
            row.filled += k

    def generated(self, job_id: int) -> list[np.ndarray] | None:
        """The tokens each sample of a running job has generated so far (views into the rows' histories,
        whose filled part never changes), for a caller that streams them between steps; None when the job
        is not in the batch (finished: its result holds every token)."""
        if self._by_job is None:  # rows by job, made again after rows joined or left: a streaming engine
            # asks this for every job after every step, and a scan of the rows per job was O(rows^2) a step
            self._by_job = {}
            for row in self.rows:
                self._by_job.setdefault(row.job.id, []).append(row)
        rows = self._by_job.get(job_id)
        if not rows:
            return None
        self._flush()
        job = rows[0].job
        out = list(job.samples)  # samples already done hold their tokens; live rows fill in below
        for row in rows:
            out[row.sample] = row.history[len(job.tokens) : row.filled]
        return out

    @torch.inference_mode()
    def admit(self, jobs: Sequence[DecodeJob | tuple[Primer, SamplingParams]]) -> list[int]:
        """Add jobs (num_samples rows each) to the batch; returns their ids, as `step` reports them. A job is
        a `DecodeJob`, or a primer and its SamplingParams (a continuation: `continuation_job`).

        Everything is checked and prefilled before the batch changes: a job that raises (GenerationError for
        bad params, a primer token outside the vocabulary, more rows than are free, or a grammar of another
        class than the batch's) leaves it as it was."""
        start = time.perf_counter()
        specs = [
            job if isinstance(job, DecodeJob) else continuation_job(self.model, self.codec, *job, index=j)
            for j, job in enumerate(jobs)
        ]
        kind = type(self.live.grammar) if self.rows else type(specs[0].grammar) if specs else None
        for j, spec in enumerate(specs):
            spec.tokens = np.asarray(spec.tokens, dtype=np.int64).reshape(-1)
            check_tokens(j, spec.tokens, self.model.cfg.vocab_size)
            if spec.num_samples < 1:
                raise GenerationError(f"job {j}: a job needs at least one row", code="invalid_params")
            if type(spec.grammar) is not kind:
                raise GenerationError(
                    f"job {j}: a {type(spec.grammar).__name__} cannot join rows of a {kind.__name__}",
                    code="invalid_params",
                )
        n_new = sum(spec.num_samples for spec in specs)
        if n_new > self.free_rows:
            raise GenerationError(
                f"{n_new} rows do not fit: {self.free_rows} of {self.max_rows} are free", code="batch_full"
            )
        if not specs:
            return []
        contexts = [spec.tokens[:-1] for spec in specs for _ in range(spec.num_samples)]
        with eval_mode(self.model):
            kv = self._prefill(contexts, remember=True)
        width = max(len(c) for c in contexts)
        admitted = time.perf_counter()

        # Nothing below fails: commit.
        self._flush()
        n = len(self.rows)
        self._reserve(max(width, self.length))
        if n == 0:
            self.length = width
        elif width > self.length:
            self._shift(width - self.length)
        L = self.length
        for r, (k, v) in enumerate(kv):
            self._cache.k[:, n + r, :, L - k.size(2) : L] = k
            self._cache.v[:, n + r, :, L - v.size(2) : L] = v
        self.left_pad[n : n + n_new] = torch.as_tensor([L - len(c) for c in contexts], device=self.device)
        ids, rows, seeds = [], [], []
        for spec in specs:
            job = LiveJob(
                id=next(self._ids),
                spec=spec,
                samples=[np.zeros(0, dtype=np.int64)] * spec.num_samples,
                rows_left=spec.num_samples,
                admitted=admitted,
                prefill_s=admitted - start,
            )
            ids.append(job.id)
            for i in range(spec.num_samples):
                # one token of room past the most it draws: a static step's row draws one past its end
                history = np.empty(len(job.tokens) + spec.max_new_tokens + 1, dtype=np.int64)
                history[: len(job.tokens)] = job.tokens
                rows.append(LiveRow(job, i, history, len(job.tokens)))
                seeds.append(row_seed(spec.seed, i))
        grammar = specs[0].grammar
        for spec in specs[1:]:
            grammar.extend(spec.grammar)
        new = LiveRows.start(rows, seeds, grammar, self.model.cfg.vocab_size, self.device)
        if n == 0:
            self.live = new  # the batch's grammar is its first job's (its class: the batch's kind)
        else:
            self.live.extend(new)
        self._by_job = None
        self._live_jobs += ids
        return ids

    @torch.inference_mode()
    def step(self, should_stop: Callable[[int], bool] | None = None) -> list[tuple[int, ContinuationResult]]:
        """One token for every live row. Returns (job id, result) for the jobs that finished: music long
        enough, max_new_tokens reached, or should_stop(job id) True (checked first: no token for them)."""
        finished = []
        if should_stop is not None:
            stop = {job_id for job_id in self.live_jobs if should_stop(job_id)}
            if stop:
                finished += self._settle()  # rows that ended on the last step leave first, as ended
                for row in self.rows:
                    row.job.stopped |= row.job.id in stop
                finished += self._drop([row.job.id not in stop for row in self.rows])
        if not self.rows:
            return finished
        with eval_mode(self.model):
            if self.length == self.window:
                self._make_room()
            self._reserve(self.length + 1)
            if self.step_mode != "eager" and supported(self.live):
                return finished + self._static_step()
            logits = self._decode(self.live.pending, self._cache_view())
        self.length += 1
        live, grammar = self.live, self.live.grammar
        token = live.draw(logits, self.shifts, ahead=True)
        live.pending = token = grammar.advance(token)
        self._steps.append(token)
        live.drawn += 1
        done = grammar.finished() | (live.drawn >= live.max_new)
        if not bool(done.any()):  # the step's one question to the device
            return finished
        return finished + self._drop((~done).tolist())

    @torch.inference_mode()
    def warm_buckets(self, primer: Primer, params: SamplingParams) -> list[int]:
        """In "graph" mode, with no row live: a job of each bucket's rows sampled as `params` say, three
        steps each (the warm-up, the capture, a replay), so that requests of that kind pay no capture as the
        batch grows. Returns the buckets warmed (none in another mode, or with rows live)."""
        if self.step_mode != "graph" or self.rows:
            return []
        sizes = buckets(self.max_rows)
        for rows in sizes:
            self.admit([(primer, replace(params, seconds=10_000.0, max_new_tokens=3, num_samples=rows))])
            while self.rows:
                self.step()
        return sizes

    def _static_step(self) -> list[tuple[int, ContinuationResult]]:
        """`step`'s token for every row through the bucket's StaticStep (captured in "graph" mode). While no
        row joins or leaves, the last step's StaticStep still holds the rows (`bound`): no key to make."""
        static = self._static_now
        bound = static is not None and static.bound(self)
        if not bound:
            rows = bucket(len(self.rows), self.max_rows)
            key = (rows, *decode_graph_signature(self.live))
            static = self._static.pop(key, None) or StaticStep(self, rows)
            self._static[key] = static  # the most recently used last
            if len(self._static) > MAX_STATIC_STEPS:  # each holds its buffers and graph memory
                del self._static[next(iter(self._static))]
            self._static_now = static
        token, done = static.run(self, capture=self.step_mode == "graph", bound=bound)
        self.length += 1
        self._steps.append(token.clone())  # the buffer is the next step's input
        # Which rows ended is read one step late, while this step runs (`Ended`): the step asks the device
        # nothing while no row ends. A row that ended on the last step drew one token past its end on this
        # one: it leaves now, that token dropped (rows never read one another: nothing else changed).
        ended, self._ended = self._ended, None
        late = ended.read(len(self.rows)) if ended is not None else None
        if late is None or not late.any():
            self._ended = Ended(done)
            return []
        now = done.cpu().numpy()  # rows leave this step: its own ends are read now too
        return self._drop((~(late | now)).tolist(), late=late.tolist())

    def _settle(self) -> list[tuple[int, ContinuationResult]]:
        """The rows the last static step ended leave now (before anything reorders the rows), having drawn
        nothing since."""
        ended, self._ended = self._ended, None
        late = ended.read(len(self.rows)) if ended is not None else None
        if late is None or not late.any():
            return []
        return self._drop((~late).tolist())

    def _cache_view(self):
        """The live rows' part of the cache at the shared length, as the model reads it: one object for as
        long as the buffers and the rows stay (the left padding is a view, edited in place)."""
        n, view = len(self.rows), self._view
        if view is None or view[0] is not self._cache or view[1] != n:
            cache = replace(
                self._cache, k=self._cache.k[:, :n], v=self._cache.v[:, :n], left_pad=self.left_pad[:n]
            )
            self._view = view = (self._cache, n, cache)
        view[2].length = self.length
        return view[2]

    def _prefill(self, contexts: list[np.ndarray], remember: bool = False) -> list[tuple[Tensor, Tensor]]:
        """K and V of each context: (n_layers, H, len, D) each, one pair per context (views, not copies).

        Contexts that are alike (every sample of a job) share one forward pass: prefill is compute bound.
        With `remember`, the K/V of the last `primer_cache` distinct contexts are kept, so a primer seen
        again (the same motif with another seed) costs no forward pass at all."""
        found: dict[bytes, tuple[Tensor, Tensor]] = {}
        missing: dict[bytes, np.ndarray] = {}
        for c in contexts:
            key = c.tobytes()
            if key in found or key in missing:
                continue
            kv = self._primers.get(key)
            if kv is not None:
                found[key] = kv
            else:
                missing[key] = c
        if missing:
            width = max(len(c) for c in missing.values())
            tokens = torch.full((len(missing), width), self.codec.pad_id, dtype=torch.long)  # (U, width)
            left_pad = torch.tensor([width - len(c) for c in missing.values()])  # (U,)
            for u, c in enumerate(missing.values()):
                tokens[u, width - len(c) :] = torch.from_numpy(c)
            small = self.model.new_cache(len(missing), max(1, width))
            if width:
                prefill(self.model, tokens.to(self.device), small, left_pad.to(self.device))
            for u, (key, c) in enumerate(missing.items()):
                kv = small.k[:, u, :, width - len(c) : width], small.v[:, u, :, width - len(c) : width]
                found[key] = kv
                if remember and self.primer_cache:
                    self._primers.put(key, (kv[0].clone(), kv[1].clone()))
        return [found[c.tobytes()] for c in contexts]

    def _reserve(self, length: int) -> None:
        """Grow the cache (doubling, up to the window) to hold `length` positions, keeping the live rows: a
        batch of short jobs never allocates a whole window per row."""
        size = self._cache.max_len
        if length <= size:
            return
        cache = self.model.new_cache(self.max_rows, min(self.window, max(length, 2 * size)))
        n, L = len(self.rows), self.length
        cache.k[:, :n, :, :L] = self._cache.k[:, :n, :, :L]
        cache.v[:, :n, :, :L] = self._cache.v[:, :n, :, :L]
        self._cache = cache

    def _shift(self, offset: int) -> None:
        """Move every live row `offset` positions along the cache (right > 0; left < 0 drops padding only)."""
        n, L = len(self.rows), self.length
        src, dst = slice(max(0, -offset), L), slice(max(0, offset), L + offset)
        for buf in (self._cache.k, self._cache.v):
            buf[:, :n, :, dst] = buf[:, :n, :, src].clone()
        self.left_pad[:n] = (self.left_pad[:n] + offset).clamp(min=0)
        self.length = L + offset

    def _make_room(self) -> None:
        """The cache is full. Rows whose context fills the window slide: they keep their last `keep_last`
        tokens, all but the pending one prefilled again. The others only shift left."""
        self._flush()
        lp = self.left_pad[: len(self.rows)].tolist()
        keep = self.keep_last - 1
        slide = [r for r, pad in enumerate(lp) if pad == 0]
        length = max([keep] + [self.length - pad for pad in lp if pad > 0])
        contexts = [
            self.rows[r].history[self.rows[r].filled - self.keep_last : self.rows[r].filled - 1]
            for r in slide
        ]
        kv = self._prefill(contexts) if slide else []
        self._shift(length - self.length)
        for r, (k, v) in zip(slide, kv, strict=True):
            self._cache.k[:, r, :, length - keep : length] = k
            self._cache.v[:, r, :, length - keep : length] = v
            self.left_pad[r] = length - keep

    def _drop(self, keep: list[bool], late: list[bool] | None = None) -> list[tuple[int, ContinuationResult]]:
        """Remove the rows not kept: their samples are done; jobs with no rows left are finished. `late`: the
        rows that drew one token past their end (a static step's ends are read a step late): it is dropped.

        Swap-remove: each hole among the first m (kept) rows takes a kept row from beyond them, so only those
        rows' K/V are copied (their real positions only: a row's padding is masked, whatever it holds) and a
        departure costs what moves, not the whole live cache. Every per-row state follows the same order."""
        self._flush()
        self._by_job = None
        self._ended = None  # its flags name rows by their order, which changes here
        for row, past in zip(self.rows, late or [], strict=bool(late)):
            row.filled -= past
        finished = []
        for row, kept in zip(self.rows, keep, strict=True):
            if kept:
                continue
            job = row.job
            job.samples[row.sample] = row.history[len(job.tokens) : row.filled].copy()
            job.rows_left -= 1
            if job.rows_left == 0:
                finished.append((job.id, self._result(job)))
                self._live_jobs.remove(job.id)
        m = sum(keep)
        if m == len(keep):
            return finished
        if not m:
            self.live.select([])
            self.length = 0
            return finished
        holes = [r for r in range(m) if not keep[r]]
        movers = [r for r in range(m, len(keep)) if keep[r]]  # as many as holes
        order = list(range(m))
        for hole, mover in zip(holes, movers, strict=True):
            order[hole] = mover
        index = torch.as_tensor(order, dtype=torch.long, device=self.device)
        L = self.length
        left_pad = self.left_pad[index]  # (m,)
        # Leading positions that are padding in every kept row could go, but that copies every kept row (what
        # swap-remove avoids). Kept, they only cost attention over masked positions (a row slides when its own
        # context fills the window; `_make_room` shifts padded rows then). So drop them once they are a
        # quarter of the length: later steps attend over <= 3/4 of the positions, repaying the copy in ~12.
        shift = int(left_pad.min())
        if 4 * shift >= L:
            for buf in (self._cache.k, self._cache.v):
                buf[:, :m, :, : L - shift] = buf[:, index, :, shift:L]
            self.length = L - shift
            left_pad = left_pad - shift
        else:
            for hole, mover in zip(holes, movers, strict=True):
                start = int(left_pad[hole])
                for buf in (self._cache.k, self._cache.v):
                    buf[:, hole, :, start:L].copy_(buf[:, mover, :, start:L])
        self.left_pad[:m] = left_pad
        self.live.select(order)
        return finished

    def _result(self, job: LiveJob) -> ContinuationResult:
        step_s = self.codec.config.step_ms / 1000.0
        spec = job.spec
        return ContinuationResult(
            tokens=job.samples,
            seed=spec.seed,
            primer_tokens=len(job.tokens),
            new_tokens=int(sum(len(t) for t in job.samples)),
            # music after the cut: the first tail_steps of every sample lie before it (generation.join)
            seconds=max(
                max(int(self._shift_steps[t].sum()) - spec.tail_steps, 0) * step_s for t in job.samples
            ),
            timings={"prefill": job.prefill_s, "decode": time.perf_counter() - job.admitted},
            stopped=job.stopped,
            controls=spec.controls.applied if spec.controls is not None else None,
            warnings=list(spec.controls.warnings) if spec.controls is not None else [],
        )


def generate_batch(
    model,
    codec,
    jobs: Sequence[tuple[Primer, SamplingParams]],
    should_stop: Callable[[int], bool] | None = None,
) -> list[ContinuationResult]:
    """Continue every job's primer num_samples times, all rows as ONE batch (a `DecodeBatch`).

    A row stops when its music reaches params.seconds, after params.max_new_tokens, or when should_stop(job
    index) returns True (checked every step); rows that are done leave the batch, so the others run faster.
    """
    if not jobs:
        return []
    for j, (_, params) in enumerate(jobs):
        check_params(j, params)
    batch = DecodeBatch(model, codec, max_rows=sum(params.num_samples for _, params in jobs))
    ids = batch.admit(jobs)
    index = {job_id: j for j, job_id in enumerate(ids)}
    stop = None if should_stop is None else (lambda job_id: should_stop(index[job_id]))
    results: dict[int, ContinuationResult] = {}
    while batch.rows:
        results.update(batch.step(stop))
    return [results[job_id] for job_id in ids]
