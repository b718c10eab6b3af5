"""Equinox's `MultiheadAttention` call: one sequence, `process_heads`, dropout keys per head.

Parameters and initialisation are treemod's (`treemod.nn.MultiheadAttention`, which match
Equinox's); the call follows Equinox's conventions: `query` is `(q_seq, query_size)`, the mask is
`(q_seq, kv_seq)` or `(num_heads, q_seq, kv_seq)` (booleans, or numbers with non-zero =
attend, as Equinox reads them), `process_heads` may transform the
projected heads (rotary embeddings, say), and attention dropout splits the key into one per head.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from treemod._compat_api import compute_dtype
from treemod.nn import MultiheadAttention as _MultiheadAttention

from ._alias import CompatLayerMeta
from ._init import placeholder
from ._linear import Dropout, Linear

__all__ = ["MultiheadAttention", "dot_product_attention", "dot_product_attention_weights"]


def dot_product_attention_weights(query: Any, key: Any, mask: Any = None) -> Any:
    """Softmax attention weights of one head: `softmax(query @ key.T / sqrt(d))`, masked.

    Arguments:
        query: `(q_seq, d)`.
        key: `(kv_seq, d)`.
        mask: optional booleans `(q_seq, kv_seq)`, `True` where attention is allowed.

    Returns:
        `(q_seq, kv_seq)` weights in `query`'s dtype (the softmax runs in float32 at least).

    Example:
        >>> import jax.numpy as jnp
        >>> from treemod.compat.equinox.nn._attention import dot_product_attention_weights
        >>> dot_product_attention_weights(jnp.ones((1, 2)), jnp.ones((3, 2)))
        Array([[0.333..., 0.333..., 0.333...]], dtype=float32)
    """
    logits = jnp.einsum("qd,kd->qk", query / math.sqrt(query.shape[-1]), key)
    if mask is not None:
        if jnp.shape(mask) != logits.shape:
            raise ValueError(
                f"dot_product_attention: mask must have shape (q_seq, kv_seq)={logits.shape}; "
                f"got {jnp.shape(mask)}."
            )
        logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    return jax.nn.softmax(logits.astype(compute_dtype(logits.dtype)), -1).astype(logits.dtype)


def dot_product_attention(
    query: Any,
    key_: Any,
    value: Any,
    mask: Any = None,
    dropout: Any = None,
    *,
    key: Any = None,
    inference: bool | None = None,
) -> Any:
    """One head of attention: the weights of `dot_product_attention_weights` applied to `value`.

    Arguments:
        query: `(q_seq, d)`.
        key_: `(kv_seq, d)`.
        value: `(kv_seq, v)`.
        mask: optional booleans `(q_seq, kv_seq)`.
        dropout: an optional `Dropout` applied to the weights.
        key: the dropout's key.
        inference: overrides the dropout's inference flag.

    Returns:
        `(q_seq, v)`.
    """
    weights = dot_product_attention_weights(query, key_, mask)
    if dropout is not None:
        weights = dropout(weights, key=key, inference=inference)
    return jnp.einsum("qk,kv->qv", weights, value)


class MultiheadAttention(_MultiheadAttention, metaclass=CompatLayerMeta, shapecheck=False):
    """Multi-head attention with Equinox's call (see the module docstring).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> mha = eqx.nn.MultiheadAttention(2, 8, key=jax.random.key(0))
        >>> q, kv = jnp.ones((5, 8)), jnp.ones((7, 8))
        >>> mask = jnp.tril(jnp.ones((5, 7), bool))
        >>> mha(q, kv, kv, mask).shape
        (5, 8)
    """

    _treemod_layer = _MultiheadAttention

    def __init__(self, *args: Any, key: Any, **kwargs: Any) -> None:
        """Equinox's arguments (those of `treemod.nn.MultiheadAttention`) and draws.

        The projections are the compat `Linear`, drawn as Equinox draws them (in the
        parameter dtype), from the same four keys; the dropout is the compat `Dropout`.
        """
        super().__init__(*args, weight_init=placeholder, key=key, **kwargs)
        keys = jax.random.split(key, 4)
        names = ("query_proj", "key_proj", "value_proj", "output_proj")
        for name, k in zip(names, keys, strict=True):
            old = getattr(self, name)
            dtype = old.weight.dtype
            setattr(
                self, name, Linear(old.in_features, old.out_features, old.use_bias, dtype, key=k)
            )
        self.dropout = Dropout(self.dropout.p, self.dropout.inference)

    # Equinox's signature: `process_heads` where treemod's layer has `causal`.
    def __call__(  # type: ignore[override]
        self,
        query: Any,
        key_: Any,
        value: Any,
        mask: Any = None,
        *,
        key: Any = None,
        inference: bool | None = None,
        deterministic: bool | None = None,
        process_heads: Callable[[Any, Any, Any], tuple[Any, Any, Any]] | None = None,
    ) -> Any:
        """Attend from `query` `(q_seq, query_size)` to `key_`/`value` `(kv_seq, size)`.

        Arguments:
            query: the queries.
            key_: the keys.
            value: the values.
            mask: `True` where attention is allowed, `(q_seq, kv_seq)` or
                `(num_heads, q_seq, kv_seq)`; a numeric mask counts as Equinox reads it
                (non-zero = attend), e.g. the float 0/1 masks of Equinox's BERT example.
            key: PRNG key for attention dropout (split into one per head).
            inference: overrides the dropout's inference flag.
            deterministic: deprecated alias of `inference`.
            process_heads: `(q, k, v) -> (q, k, v)` on the heads `(seq, num_heads, size)`,
                shapes unchanged.

        Returns:
            `(q_seq, output_size)`.
        """
        if deterministic is not None:
            warnings.warn(
                "MultiheadAttention(deterministic=...) is deprecated; pass inference=... instead.",
                DeprecationWarning,
                stacklevel=2,
            )
            inference = deterministic
        query, key_, value = jnp.asarray(query), jnp.asarray(key_), jnp.asarray(value)
        if query.ndim != 2 or key_.ndim != 2 or value.ndim != 2:
            raise ValueError(
                "eqx.nn.MultiheadAttention takes one sequence: query (q_seq, query_size), key_ "
                "and value (kv_seq, size); got shapes "
                f"{query.shape}, {key_.shape}, {value.shape}. For a batch, use "
                "jax.vmap(mha)(query, key_, value)."
            )
        if key_.shape[0] != value.shape[0]:
            raise ValueError(
                f"MultiheadAttention: key_ and value must have the same length; got "
                f"{key_.shape[0]} and {value.shape[0]}."
            )
        h = self.num_heads
        q = self.query_proj(query).reshape(query.shape[0], h, -1)
        k = self.key_proj(key_).reshape(key_.shape[0], h, -1)
        v = self.value_proj(value).reshape(value.shape[0], h, -1)
        if process_heads is not None:
            shapes = (q.shape, k.shape, v.shape)
            q, k, v = process_heads(q, k, v)
            if (q.shape, k.shape, v.shape) != shapes:
                raise ValueError(
                    f"MultiheadAttention: process_heads must keep the shapes of the heads "
                    f"{shapes}; it returned {(q.shape, k.shape, v.shape)}."
                )
        if mask is not None:
            mask = jnp.asarray(mask)
            expected = ((h, q.shape[0], k.shape[0]), (q.shape[0], k.shape[0]))
            if mask.shape not in expected:
                raise ValueError(
                    f"MultiheadAttention: mask must be of shape (q_seq, kv_seq)={expected[1]} "
                    f"or (num_heads, q_seq, kv_seq)={expected[0]} (True or non-zero = attend); "
                    f"got {mask.dtype}{list(mask.shape)}."
                )
            if mask.dtype != jnp.bool_:  # numbers as Equinox's `jnp.where` reads them
                mask = mask != 0
        keys = None if key is None else jax.random.split(key, h)

        def one_head(qh: Any, kh: Any, vh: Any, m: Any, k: Any) -> Any:
            return dot_product_attention(qh, kh, vh, m, self.dropout, key=k, inference=inference)

        per_head_mask = mask is not None and mask.ndim == 3
        attn = jax.vmap(
            one_head,
            in_axes=(1, 1, 1, 0 if per_head_mask else None, None if key is None else 0),
            out_axes=1,
        )(q, k, v, mask, keys)
        return self.output_proj(attn.reshape(query.shape[0], -1))
