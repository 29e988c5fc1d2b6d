"""The Music Transformer (Huang et al. 2018): a decoder-only Transformer with relative self-attention.

Read top to bottom: KVCache, CausalSelfAttention (the four position schemes), Block, MusicTransformer, and
DecodeStep (its one-token step as a plain function, what generation calls).
Shapes: B batch, t queries in this call, T keys (everything the cache holds plus the t new positions),
H heads, D head size, C = d_model, k the clipping distance.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from musicrel.model.attention import (
    causal_allowed,
    clipped_table,
    relative_distances,
    relative_logits_one,
    sinusoidal_positions,
    skew,
    t5_buckets,
)
from musicrel.model.config import ModelConfig


@dataclass
class KVCache:
    """Preallocated keys and values of every layer, written in place as positions arrive.

    Every scheme needs only K and V: relative terms depend on positions, which the cache knows (`length`).
    All rows share one length; rows of different primer lengths are aligned by left padding (`left_pad`).
    """

    k: Tensor  # (n_layers, B, H, max_len, D)
    v: Tensor  # (n_layers, B, H, max_len, D)
    left_pad: Tensor | None = None  # (B,) long: leading padding positions per row, or None
    length: int = 0  # positions held

    @property
    def batch_size(self) -> int:
        return self.k.size(1)

    @property
    def max_len(self) -> int:
        return self.k.size(3)

    def reset(self, left_pad: Tensor | None = None) -> None:
        """Forget everything (the buffers are reused) so the cache can be prefilled again."""
        self.length = 0
        self.left_pad = left_pad

    def crop(self, length: int) -> None:
        """Keep only the first `length` positions (e.g. to re-decode from there)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache holding {self.length} positions to {length}")
        self.length = length

    def select(self, rows: Tensor) -> KVCache:
        """A new cache with only `rows` of the batch (e.g. drop finished samples); copies their K/V."""
        left_pad = None if self.left_pad is None else self.left_pad[rows]
        return KVCache(self.k[:, rows].clone(), self.v[:, rows].clone(), left_pad, self.length)

    def layers(self) -> list[tuple[Tensor, Tensor]]:
        """Each layer's (K, V), (B, H, max_len, D) views of `k` and `v`, made once for these buffers: a
        decoding step reads every layer's, and indexing them anew cost two calls a layer per step."""
        views = self.__dict__.get("_layers")
        if views is None or views[0] is not self.k or views[1] is not self.v:
            layers = list(zip(self.k.unbind(0), self.v.unbind(0), strict=True))
            views = self._layers = (self.k, self.v, layers)
        return views[2]


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout
        k = cfg.relative_distance
        if cfg.attention == "skew":
            # One table per head (the paper learns E_r per head); last row = distance 0.
            self.E_r = nn.Parameter(torch.empty(cfg.n_heads, k + 1, cfg.head_dim))
        elif cfg.attention == "shaw":
            # Shaw et al. share a^K, a^V across heads. Causal attention never sees negative distances, so the
            # 2k+1 table shrinks to the k+1 vectors for distances 0..k (index = distance).
            self.a_K = nn.Parameter(torch.empty(k + 1, cfg.head_dim))
            self.a_V = nn.Parameter(torch.empty(k + 1, cfg.head_dim))
        elif cfg.attention == "t5":
            self.rel_bias = nn.Embedding(cfg.t5_num_buckets, cfg.n_heads)

    def forward(
        self,
        x: Tensor,
        cache: KVCache | None,
        layer: int,
        left_pad: Tensor | None,
    ) -> Tensor:
        B, t, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, t, D)
        k = k.view(B, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, t, D)
        v = v.view(B, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, t, D)
        if cache is not None:
            t0 = cache.length
            cache.k[layer, :, :, t0 : t0 + t] = k
            cache.v[layer, :, :, t0 : t0 + t] = v
            k = cache.k[layer, :, :, : t0 + t]  # (B, H, T, D)
            v = cache.v[layer, :, :, : t0 + t]  # (B, H, T, D)
        y = self.attend(q, k, v, left_pad)  # (B, H, t, D)
        y = y.transpose(1, 2).reshape(B, t, C)  # (B, t, C)
        return self.proj(y)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, left_pad: Tensor | None) -> Tensor:
        """t queries at the LAST t of T positions: q (B, H, t, D), k, v (B, H, T, D) -> (B, H, t, D)."""
        t, T = q.size(2), k.size(2)
        if self.cfg.attention == "absolute" and left_pad is None and t in (1, T):
            # SDPA's causal kernel never materialises the logits and skips the masked half: the fastest
            # baseline. (One query after the cache sees every key, so it needs no mask at all.)
            dropout_p = self.dropout if self.training else 0.0
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=t > 1)
        # Query blocks: a block reads keys up to its own last query only, so the masked upper triangle is
        # skipped block by block (faster on CPU) and no block ever holds a t x T tensor (memory linear in T).
        # Everything that depends only on distances is prepared once here, for distances T..0.
        scale = 1.0 / math.sqrt(self.head_dim)
        if self.cfg.attention == "skew":
            # SDPA adds a float attn_mask after scaling Q·Kᵀ, so pre-scale E (O(T·D)) rather than S_rel. One
            # row more than the T distances: it becomes the skew's padding column.
            table = clipped_table(self.E_r, T + 1) * scale  # (H, T + 1, D)
        elif self.cfg.attention == "t5":
            distances = torch.arange(T, -1, -1, device=q.device)  # (T + 1,)
            buckets = t5_buckets(distances, self.cfg.t5_num_buckets, self.cfg.t5_max_distance)
            table = self.rel_bias(buckets).T.to(q.dtype)  # (H, T + 1)
        block = self.cfg.query_chunk_size or t
        future = torch.ones(block, block, dtype=torch.bool, device=q.device).triu_(1)  # (c, c)
        outs = []
        for s in range(0, t, block):
            c = min(block, t - s)  # queries in this block
            e = T - t + s + c  # keys it may see: [0, e)
            qb, kb, vb = q[:, :, s : s + c], k[:, :, :e], v[:, :, :e]  # (B, H, c, D), (B, H, e, D)
            if self.cfg.attention == "skew":
                S_rel = skew(qb @ table[:, T - e :].transpose(-1, -2))  # (B, H, c, e + 1) -> (B, H, c, e)
                outs.append(self._sdpa(qb, kb, vb, self._mask(S_rel, future, left_pad)))
            elif self.cfg.attention == "t5":
                bias = skew(table[:, None, T - e :].expand(-1, c, -1).contiguous())  # (H, c, e)
                outs.append(self._sdpa(qb, kb, vb, self._mask(bias, future, left_pad)))
            elif self.cfg.attention == "absolute":
                outs.append(self._sdpa(qb, kb, vb, causal_allowed(c, e, left_pad, q.device)))
            else:
                outs.append(self._shaw(qb, kb, vb, causal_allowed(c, e, left_pad, q.device), scale))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # (B, H, t, D)

    def forward_static(self, x: Tensor, cache: KVCache, layer: int, pos: Tensor, hidden: Tensor, rel: Tensor):
        """One query per row at position `pos` ((1,) long, on the device), attending over every one of the
        cache's max_len positions, those it may not see masked (`hidden` (B, 1, 1, M)): the shapes never
        change from step to step, so a CUDA graph can replay it (skew attention only, `supports_static`).

        The same logits as `DecodeStep` over the first pos + 1 keys: key j's relative term is q against
        E_r's row `rel`[j] (MusicTransformer.decode_static: rows - 1 - min(pos - j, rows - 1))."""
        B, _, C = x.shape
        H, D = self.n_heads, self.head_dim
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, 1, H, D).transpose(1, 2) * (1.0 / math.sqrt(D))  # (B, H, 1, D)
        cache.k[layer].index_copy_(2, pos, k.view(B, 1, H, D).transpose(1, 2))
        cache.v[layer].index_copy_(2, pos, v.view(B, 1, H, D).transpose(1, 2))
        S_rel = torch.bmm(q.view(B, H, D).transpose(0, 1), self.E_r.transpose(1, 2))  # (H, B, rows)
        S_rel = S_rel.index_select(2, rel).transpose(0, 1).unsqueeze(2)  # (B, H, 1, M)
        S_rel = S_rel.masked_fill(hidden, float("-inf"))
        y = F.scaled_dot_product_attention(q, cache.k[layer], cache.v[layer], attn_mask=S_rel, scale=1.0)
        return self.proj(y.transpose(1, 2).reshape(B, 1, C))

    @staticmethod
    def _mask(S: Tensor, future: Tensor, left_pad: Tensor | None) -> Tensor:
        """-inf on keys a query may not see. S (..., c, e) holds the LAST c queries of e keys; without padding
        only its trailing c x c square has future keys (masked in place)."""
        c, e = S.shape[-2:]
        if left_pad is None:
            S[..., e - c :].masked_fill_(future[:c, :c], float("-inf"))
            return S
        return S.masked_fill(~causal_allowed(c, e, left_pad, S.device), float("-inf"))  # (B, H, c, e)

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0
        )

    def _shaw(self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, scale: float) -> Tensor:
        """logits_ij = q_i·(k_j + a^K_d) with d = min(i - j, k); out_i = sum_j p_ij (v_j + a^V_d).

        Both relative terms go through the k+1 distance buckets: q·a^Kᵀ is (c, k+1) and then gathered; the
        probabilities are scatter-added per bucket and multiplied with a^V. Never a (c, e, D) tensor."""
        B, H, c, _ = q.shape
        e = k.size(2)
        distance = relative_distances(c, e, q.device)  # (c, e)
        index = distance.clamp(max=self.a_K.size(0) - 1).expand(B, H, c, e)  # (B, H, c, e)
        att = q @ k.transpose(-2, -1)  # (B, H, c, e)
        att = att + (q @ self.a_K.T).gather(-1, index)  # (B, H, c, k+1) gathered -> (B, H, c, e)
        att = (att * scale).masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        att = F.dropout(att, p=self.dropout, training=self.training)
        buckets = att.new_zeros(B, H, c, self.a_V.size(0)).scatter_add_(-1, index, att)  # (B, H, c, k+1)
        return att @ v + buckets @ self.a_V  # (B, H, c, D)


class Block(nn.Module):
    """Pre-LN Transformer block."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.d_ff),
            nn.GELU(),
            nn.Linear(cfg.d_ff, cfg.d_model),
            nn.Dropout(cfg.dropout),
        )
        self.drop = nn.Dropout(cfg.dropout)

    def forward(
        self,
        x: Tensor,
        cache: KVCache | None,
        layer: int,
        left_pad: Tensor | None,
    ) -> Tensor:
        x = x + self.drop(self.attn(self.ln_1(x), cache, layer, left_pad))
        return x + self.mlp(self.ln_2(x))

    def forward_static(self, x: Tensor, cache: KVCache, layer: int, pos: Tensor, hidden: Tensor, rel: Tensor):
        """`forward` of one decoding position, in eval mode, through `CausalSelfAttention.forward_static`."""
        x = x + self.attn.forward_static(self.ln_1(x), cache, layer, pos, hidden, rel)
        return x + self.mlp(self.ln_2(x))


class MusicTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.attention == "absolute" and cfg.absolute_kind == "learned":
            self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        elif cfg.attention == "absolute":
            # Not persistent: it is a function of the config, so checkpoints do not carry it.
            self.register_buffer(
                "pos_table", sinusoidal_positions(cfg.max_seq_len, cfg.d_model), persistent=False
            )
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        residual_projections = ("attn.proj.weight", "mlp.2.weight")  # GPT-2: scaled down by depth
        for name, p in self.named_parameters():
            if name.endswith(residual_projections):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))
            elif name.endswith(("E_r", "a_K", "a_V")):
                nn.init.normal_(p, mean=0.0, std=0.02)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def supports_static(self) -> bool:
        """Whether `decode_static` takes this model: skew attention (the shipped models' scheme)."""
        return self.cfg.attention == "skew"

    def decode_static(self, tokens: Tensor, cache: KVCache, pos: Tensor) -> Tensor:
        """tokens (B,) at position `pos` ((1,) long tensor, the rows' shared length; on the model's device)
        -> logits (B, vocab), in eval mode; the token's K/V written at `pos`. Unlike `forward` it reads no
        Python length and asks the device nothing: attention runs over all of the cache's max_len positions,
        those past `pos` or in a row's left padding masked, so every call has the same shapes and a CUDA
        graph of it replays at any position (`generation.decode_graph`). The caller moves `pos` on."""
        M = cache.max_len
        j = torch.arange(M, device=tokens.device)  # (M,)
        rows = self.blocks[0].attn.E_r.size(1)
        rel = rows - 1 - (pos - j).clamp(0, rows - 1)  # (M,): E_r's row for each key (past pos: masked)
        # As DecodeStep's `hidden`: the row's padding and the future; its own position is never padding.
        hidden = (j[None] > pos) | ((j[None] < cache.left_pad[:, None]) & (j[None] < pos))  # (B, M)
        hidden = hidden[:, None, None]  # (B, 1, 1, M)
        x = self.tok_emb(tokens[:, None])  # (B, 1, C)
        for layer, block in enumerate(self.blocks):
            x = block.forward_static(x, cache, layer, pos, hidden, rel)
        return self.head(self.ln_f(x))[:, 0]  # (B, vocab)

    def decoder(self) -> Callable[[Tensor, KVCache], Tensor]:
        """The decoding step, what generation calls once a token: (tokens (B,), cache) -> logits (B, vocab) of
        the position after the cache's, the cache grown by one. Skew attention (the shipped models') gets
        `DecodeStep`; the other schemes `forward` of one token."""
        if self.supports_static:
            return DecodeStep(self)
        return lambda tokens, cache: self(tokens[:, None], cache=cache)[:, 0]

    def kv_bytes_per_row(self, dtype: torch.dtype | None = None) -> int:
        """Bytes of one row's K and V at the whole window (`new_cache(rows, max_seq_len)`), in `dtype` (the
        model's own by default): 2 x n_layers x d_model x max_seq_len x the dtype's size."""
        dtype = self.tok_emb.weight.dtype if dtype is None else dtype
        cfg = self.cfg
        return 2 * cfg.n_layers * cfg.n_heads * cfg.head_dim * cfg.max_seq_len * dtype.itemsize

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())  # tied weights are counted once by parameters()

    def new_cache(
        self, batch_size: int, max_len: int | None = None, left_pad: Tensor | None = None
    ) -> KVCache:
        """Empty preallocated cache for `batch_size` rows and up to `max_len` (<= max_seq_len) positions."""
        max_len = self.cfg.max_seq_len if max_len is None else max_len
        if not 1 <= max_len <= self.cfg.max_seq_len:
            raise ValueError(
                f"cache max_len must be in 1..{self.cfg.max_seq_len} (max_seq_len), got {max_len}"
            )
        p = self.tok_emb.weight
        shape = (self.cfg.n_layers, batch_size, self.cfg.n_heads, max_len, self.cfg.head_dim)
        return KVCache(p.new_zeros(shape), p.new_zeros(shape), self._check_left_pad(left_pad, batch_size))

    def _check_left_pad(self, left_pad: Tensor | None, batch_size: int) -> Tensor | None:
        if left_pad is None:
            return None
        left_pad = torch.as_tensor(left_pad, dtype=torch.long, device=self.tok_emb.weight.device)
        if left_pad.shape != (batch_size,):
            raise ValueError(f"left_pad must have shape ({batch_size},), got {tuple(left_pad.shape)}")
        return left_pad

    def forward(self, tokens: Tensor, cache: KVCache | None = None, left_pad: Tensor | None = None) -> Tensor:
        """tokens (B, t) -> logits (B, t, vocab). With a cache, `tokens` continue what the cache holds
        (left_pad, if given, replaces the cache's)."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, time), got shape {tuple(tokens.shape)}")
        B, t = tokens.shape
        t0 = 0
        if cache is not None:
            if cache.batch_size != B:
                raise ValueError(f"cache holds {cache.batch_size} rows, tokens have {B}")
            if cache.length + t > cache.max_len:
                raise ValueError(
                    f"cache holds {cache.length} of {cache.max_len} positions; {t} more do not fit"
                )
            if left_pad is not None:
                cache.left_pad = left_pad
            cache.left_pad = self._check_left_pad(cache.left_pad, B)  # also when set by cache.reset()
            left_pad, t0 = cache.left_pad, cache.length
        else:
            left_pad = self._check_left_pad(left_pad, B)
        if t0 + t > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {t0 + t} tokens exceeds max_seq_len={self.cfg.max_seq_len}")

        x = self.tok_emb(tokens)  # (B, t, C)
        if self.cfg.attention == "absolute":
            pos = torch.arange(t0, t0 + t, device=tokens.device)[None]  # (1, t)
            if left_pad is not None:
                pos = (pos - left_pad[:, None]).clamp(min=0)  # (B, t): count from each row's first real token
            x = x + (self.pos_emb(pos) if hasattr(self, "pos_emb") else self.pos_table[pos])
        x = self.drop(x)
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer, left_pad)
        if cache is not None:
            cache.length += t
        return self.head(self.ln_f(x))  # (B, t, vocab)


def _as_function(layer: nn.Module) -> Callable[[Tensor], Tensor]:
    """(N, in) -> (N, out) as `layer` computes it, without the module call: an nn.Linear, or a layer that
    says how (Int8Linear.as_function)."""
    if isinstance(layer, nn.Linear):
        return partial(F.linear, weight=layer.weight, bias=layer.bias)
    return layer.as_function()


class DecodeStep:
    """`MusicTransformer.forward` of one token per row after a cache (skew attention, eval mode), as a plain
    function of the model's tensors: tokens (B,), cache -> logits (B, vocab); the cache grows by one.

    The same arithmetic in far fewer Python calls. At batch 1 on a CPU a step is a few hundred small
    kernels, and a module call or a parameter lookup costs about what a small kernel does: through the
    modules a step of `checkpoints/multi` after 500 cached positions took 7.3-7.9 ms here, this 5.2-5.5
    (docs/BENCHMARKS.md). It holds
    references, so weights updated in place (an optimizer's step) are seen; a layer replaced afterwards
    (`quantize_int8`) is not: take a new one from `MusicTransformer.decoder`."""

    def __init__(self, model: MusicTransformer):
        cfg = model.cfg
        self.n_heads, self.head_dim, self.shape = cfg.n_heads, cfg.head_dim, (cfg.d_model,)
        self.scale = 1.0 / math.sqrt(cfg.head_dim)

        def norm(ln: nn.LayerNorm) -> tuple:
            return ln.weight, ln.bias, ln.eps

        self.layers = []  # per block, in the order a step reads them
        for b in model.blocks:
            # E_r as (H, D, k + 1), a view made once: a step reads its last T columns
            E_rT = b.attn.E_r.transpose(1, 2)
            attention = (norm(b.ln_1), _as_function(b.attn.qkv), E_rT, _as_function(b.attn.proj))
            self.layers.append((*attention, norm(b.ln_2), _as_function(b.mlp[0]), _as_function(b.mlp[2])))
        self.embedding, self.ln_f = model.tok_emb.weight, norm(model.ln_f)
        self.head = _as_function(model.head)

    def __call__(self, tokens: Tensor, cache: KVCache) -> Tensor:
        t0, left_pad = cache.length, cache.left_pad
        if t0 >= cache.max_len:
            raise ValueError(f"cache holds {t0} of {cache.max_len} positions; 1 more does not fit")
        T, H, D, shape = t0 + 1, self.n_heads, self.head_dim, self.shape
        hidden = None
        if left_pad is not None and bool(left_pad.any()):
            # One query sees every key but the padding: the mask is shared by all layers, so built once.
            j = torch.arange(T, device=tokens.device)
            hidden = ((j[None] < left_pad[:, None]) & (j < t0)[None])[:, None, None]  # (B, 1, 1, T)
        # Methods and torch.* ops, not indexing and F.*: at a few microseconds a call, a step's Python is
        # a share of it (the same ops, the same arithmetic).
        x = torch.embedding(self.embedding, tokens)  # (B, C)
        B = x.size(0)
        for (ln_1, qkv, E_rT, proj, ln_2, fc, out), (k, v) in zip(self.layers, cache.layers(), strict=True):
            q_k_v = qkv(torch.layer_norm(x, shape, *ln_1)).view(B, 3, H, D)
            k.select(2, t0).copy_(q_k_v.select(1, 1))  # k, v: (B, H, max_len, D)
            v.select(2, t0).copy_(q_k_v.select(1, 2))
            # Both terms share the 1/sqrt(D) scale: scale q once and tell SDPA not to scale again.
            q = q_k_v.select(1, 0) * self.scale  # (B, H, D)
            S_rel = relative_logits_one(q, E_rT, T)  # (B, H, 1, T)
            if hidden is not None:
                S_rel = S_rel.masked_fill(hidden, float("-inf"))
            y = F.scaled_dot_product_attention(
                q.unsqueeze(2), k.narrow(2, 0, T), v.narrow(2, 0, T), attn_mask=S_rel, scale=1.0
            )  # (B, H, 1, D)
            x = x + proj(y.view(B, H * D))  # one query: (B, H, 1, D) is (B, C) in memory
            x = x + out(F.gelu(fc(torch.layer_norm(x, shape, *ln_2))))
        cache.length = T
        return self.head(torch.layer_norm(x, shape, *self.ln_f))  # (B, vocab)
