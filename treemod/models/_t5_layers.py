"""T5's layers: attention with relative position buckets, its feed-forward, blocks and stacks.

Attribute names are `transformers`' (`block.0.layer.0.SelfAttention.q`,
`layer.1.EncDecAttention`, `layer.2.DenseReluDense.wi_0`), every projection an `nn.Linear`, so
`tm.state_dict` names them as `transformers` does and PEFT's `target_modules` (`q`, `v`) select
them. Only the first block's self-attention holds `relative_attention_bias`; the bias it makes
is shared by every layer of its stack, so the blocks are a tuple (not an `nn.Stack`).
T5's LayerNorm is `nn.RMSNorm` without bias (no mean subtracted), attention is unscaled.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names
from treemod.models._attention_parts import attend, projection_keys, split_key
from treemod.models._axis_layouts import attention_in, attention_out, mlp_out
from treemod.models._causal_lm import KVCache
from treemod.models._hf_activations import get_activation

__all__ = [
    "T5Attention",
    "T5Block",
    "T5DenseActDense",
    "T5DenseGatedActDense",
    "T5LayerCrossAttention",
    "T5LayerFF",
    "T5LayerSelfAttention",
    "T5Stack",
    "bucket_table",
    "build_stack",
]


def bucket_table(span: int, bidirectional: bool, num_buckets: int, max_distance: int) -> Array:
    """T5's bucket of every relative position `-span .. span` (`key - query`), at index `+span`.

    As `transformers`' `_relative_position_bucket`, in float32 as it computes the logarithmic
    buckets: half of the buckets (per direction when bidirectional) are exact distances, the
    rest logarithmic up to `max_distance`, beyond which all share the last bucket. Computed
    with NumPy when tracing, so no float rounding of the compiled program can move a bucket.
    """
    relative = np.arange(-span, span + 1, dtype=np.int64)
    buckets = np.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative > 0) * num_buckets
        relative = np.abs(relative)
    else:
        relative = -np.minimum(relative, 0)
    max_exact = num_buckets // 2
    with np.errstate(divide="ignore"):
        scaled = (
            np.log(relative.astype(np.float32) / np.float32(max_exact))
            / np.float32(math.log(max_distance / max_exact))
            * np.float32(num_buckets - max_exact)
        )
    large = max_exact + np.where(np.isfinite(scaled), scaled, 0).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return jnp.asarray(buckets + np.where(relative < max_exact, relative, large), jnp.int32)


@axis_names(
    {**attention_in("q", "k", "v"), **attention_out("o"), "relative_attention_bias.weight": None}
)
class T5Attention(Module):
    """T5's multi-head attention: unscaled scores plus a relative position bias.

    `relative_attention_bias` (`(num_buckets, heads)`) is held by the first layer's
    self-attention only; `position_bias` makes the bias every layer of the stack adds.
    """

    q: nn.Linear
    k: nn.Linear
    v: nn.Linear
    o: nn.Linear
    relative_attention_bias: nn.Embedding | None
    dropout: nn.Dropout
    n_heads: int = field(static=True)
    d_kv: int = field(static=True)
    bidirectional: bool = field(static=True)
    num_buckets: int = field(static=True)
    max_distance: int = field(static=True)

    def position_bias(self, queries: Array, keys: int) -> Array:
        """The bias `(1, heads, q_len, keys)` for queries at positions `queries` `(q_len,)`.

        Arguments:
            queries: the queries' positions (may be traced: a cache's offset).
            keys: the number of keys, at positions `0 .. keys - 1`.
        """
        assert self.relative_attention_bias is not None
        # From `max_distance` on every distance shares its direction's last bucket: a table
        # over -max_distance..max_distance serves any length (a symbolic one under jax.export).
        span = self.max_distance
        table = bucket_table(span, self.bidirectional, self.num_buckets, self.max_distance)
        relative = jnp.clip(jax.lax.iota(jnp.int32, keys)[None, :] - queries[:, None], -span, span)
        values = self.relative_attention_bias.weight[table[relative + span]]
        return jnp.transpose(values, (2, 0, 1))[None]

    def __call__(
        self,
        x: Array,
        mask: Array | None,
        bias: Array | None,
        *,
        states: Array | None = None,
        kv: tuple[Array, Array] | None = None,
        cache: KVCache | None = None,
        key: PRNGKeyArray | None = None,
    ) -> tuple[Array, KVCache | None]:
        """Attention output `(batch, q_len, d_model)`.

        Arguments:
            x: normalised hidden states `(batch, q_len, d_model)`, the queries (and, for
                self-attention, the keys and values).
            mask: booleans broadcasting to `(batch, 1, q_len, keys)`, True to attend.
            bias: the position bias `(1, heads, q_len, keys)`, or `None` (cross-attention).
            states: the encoder's hidden states, for cross-attention.
            kv: precomputed cross-attention keys and values (`generate_seq2seq`).
            cache: `generate_seq2seq`'s self-attention cache.
            key: dropout key (training mode only).

        Returns:
            `(output, cache)`.
        """
        batch, q_len, _ = x.shape
        kq, kk, kv_key, ko = projection_keys(key, 4)
        q = self.q(x, key=kq).reshape(batch, q_len, self.n_heads, self.d_kv)
        if kv is not None:
            k, v = kv
        else:
            k, v = self.keys_values(x if states is None else states, keys=(kk, kv_key))
        if cache is not None:
            cache, k, v = cache.write(k, v)
        out = attend(q, k, v, mask, scale=1.0, bias=bias, dropout=self.dropout, key=key)
        return self.o(out.reshape(batch, q_len, self.n_heads * self.d_kv), key=ko), cache

    def keys_values(
        self, states: Array, *, keys: tuple[PRNGKeyArray | None, PRNGKeyArray | None] = (None, None)
    ) -> tuple[Array, Array]:
        """Keys and values `(batch, len, heads, d_kv)` of `states` (`keys`: `k`'s and `v`'s
        keys, for LoRA dropout)."""
        batch, length, _ = states.shape
        k = self.k(states, key=keys[0]).reshape(batch, length, self.n_heads, self.d_kv)
        v = self.v(states, key=keys[1]).reshape(batch, length, self.n_heads, self.d_kv)
        return k, v


class T5LayerSelfAttention(Module):
    """`x + dropout(SelfAttention(layer_norm(x)))`."""

    SelfAttention: T5Attention  # noqa: N815 (transformers' name)
    layer_norm: nn.RMSNorm
    dropout: nn.Dropout


class T5LayerCrossAttention(Module):
    """`x + dropout(EncDecAttention(layer_norm(x), encoder states))`."""

    EncDecAttention: T5Attention  # noqa: N815 (transformers' name)
    layer_norm: nn.RMSNorm
    dropout: nn.Dropout


@axis_names(mlp_out("wo"))
class T5DenseActDense(Module):
    """`wo(dropout(act(wi(x))))`."""

    wi: nn.Linear
    wo: nn.Linear
    dropout: nn.Dropout
    act: str = field(static=True)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Apply the feed-forward to `(..., d_model)`."""
        k_in, k_out = projection_keys(key, 2)
        h = get_activation(self.act)(self.wi(x, key=k_in))
        return self.wo(self.dropout(h, key=key), key=k_out)


@axis_names(mlp_out("wo"))
class T5DenseGatedActDense(Module):
    """`wo(dropout(act(wi_0(x)) * wi_1(x)))` (T5 v1.1, flan-t5)."""

    wi_0: nn.Linear
    wi_1: nn.Linear
    wo: nn.Linear
    dropout: nn.Dropout
    act: str = field(static=True)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Apply the feed-forward to `(..., d_model)`."""
        k0, k1, k_out = projection_keys(key, 3)
        gated = get_activation(self.act)(self.wi_0(x, key=k0)) * self.wi_1(x, key=k1)
        return self.wo(self.dropout(gated, key=key), key=k_out)


class T5LayerFF(Module):
    """`x + dropout(DenseReluDense(layer_norm(x)))`."""

    DenseReluDense: T5DenseActDense | T5DenseGatedActDense  # noqa: N815 (transformers' name)
    layer_norm: nn.RMSNorm
    dropout: nn.Dropout

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The residual block over `(batch, seq, d_model)`."""
        k1, k2 = split_key(key, 2)
        return x + self.dropout(self.DenseReluDense(self.layer_norm(x), key=k1), key=k2)


class T5Block(Module):
    """One block: `layer` is (self-attention, [cross-attention,] feed-forward)."""

    layer: tuple[Any, ...]

    def __call__(
        self,
        x: Array,
        mask: Array | None,
        bias: Array | None,
        cross_mask: Array | None,
        states: Array | None,
        kv: tuple[Array, Array] | None,
        cache: KVCache | None,
        key: PRNGKeyArray | None,
    ) -> tuple[Array, KVCache | None]:
        """`x` through the block's layers."""
        keys = split_key(key, 5)
        attn = self.layer[0]
        h, cache = attn.SelfAttention(attn.layer_norm(x), mask, bias, cache=cache, key=keys[0])
        x = x + attn.dropout(h, key=keys[1])
        if len(self.layer) == 3:
            cross = self.layer[1]
            h, _ = cross.EncDecAttention(
                cross.layer_norm(x), cross_mask, None, states=states, kv=kv, key=keys[2]
            )
            x = x + cross.dropout(h, key=keys[3])
        return self.layer[-1](x, key=keys[4]), cache


class T5Stack(Module):
    """The encoder's or decoder's blocks and final norm (the embedding is the model's `shared`)."""

    block: tuple[T5Block, ...]
    final_layer_norm: nn.RMSNorm
    dropout: nn.Dropout

    def __call__(
        self,
        hidden: Array,
        mask: Array | None,
        queries: Array,
        *,
        cross_mask: Array | None = None,
        states: Array | None = None,
        cross: tuple[tuple[Array, ...], tuple[Array, ...]] | None = None,
        cache: KVCache | None = None,
        key: PRNGKeyArray | None = None,
    ) -> tuple[Array, KVCache | None]:
        """The stack over embedded inputs `hidden` `(batch, seq, d_model)`.

        Arguments:
            hidden: the token embeddings.
            mask: the self-attention mask (`(batch or 1, 1, seq, keys)` booleans).
            queries: the queries' positions `(seq,)`, for the relative position bias.
            cross_mask: the mask over the encoder positions (decoder).
            states: the encoder's last hidden states (decoder, without `cross`).
            cross: the precomputed cross-attention keys and values, per block.
            cache: the self-attention cache (decoder in `generate_seq2seq`).
            key: dropout key (training mode only).

        Returns:
            `(hidden, cache)`: the normalised last hidden states and the cache.
        """
        keys = split_key(key, len(self.block) + 2)
        length = hidden.shape[1] if cache is None else cache.valid.shape[1]
        bias = self.block[0].layer[0].SelfAttention.position_bias(queries, length)
        x = self.dropout(hidden, key=keys[0])
        for i, block in enumerate(self.block):
            kv = None if cross is None else (cross[0][i], cross[1][i])
            x, cache = block(x, mask, bias, cross_mask, states, kv, cache, keys[i + 1])
        return self.dropout(self.final_layer_norm(x), key=keys[-1]), cache


def build_stack(v: dict[str, Any], decoder: bool, dtype: Any, *, key: PRNGKeyArray) -> T5Stack:
    """An encoder or decoder stack with `transformers`' initialisation from config values `v`."""
    d_model, d_kv, heads, d_ff = v["d_model"], v["d_kv"], v["num_heads"], v["d_ff"]
    factor = v["initializer_factor"]
    layers = v["num_decoder_layers"] if decoder else v["num_layers"]
    keys = iter(jax.random.split(key, layers * 16 + 1))
    eps = v["layer_norm_epsilon"]

    def drop() -> nn.Dropout:
        # Inference mode, as transformers' from_pretrained gives an eval() model.
        return nn.Dropout(v["dropout_rate"], inference=True)

    def linear(n_in: int, n_out: int, std: float) -> nn.Linear:
        init = nn.init.normal(factor * std)
        return nn.Linear(n_in, n_out, False, dtype, weight_init=init, key=next(keys))

    def norm() -> nn.RMSNorm:
        return nn.RMSNorm(d_model, eps, use_bias=False, dtype=dtype)

    def attention(first: bool, bidirectional: bool) -> T5Attention:
        inner = heads * d_kv
        bias = None
        if first:
            init = nn.init.normal(factor * d_model**-0.5)
            bias = nn.Embedding(
                v["relative_attention_num_buckets"], heads, dtype=dtype, weight_init=init,
                key=next(keys),
            )  # fmt: skip
        return T5Attention(
            q=linear(d_model, inner, (d_model * d_kv) ** -0.5),
            k=linear(d_model, inner, d_model**-0.5),
            v=linear(d_model, inner, d_model**-0.5),
            o=linear(inner, d_model, inner**-0.5),
            relative_attention_bias=bias,
            dropout=drop(),
            n_heads=heads,
            d_kv=d_kv,
            bidirectional=bidirectional,
            num_buckets=v["relative_attention_num_buckets"],
            max_distance=v["relative_attention_max_distance"],
        )

    def feed_forward() -> T5LayerFF:
        dense: T5DenseActDense | T5DenseGatedActDense
        if v["is_gated_act"]:
            dense = T5DenseGatedActDense(
                wi_0=linear(d_model, d_ff, d_model**-0.5),
                wi_1=linear(d_model, d_ff, d_model**-0.5),
                wo=linear(d_ff, d_model, d_ff**-0.5),
                dropout=drop(),
                act=v["dense_act_fn"],
            )
        else:
            dense = T5DenseActDense(
                wi=linear(d_model, d_ff, d_model**-0.5),
                wo=linear(d_ff, d_model, d_ff**-0.5),
                dropout=drop(),
                act=v["dense_act_fn"],
            )
        return T5LayerFF(DenseReluDense=dense, layer_norm=norm(), dropout=drop())

    blocks = []
    for i in range(layers):
        parts: list[Any] = [
            T5LayerSelfAttention(
                SelfAttention=attention(i == 0, not decoder), layer_norm=norm(), dropout=drop()
            )
        ]
        if decoder:
            parts.append(
                T5LayerCrossAttention(
                    EncDecAttention=attention(False, True), layer_norm=norm(), dropout=drop()
                )
            )
        parts.append(feed_forward())
        blocks.append(T5Block(layer=tuple(parts)))
    return T5Stack(block=tuple(blocks), final_layer_norm=norm(), dropout=drop())
