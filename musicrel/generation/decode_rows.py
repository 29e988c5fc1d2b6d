"""The live rows' state in `DecodeBatch`: a job once admitted, each of its rows, and the per-row tensors the
step reads. Apart from the batch because what makes them consistent (every field leaves and joins together,
in batch order) is a rule of its own, which the batch's cache bookkeeping and the static step
(`decode_graph`, which binds these tensors to its buffers) both rely on without repeating.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
import torch
from torch import Tensor

from musicrel.generation.decode import sample
from musicrel.generation.decode_job import DecodeJob
from musicrel.generation.grammar import Grammar
from musicrel.generation.row_random import RowRandom


@dataclass(eq=False)
class LiveJob:
    """An admitted job: its spec, and its samples' tokens as their rows leave."""

    id: int
    spec: DecodeJob
    samples: list  # generated tokens per sample, filled in as its row leaves the batch
    rows_left: int
    admitted: float  # time.perf_counter() when its prefill was done
    prefill_s: float
    stopped: bool = False

    @property
    def tokens(self) -> np.ndarray:
        return self.spec.tokens


@dataclass(eq=False)
class LiveRow:
    """One sample of a job, decoding."""

    job: LiveJob
    sample: int
    # primer, then generated tokens (preallocated); the last one is the pending token. Written in blocks of
    # steps (`DecodeBatch._flush`), not per step: read them through the batch.
    history: np.ndarray
    filled: int  # tokens in history


@dataclass(eq=False)
class LiveRows:
    """Everything a live row carries, one entry per row in batch order: rows leave (`select`) and join
    (`extend`) together, so no field can fall out of step with the others."""

    rows: list[LiveRow]
    pending: Tensor  # (n,) long: the next token to feed
    temperature: Tensor  # (n,)
    top_k: Tensor  # (n,) long
    top_p: Tensor  # (n,)
    shift_temperature: Tensor  # (n,)
    drawn: Tensor  # (n,) long: tokens drawn so far
    max_new: Tensor  # (n,) long: the most a row draws
    random: RowRandom
    grammar: Grammar
    # The sampler's work that some row needs (top-k/top-p; a shift temperature; a temperature): Python
    # flags, refreshed only as rows join and leave, so a step asks the device nothing.
    truncate: bool = field(init=False, default=False)
    reshape: bool = field(init=False, default=False)
    scale: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self._flags()

    @classmethod
    def start(
        cls, rows: list[LiveRow], seeds: list[int], grammar: Grammar, vocab_size: int, device: torch.device
    ) -> LiveRows:
        """The state of `rows` as they join: each pending on its prompt's last token, its job's sampling
        settings (top_k None: the whole vocabulary), nothing drawn, a random stream per seed."""
        specs = [row.job.spec for row in rows]

        def tensor(values: list, dtype=torch.float32) -> Tensor:
            return torch.as_tensor(values, dtype=dtype, device=device)

        return cls(
            rows=rows,
            pending=tensor([int(row.job.tokens[-1]) for row in rows], torch.long),
            temperature=tensor([j.temperature for j in specs]),
            top_k=tensor([j.top_k or vocab_size for j in specs], torch.long),
            top_p=tensor([j.top_p for j in specs]),
            shift_temperature=tensor([j.shift_temperature for j in specs]),
            drawn=tensor([0] * len(rows), torch.long),
            max_new=tensor([j.max_new_tokens for j in specs], torch.long),
            random=RowRandom(seeds, device),
            grammar=grammar,
        )

    def _flags(self) -> None:
        specs = [row.job.spec for row in self.rows]
        self.truncate = any(spec.top_k is not None or spec.top_p < 1 for spec in specs)
        self.reshape = any(spec.shift_temperature != 1 for spec in specs)
        self.scale = any(spec.temperature != 1 for spec in specs)

    def draw(self, logits: Tensor, shifts: slice, ahead: bool = False) -> Tensor:
        """Each row's next token (B,), drawn under its grammar with its own settings and random stream (the
        eager and the static step alike; `ahead`: the eager step's, the streams' draws made many steps at
        once, the same numbers)."""
        return sample(
            self.grammar.constrain(logits),
            self.temperature,
            self.top_k,
            self.top_p,
            self.random.ahead() if ahead else self.random,
            self.shift_temperature,
            shifts,
            truncate=self.truncate,
            reshape=self.reshape,
            scale=self.scale,
        )

    def select(self, order: list[int]) -> None:
        """Keep the rows at `order`, in that order."""
        index = torch.as_tensor(order, dtype=torch.long, device=self.pending.device)
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (Grammar, RowRandom)):
                value.select(index)
            elif isinstance(value, Tensor):
                setattr(self, f.name, value[index])
            elif isinstance(value, list):
                setattr(self, f.name, [value[r] for r in order])
        self._flags()

    def extend(self, other: LiveRows) -> None:
        """Append the rows of `other` (jobs joining)."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, Tensor):
                setattr(self, f.name, torch.cat([mine, theirs]))
            elif not isinstance(mine, bool):
                mine.extend(theirs)  # a list, the RowRandom or the Grammar
        self._flags()
