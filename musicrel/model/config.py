"""ModelConfig: every hyper-parameter of the Music Transformer, validated on construction.

Imports nothing heavy (no torch) so that configs can be read and checked anywhere.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any

from musicrel.errors import ConfigError, is_int, is_number

ATTENTION_KINDS = ("skew", "shaw", "t5", "absolute")
ABSOLUTE_KINDS = ("learned", "sinusoidal")


@dataclass
class ModelConfig:
    """Decoder-only Music Transformer hyper-parameters.

    attention:
        "skew"     Huang et al. 2018: relative keys `E_r` (one table per head and layer), S_rel by skewing.
        "shaw"     Shaw et al. 2018: relative keys and values a^K, a^V (shared by the heads of a layer).
        "t5"       Raffel et al.: a learned scalar bias per head and distance bucket.
        "absolute" Vaswani et al.: positions added to the token embeddings (`absolute_kind`).
    max_relative_distance:
        Distances 0..k get their own embedding; farther keys share the one for k (clipping).
        None means max_seq_len - 1, i.e. no clipping (the paper's setting). Used by "skew" and "shaw".
    query_chunk_size:
        Queries are processed in blocks of this many (same result): no L x L tensor is ever held, memory
        grows linearly in L, and each block skips the keys after it, which roughly halves the work of the
        relative schemes on CPU (128: whole model ~1.9x faster than unchunked at L=1024). None = all queries
        at once. "absolute" without padding always uses SDPA's causal kernel, which needs no blocks.
    """

    vocab_size: int
    n_layers: int = 6
    d_model: int = 256
    n_heads: int = 8
    d_ff: int = 1024
    max_seq_len: int = 1024
    dropout: float = 0.1
    attention: str = "skew"
    max_relative_distance: int | None = None
    absolute_kind: str = "learned"
    t5_num_buckets: int = 32
    t5_max_distance: int = 128
    query_chunk_size: int | None = 128
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        def positive_int(name: str, allow_none: bool = False) -> None:
            value = getattr(self, name)
            if value is None and allow_none:
                return
            if not is_int(value) or value < 1:
                raise ConfigError(f"ModelConfig.{name} must be a positive integer, got {value!r}")

        for name in ("vocab_size", "n_layers", "d_model", "n_heads", "d_ff", "max_seq_len"):
            positive_int(name)
        positive_int("max_relative_distance", allow_none=True)
        positive_int("query_chunk_size", allow_none=True)
        positive_int("t5_max_distance")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"ModelConfig.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if not is_number(self.dropout):
            raise ConfigError(f"ModelConfig.dropout must be a number in [0, 1), got {self.dropout!r}")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ConfigError(f"ModelConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if self.attention not in ATTENTION_KINDS:
            raise ConfigError(
                f"ModelConfig.attention must be one of {ATTENTION_KINDS}, got {self.attention!r}"
            )
        if self.absolute_kind not in ABSOLUTE_KINDS:
            raise ConfigError(
                f"ModelConfig.absolute_kind must be one of {ABSOLUTE_KINDS}, got {self.absolute_kind!r}"
            )
        if not is_int(self.t5_num_buckets):
            raise ConfigError(
                f"ModelConfig.t5_num_buckets must be an integer >= 2, got {self.t5_num_buckets!r}"
            )
        if self.t5_num_buckets < 2:
            raise ConfigError(
                f"ModelConfig.t5_num_buckets must be an integer >= 2, got {self.t5_num_buckets!r}"
            )
        if self.t5_max_distance <= self.t5_num_buckets // 2:
            raise ConfigError(
                f"ModelConfig.t5_max_distance ({self.t5_max_distance}) must exceed t5_num_buckets // 2 "
                f"({self.t5_num_buckets // 2}), the distances that get exact buckets"
            )
        if not isinstance(self.tie_embeddings, bool):
            raise ConfigError(
                f"ModelConfig.tie_embeddings must be true or false, got {self.tie_embeddings!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def relative_distance(self) -> int:
        """The clipping distance k actually used (max_relative_distance, or max_seq_len - 1 when None)."""
        return self.max_relative_distance if self.max_relative_distance is not None else self.max_seq_len - 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        if not isinstance(d, dict):
            raise ConfigError(f"ModelConfig must be read from a mapping, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"ModelConfig has no field(s) {', '.join(map(repr, unknown))}")
        if "vocab_size" not in d:
            raise ConfigError("ModelConfig.vocab_size is required")
        return cls(**d)

    @classmethod
    def from_hparams(cls, hparams) -> ModelConfig:
        """The config held among other settings (a LightningModule's hyper-parameters): their `config`, or,
        in checkpoints of runs from before MusicLM took the config whole, its fields among the others."""
        hparams = dict(hparams)
        if "config" in hparams:
            return cls.from_dict(dict(hparams["config"]))
        known = {f.name for f in fields(cls)}
        return cls.from_dict({k: v for k, v in hparams.items() if k in known})
