"""Equinox's `MultiheadAttention` call: one sequence, `process_heads`, dropout keys per head.

Parameters and initialisation are treemod's (`treemod.nn.MultiheadAttention`, which match
Equinox's); the call follows Equinox's conventions: `query` is `(q_seq, query_size)`, the mask is
`(q_seq, kv_seq)` or `(num_heads, q_seq, kv_seq)` booleans, `process_heads` may transform the
projected heads (rotary embeddings, say), and attention dropout splits the key into one per head.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from treemod.nn._attention import MultiheadAttention as _MultiheadAttention
from treemod.nn._utils import compute_dtype

__all__ = ["MultiheadAttention"]


class MultiheadAttention(_MultiheadAttention):
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
                `(num_heads, q_seq, kv_seq)`.
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
        logits = jnp.einsum("qhd,khd->hqk", q / math.sqrt(q.shape[-1]), k)
        if mask is not None:
            mask = jnp.asarray(mask)
            if mask.dtype != jnp.bool_ or mask.shape not in (logits.shape, logits.shape[1:]):
                raise ValueError(
                    f"MultiheadAttention: mask must be boolean (True = attend) of shape "
                    f"(q_seq, kv_seq)={logits.shape[1:]} or (num_heads, q_seq, kv_seq)="
                    f"{logits.shape}; got {mask.dtype}{list(mask.shape)}."
                )
            logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
        weights = jax.nn.softmax(logits.astype(compute_dtype(logits.dtype)), -1)
        weights = weights.astype(logits.dtype)
        if key is None:
            weights = self.dropout(weights, inference=inference)
        else:
            keys = jax.random.split(key, h)
            weights = jax.vmap(lambda w, k: self.dropout(w, key=k, inference=inference))(
                weights, keys
            )
        attn = jnp.einsum("hqk,khd->qhd", weights, v).reshape(query.shape[0], -1)
        return self.output_proj(attn)
