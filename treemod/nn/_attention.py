"""`MultiheadAttention`."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Num, PRNGKeyArray

from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names

from . import init as _init
from ._batching import Core, batch_apply
from ._dropout import Dropout
from ._linear import Linear
from ._utils import check_number, check_size, compute_dtype, promote_input, require_key

__all__ = ["MultiheadAttention"]


@axis_names(
    {
        **{
            f"{p}_proj.{f}": n
            for p in ("query", "key", "value")
            for f, n in (("weight", ("heads", "embed")), ("bias", ("heads",)))
        },
        "output_proj.weight": ("embed", "heads"),
        "output_proj.bias": ("embed",),
    }
)
class MultiheadAttention(Module):
    """Multi-head scaled dot-product attention (Equinox's `nn.MultiheadAttention`).

    Projects queries, keys and values with four `Linear` layers, attends per head with
    `softmax(q k^T / sqrt(qk_size))`, and projects the concatenated heads. The key is split
    once into four: query, key, value and output projections. As in Equinox, the projections
    have no bias unless asked for (PyTorch's `nn.MultiheadAttention` has them: pass the four
    `use_*_bias=True` to match it).

    Inputs are one example `query (q_seq, query_size)`, `key_ (kv_seq, key_size)`,
    `value (kv_seq, value_size)`, or any number of leading batch dimensions on top, shared by
    the three (an input without them is broadcast).

    Arguments:
        num_heads: number of heads.
        query_size: query feature size.
        key_size: key feature size (default `query_size`).
        value_size: value feature size (default `query_size`).
        output_size: output feature size (default `query_size`).
        qk_size: per-head query/key size (default `query_size // num_heads`).
        vo_size: per-head value/output size (default `query_size // num_heads`).
        use_query_bias: bias in the query projection.
        use_key_bias: bias in the key projection.
        use_value_bias: bias in the value projection.
        use_output_bias: bias in the output projection.
        dropout_p: dropout probability on the attention weights, in [0, 1].
        inference: start with attention dropout off.
        dtype: parameter dtype.
        weight_init: weight initialiser of the projections (default PyTorch's Linear one).
        key: the PRNG key.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> mha = nn.MultiheadAttention(4, 32, key=jax.random.key(0))
        >>> x = jnp.ones((2, 10, 32))
        >>> mha(x, x, x, causal=True).shape
        (2, 10, 32)
    """

    query_proj: Linear
    key_proj: Linear
    value_proj: Linear
    output_proj: Linear
    dropout: Dropout
    num_heads: int = field(static=True)
    query_size: int = field(static=True)
    key_size: int = field(static=True)
    value_size: int = field(static=True)
    output_size: int = field(static=True)
    qk_size: int = field(static=True)
    vo_size: int = field(static=True)
    use_query_bias: bool = field(static=True)
    use_key_bias: bool = field(static=True)
    use_value_bias: bool = field(static=True)
    use_output_bias: bool = field(static=True)

    def __init__(
        self,
        num_heads: int,
        query_size: int,
        key_size: int | None = None,
        value_size: int | None = None,
        output_size: int | None = None,
        qk_size: int | None = None,
        vo_size: int | None = None,
        use_query_bias: bool = False,
        use_key_bias: bool = False,
        use_value_bias: bool = False,
        use_output_bias: bool = False,
        dropout_p: float = 0.0,
        inference: bool = False,
        dtype: Any = None,
        *,
        weight_init: _init.Initializer | None = None,
        key: PRNGKeyArray,
    ) -> None:
        require_key("MultiheadAttention", key)
        sizes = dict(num_heads=num_heads, query_size=query_size, key_size=key_size)
        sizes |= dict(value_size=value_size, output_size=output_size, qk_size=qk_size)
        for name, v in (*sizes.items(), ("vo_size", vo_size)):
            if v is not None or name in ("num_heads", "query_size"):
                check_size("MultiheadAttention", name, v)
        note = " It is the dropout probability on the attention weights (0 switches it off)."
        check_number("MultiheadAttention", "dropout_p", dropout_p, 0, 1, note=note)
        if (qk_size is None or vo_size is None) and query_size % num_heads:
            raise ValueError(
                f"MultiheadAttention: query_size={query_size} is not divisible by "
                f"num_heads={num_heads}; give `qk_size` and `vo_size` explicitly."
            )
        key_size = query_size if key_size is None else key_size
        value_size = query_size if value_size is None else value_size
        output_size = query_size if output_size is None else output_size
        qk_size = query_size // num_heads if qk_size is None else qk_size
        vo_size = query_size // num_heads if vo_size is None else vo_size
        qkey, kkey, vkey, okey = jax.random.split(key, 4)
        kw: dict[str, Any] = dict(dtype=dtype, weight_init=weight_init)
        self.query_proj = Linear(query_size, num_heads * qk_size, use_query_bias, key=qkey, **kw)
        self.key_proj = Linear(key_size, num_heads * qk_size, use_key_bias, key=kkey, **kw)
        self.value_proj = Linear(value_size, num_heads * vo_size, use_value_bias, key=vkey, **kw)
        self.output_proj = Linear(num_heads * vo_size, output_size, use_output_bias, key=okey, **kw)
        self.dropout = Dropout(dropout_p, inference=inference)
        self.num_heads = num_heads
        self.query_size = query_size
        self.key_size = key_size
        self.value_size = value_size
        self.output_size = output_size
        self.qk_size = qk_size
        self.vo_size = vo_size
        self.use_query_bias = use_query_bias
        self.use_key_bias = use_key_bias
        self.use_value_bias = use_value_bias
        self.use_output_bias = use_output_bias

    def __call__(
        self,
        query: Num[Array, "*batch q_seq query_size"],
        key_: Num[Array, "*#batch kv_seq key_size"],
        value: Num[Array, "*#batch kv_seq value_size"],
        mask: Bool[Array, "..."] | None = None,
        *,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
        deterministic: bool | None = None,
        causal: bool = False,
    ) -> Float[Array, "*batch q_seq output_size"]:
        """Attend from `query` to `key_`/`value`.

        Arguments:
            query: `(*batch, q_seq, query_size)`.
            key_: `(*batch, kv_seq, key_size)` (or without batch dimensions).
            value: `(*batch, kv_seq, value_size)` (or without batch dimensions).
            mask: boolean, `True` where attention is allowed: `(q_seq, kv_seq)` or
                `(num_heads, q_seq, kv_seq)`, shared by the batch, or either with the batch
                dimensions in front.
            key: PRNG key for attention dropout.
            inference: overrides the dropout's inference flag.
            deterministic: deprecated Equinox alias of `inference`.
            causal: also mask future positions (`j > i`, aligned at the top left as in
                PyTorch's `is_causal`).

        Returns:
            `(*batch, q_seq, output_size)`.
        """
        dtype = self.query_proj.weight.dtype
        query, key_, value = (promote_input(a, dtype) for a in (query, key_, value))
        q_len = np.shape(query)[-2] if jnp.ndim(query) >= 2 else None
        kv_len = np.shape(key_)[-2] if jnp.ndim(key_) >= 2 else None
        inputs = [
            Core("query", query, (("q_seq", None), ("query_size", self.query_size))),
            Core("key_", key_, (("kv_seq", None), ("key_size", self.key_size))),
            Core("value", value, (("kv_seq", kv_len), ("value_size", self.value_size))),
        ]
        batch_ndim = jnp.ndim(query) - 2
        mask_core: Any = None
        if mask is not None:
            mask = jnp.asarray(mask)
            if mask.dtype != jnp.bool_:
                raise TypeError(
                    f"MultiheadAttention: `mask` must be boolean (True = attend); got dtype "
                    f"{mask.dtype}."
                )
            batch = np.shape(query)[:batch_ndim]
            per_example = mask.ndim >= 2 + batch_ndim and mask.shape[:batch_ndim] == batch
            heads = mask.ndim - (batch_ndim if per_example and batch_ndim else 0) == 3
            mask_core = (("q_seq", q_len), ("kv_seq", kv_len))
            if heads:
                mask_core = (("num_heads", self.num_heads),) + mask_core
            inputs.append(Core("mask", mask, mask_core))
        else:
            inputs.append(Core("mask", None, None))
        # Passed through unbatched: the key is traced, the flags are static.
        passed = {"causal": causal, "key": key, "inference": inference}
        passed["deterministic"] = deterministic
        inputs += [Core(name, v, None) for name, v in passed.items()]
        return batch_apply("MultiheadAttention", self._flat, inputs)

    def _flat(
        self,
        query: Array,
        key_: Array,
        value: Array,
        mask: Array | None,
        causal: bool,
        key: PRNGKeyArray | None,
        inference: bool | None,
        deterministic: bool | None,
    ) -> Array:
        n, q_len, _ = query.shape
        kv_len = key_.shape[1]
        h = self.num_heads
        q = self.query_proj(query).reshape(n, q_len, h, self.qk_size)
        k = self.key_proj(key_).reshape(n, kv_len, h, self.qk_size)
        v = self.value_proj(value).reshape(n, kv_len, h, self.vo_size)
        logits = jnp.einsum("nqhd,nkhd->nhqk", q, k) / math.sqrt(self.qk_size)
        allowed = None
        if mask is not None:
            allowed = mask[:, None] if mask.ndim == 3 else mask
        if causal:
            tri = jnp.tril(jnp.ones((q_len, kv_len), jnp.bool_))[None, None]
            allowed = tri if allowed is None else allowed & tri
        if allowed is not None:
            allowed = jnp.broadcast_to(allowed, logits.shape)
            logits = jnp.where(allowed, logits, jnp.finfo(logits.dtype).min)
        weights = jax.nn.softmax(logits.astype(compute_dtype(logits.dtype)), -1)
        weights = weights.astype(query.dtype)
        weights = self.dropout(weights, key=key, inference=inference, deterministic=deterministic)
        attn = jnp.einsum("nhqk,nkhd->nqhd", weights, v).reshape(n, q_len, h * self.vo_size)
        return self.output_proj(attn)
