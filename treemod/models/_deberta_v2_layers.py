"""DeBERTa-v2's parts: embeddings, disentangled attention, the optional convolution, encoder.

Attribute names are `transformers`' module names (`attention.self.query_proj`, `pos_key_proj`,
`encoder.rel_embeddings`, ...), so `tm.state_dict` names each array as `transformers`'
`state_dict()` does. The layers are one `nn.Stack` at `encoder.layer`; the output blocks are
BERT's (`_bert_layers`). Attention is the zoo's one `attend`, with the relative-position scores
(content-to-position, position-to-content) as its additive bias.
"""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names

from ._attention_parts import attend, projection_keys, split_key
from ._axis_layouts import attention_in, positions
from ._bert_layers import BertIntermediate, BertSelfOutput
from ._hf_activations import get_activation

__all__ = [
    "DebertaV2ConvLayer",
    "DebertaV2Embeddings",
    "DebertaV2Encoder",
    "DebertaV2Layer",
    "DisentangledSelfAttention",
    "relative_positions",
]


def relative_positions(seq: Any, buckets: int, max_position: int) -> Array:
    """`q - k` for `(seq, seq)` query and key indices, log-bucketed as `transformers`'
    `make_log_bucket_position` (in float32) when `buckets` and `max_position` are positive.

    A symbolic `seq` (`jax.export`) reads a finite table instead: distances past the one whose
    bucket reaches the span are cut to it, which changes no score, because attention clips
    every index to the span.
    """
    if isinstance(seq, int):
        index = np.arange(seq, dtype=np.int64)
        return jnp.asarray(_buckets(index[:, None] - index[None, :], buckets, max_position))
    table, reach = _bucket_table(buckets, max_position)
    symbolic = jnp.arange(seq)
    rel = jnp.clip(symbolic[:, None] - symbolic[None, :], -reach, reach)
    return jnp.asarray(table)[rel + reach]


def _buckets(rel: np.ndarray, buckets: int, max_position: int) -> np.ndarray:
    if buckets <= 0 or max_position <= 0:
        return rel
    mid = buckets // 2
    f32 = np.float32
    abs_pos = np.where((rel < mid) & (rel > -mid), mid - 1, np.abs(rel))
    ratio = np.log((abs_pos / f32(mid)).astype(f32)) / np.log(f32((max_position - 1) / mid))
    log_pos = np.ceil((ratio * f32(mid - 1)).astype(f32)) + f32(mid)
    bucket = np.where(abs_pos <= mid, rel.astype(f32), log_pos * np.sign(rel).astype(f32))
    return bucket.astype(np.int64)


@functools.lru_cache(maxsize=8)
def _bucket_table(buckets: int, max_position: int) -> tuple[np.ndarray, int]:
    """The buckets of the distances `-reach..reach`, `reach` the first distance whose bucket
    reaches the span (`buckets`, or `max_position` without bucketing)."""
    span = buckets if buckets > 0 else max_position
    last = max(span, max_position, 1) + 1
    rel = np.arange(-last, last + 1, dtype=np.int64)
    bucket = _buckets(rel, buckets, max_position)[last:]
    reached = np.flatnonzero(bucket >= span)
    if not reached.size or np.any(np.diff(bucket) < 0):
        raise ValueError(
            f"DeBERTa-v2: with position_buckets={buckets} and max_relative_positions="
            f"{max_position} the relative positions do not grow to the span, so they are "
            f"computed for a concrete sequence length only: export with a fixed sequence "
            f"length (a symbolic batch works)."
        )
    reach = int(reached[0])
    table = _buckets(np.arange(-reach, reach + 1, dtype=np.int64), buckets, max_position)
    return table.astype(np.int32), reach


@axis_names(positions("position_embeddings", "token_type_embeddings"))
class DebertaV2Embeddings(Module):
    """Word (+ absolute position) (+ token type) embeddings, projected, normalised, masked."""

    word_embeddings: nn.Embedding
    position_embeddings: nn.Embedding | None
    token_type_embeddings: nn.Embedding | None
    embed_proj: nn.Linear | None
    LayerNorm: nn.LayerNorm  # noqa: N815 (transformers' name)
    dropout: nn.Dropout

    def __call__(
        self,
        words: Array,
        token_type_ids: Array,
        position_ids: Array,
        mask: Array,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """`(batch, seq, embedding_size)` word embeddings to `(batch, seq, hidden)`."""
        x = words
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(position_ids)
        if self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings(token_type_ids)
        if self.embed_proj is not None:
            x = self.embed_proj(x, key=projection_keys(key, 1)[0])
        x = self.LayerNorm(x) * mask[..., None].astype(x.dtype)
        return self.dropout(x, key=key)


@axis_names(attention_in("query_proj", "key_proj", "value_proj", "pos_key_proj", "pos_query_proj"))
class DisentangledSelfAttention(Module):
    """Content attention plus relative-position scores (`c2p`, `p2c` of `pos_att_type`).

    `pos_key_proj` and `pos_query_proj` exist without `share_att_key` (else the content
    projections embed the relative positions too); all relative parts are `None` without
    `relative_attention`.
    """

    query_proj: nn.Linear
    key_proj: nn.Linear
    value_proj: nn.Linear
    pos_key_proj: nn.Linear | None
    pos_query_proj: nn.Linear | None
    pos_dropout: nn.Dropout | None
    dropout: nn.Dropout
    num_heads: int = field(static=True)
    pos_att_type: tuple[str, ...] = field(static=True)
    relative: bool = field(static=True)
    share_att_key: bool = field(static=True)
    att_span: int = field(static=True)

    def _heads(self, x: Array) -> Array:
        return x.reshape(*x.shape[:-1], self.num_heads, -1)

    def __call__(
        self,
        x: Array,
        mask: Array,
        rel_embeddings: Array | None,
        rel_pos: Array | None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """`(batch, seq, hidden)` to the heads' concatenated outputs."""
        k_pos, k_att = split_key(key, 2)
        # The relative scores call a projection again (on the position embeddings): its own key.
        kq, kk, kv, *k_rel = projection_keys(key, 5)
        q = self._heads(self.query_proj(x, key=kq))
        k = self._heads(self.key_proj(x, key=kk))
        v = self._heads(self.value_proj(x, key=kv))
        factor = 1 + len(self.pos_att_type)
        scale = np.sqrt(np.float32(q.shape[-1] * factor))
        bias = None
        if self.relative:
            assert rel_embeddings is not None and rel_pos is not None and self.pos_dropout
            rel = self.pos_dropout(rel_embeddings[: 2 * self.att_span], key=k_pos)
            bias = self._relative_scores(q, k, rel, rel_pos, scale, keys=k_rel)
        out = attend(
            q,
            k,
            v,
            mask,
            scale=float(1 / scale),
            bias=bias,
            dropout=self.dropout,
            key=k_att,
            scores="input",
        )
        return out.reshape(*x.shape[:-1], -1)

    def _relative_scores(
        self,
        q: Array,
        k: Array,
        rel: Array,
        rel_pos: Array,
        scale: np.floating,
        *,
        keys: list[PRNGKeyArray | None],
    ) -> Array:
        """The `(batch, heads, q, k)` scores of relative positions, already scaled (`keys`:
        the position key's and query's projections' keys)."""
        span = self.att_span
        score = jnp.zeros((q.shape[0], q.shape[2], q.shape[1], k.shape[1]), q.dtype)
        if "c2p" in self.pos_att_type:
            proj = self.key_proj if self.share_att_key else self.pos_key_proj
            assert proj is not None
            pos_key = self._heads(proj(rel, key=keys[0]))  # (2 span, heads, d)
            c2p = jnp.einsum("bqhd,rhd->bhqr", q, pos_key)
            index = jnp.clip(rel_pos + span, 0, 2 * span - 1)  # (q, k)
            c2p = jnp.take_along_axis(c2p, jnp.broadcast_to(index, c2p.shape[:2] + index.shape), -1)
            score = score + c2p / jnp.asarray(scale, c2p.dtype)
        if "p2c" in self.pos_att_type:
            proj = self.query_proj if self.share_att_key else self.pos_query_proj
            assert proj is not None
            pos_query = self._heads(proj(rel, key=keys[1]))
            p2c = jnp.einsum("bkhd,rhd->bhkr", k, pos_query)
            index = jnp.clip(-rel_pos + span, 0, 2 * span - 1)  # indexed (key, query)
            p2c = jnp.take_along_axis(p2c, jnp.broadcast_to(index, p2c.shape[:2] + index.shape), -1)
            score = score + jnp.swapaxes(p2c, -1, -2) / jnp.asarray(scale, p2c.dtype)
        return score


@axis_names({"output.dense.weight": ("embed", "heads")})
class DebertaV2Attention(Module):
    """Self-attention (`attention.self`) and its output block."""

    self: DisentangledSelfAttention
    output: BertSelfOutput

    def __call__(
        this,
        x: Array,
        mask: Array,
        rel_embeddings: Array | None,
        rel_pos: Array | None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Array:  # `this`: the field `self` is transformers' name
        """The attention block's output `(batch, seq, hidden)`."""
        k1, k2 = split_key(key, 2)
        return this.output(this.self(x, mask, rel_embeddings, rel_pos, key=k1), x, key=k2)


class DebertaV2Layer(Module):
    """One encoder layer: attention, then the feed-forward block, each post-normed."""

    attention: DebertaV2Attention
    intermediate: BertIntermediate
    output: BertSelfOutput

    def __call__(
        self,
        x: Array,
        mask: Array,
        rel_embeddings: Array | None,
        rel_pos: Array | None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """`(batch, seq, hidden)` to the same shape."""
        k1, k2 = split_key(key, 2)
        (k_inner,) = projection_keys(key, 1)
        h = self.attention(x, mask, rel_embeddings, rel_pos, key=k1)
        return self.output(self.intermediate(h, key=k_inner), h, key=k2)


class DebertaV2ConvLayer(Module):
    """The convolution over the embeddings that joins the first layer's output (`conv`)."""

    conv: nn.Conv1d
    LayerNorm: nn.LayerNorm  # noqa: N815
    dropout: nn.Dropout
    act: str = field(static=True)

    def __call__(
        self, embedded: Array, residual: Array, mask: Array, *, key: PRNGKeyArray | None = None
    ) -> Array:
        """`mask * LayerNorm(residual + act(conv(embedded)))`, padded positions zero."""
        (k_conv,) = projection_keys(key, 1)
        out = jnp.swapaxes(self.conv(jnp.swapaxes(embedded, 1, 2), key=k_conv), 1, 2)
        keep = mask[..., None].astype(out.dtype)
        out = get_activation(self.act)(self.dropout(out * keep, key=key))
        return self.LayerNorm(residual + out) * keep


@axis_names(positions("rel_embeddings"))
class DebertaV2Encoder(Module):
    """The layers (`layer`, an `nn.Stack`), relative embeddings, their norm, the convolution."""

    layer: nn.Stack
    rel_embeddings: nn.Embedding | None
    LayerNorm: nn.LayerNorm | None  # noqa: N815
    conv: DebertaV2ConvLayer | None
    buckets: int = field(static=True)
    max_relative: int = field(static=True)

    def __call__(self, x: Array, mask: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Run every layer on the embeddings `x` with the `(batch, seq)` boolean `mask`."""
        k_first, k_conv, k_rest = split_key(key, 3)
        pair = mask[:, None, :, None] & mask[:, None, None, :]  # padded queries attend nothing
        rel_embeddings = rel_pos = None
        if self.rel_embeddings is not None:
            rel_embeddings = self.rel_embeddings.weight
            if self.LayerNorm is not None:
                rel_embeddings = self.LayerNorm(rel_embeddings)
            rel_pos = relative_positions(x.shape[1], self.buckets, self.max_relative)
        if self.conv is None:
            out: Array = self.layer(x, pair, rel_embeddings, rel_pos, key=key)
            return out
        first = self.layer[0](x, pair, rel_embeddings, rel_pos, key=k_first)
        first = self.conv(x, first, mask, key=k_conv)
        if len(self.layer) == 1:
            return first
        # The convolution joins after the first layer: the others run as one scan.
        rest = nn.Stack.from_layers([self.layer[i] for i in range(1, len(self.layer))])
        out = rest(first, pair, rel_embeddings, rel_pos, key=k_rest)
        return out
