"""ModernBERT's parts: embeddings, the encoder layer (rotary attention, GeGLU MLP), the head.

Attribute names are `transformers`' module names (`attn.Wqkv`, `mlp.Wi`, `mlp_norm`, ...), so
`tm.state_dict` names each array as `transformers`' `state_dict()` does. Layers are a tuple
(`layers.{i}`): the first has no `attn_norm`, and global and local layers differ in their
window, so they do not share one structure for an `nn.Stack`.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax import Array, lax
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names

from ._attention_parts import attend, projection_keys, split_key
from ._axis_layouts import attention_in, attention_out, mlp_out
from ._hf_activations import get_activation
from ._rope import Rope, apply_rope

__all__ = [
    "ModernBertEmbeddings",
    "ModernBertEncoderLayer",
    "ModernBertPredictionHead",
    "ModernBertRotary",
    "window_masks",
]


class ModernBertEmbeddings(Module):
    """Token embeddings, normalised (`transformers`' `ModernBertEmbeddings`)."""

    tok_embeddings: nn.Embedding
    norm: nn.LayerNorm
    drop: nn.Dropout

    def __call__(self, words: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`drop(norm(words))` for looked-up (or given) embeddings `(batch, seq, hidden)`."""
        return self.drop(self.norm(words), key=key)


class ModernBertRotary(Module):
    """The rotary tables of the two layer types: global (`full_attention`) and local."""

    full: Rope
    sliding: Rope

    def __call__(self, position_ids: Array, dtype: Any) -> dict[bool, tuple[Array, Array]]:
        """`{is_local: (cos, sin)}` for `(batch, seq)` positions."""
        return {False: self.full(position_ids, dtype), True: self.sliding(position_ids, dtype)}


@axis_names({**attention_in("Wqkv"), **attention_out("Wo")})
class ModernBertAttention(Module):
    """Fused query-key-value projection, rotary positions, attention, output projection."""

    Wqkv: nn.Linear  # noqa: N815 (transformers' name)
    Wo: nn.Linear  # noqa: N815
    attn_drop: nn.Dropout
    out_drop: nn.Dropout
    num_heads: int = field(static=True)

    def __call__(
        self,
        x: Array,
        mask: Array | None,
        rope: tuple[Array, Array],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """`(batch, seq, hidden)` to the same shape."""
        k1, k2 = split_key(key, 2)
        k_qkv, k_out = projection_keys(key, 2)
        b, s, _ = x.shape
        qkv = self.Wqkv(x, key=k_qkv).reshape(b, s, 3, self.num_heads, -1)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        # transformers rotates in float32 by tables in the hidden states' dtype, then casts back.
        cos, sin = (t.astype(jnp.float32) for t in rope)
        q = apply_rope(q.astype(jnp.float32), cos, sin).astype(x.dtype)
        k = apply_rope(k.astype(jnp.float32), cos, sin).astype(x.dtype)
        scale = q.shape[-1] ** -0.5
        out = attend(q, k, v, mask, scale=scale, dropout=self.attn_drop, key=k1, scores="input")
        return self.out_drop(self.Wo(out.reshape(b, s, -1), key=k_out), key=k2)


@axis_names(mlp_out("Wo"))
class ModernBertMLP(Module):
    """GeGLU: `Wo(drop(act(input) * gate))` with `input, gate` the halves of `Wi(x)`."""

    Wi: nn.Linear  # noqa: N815
    Wo: nn.Linear  # noqa: N815
    drop: nn.Dropout
    act: str = field(static=True)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, seq, hidden)` to the same shape."""
        k_in, k_out = projection_keys(key, 2)
        h = self.Wi(x, key=k_in)
        half = h.shape[-1] // 2
        gated = get_activation(self.act)(h[..., :half]) * h[..., half:]
        return self.Wo(self.drop(gated, key=key), key=k_out)


class ModernBertEncoderLayer(Module):
    """Pre-norm layer: `x + attn(attn_norm(x))`, then `x + mlp(mlp_norm(x))`.

    The first layer has no `attn_norm` (the embeddings' norm precedes it), as in `transformers`.
    `local` layers attend within `local_attention // 2` positions either side.
    """

    attn_norm: nn.LayerNorm | None
    attn: ModernBertAttention
    mlp_norm: nn.LayerNorm
    mlp: ModernBertMLP
    local: bool = field(static=True)

    def __call__(
        self,
        x: Array,
        masks: dict[bool, Array | None],
        ropes: dict[bool, tuple[Array, Array]],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """`(batch, seq, hidden)` to the same shape."""
        k1, k2 = split_key(key, 2)
        h = x if self.attn_norm is None else self.attn_norm(x)
        x = x + self.attn(h, masks[self.local], ropes[self.local], key=k1)
        return x + self.mlp(self.mlp_norm(x), key=k2)


class ModernBertPredictionHead(Module):
    """`norm(act(dense(x)))`: the heads' shared transform (`head` in `transformers`)."""

    dense: nn.Linear
    norm: nn.LayerNorm
    act: str = field(static=True)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The transformed hidden states (`key`: `dense`'s, for LoRA dropout)."""
        return self.norm(get_activation(self.act)(self.dense(x, key=key)))


def window_masks(
    attention_mask: Array | None, seq: int, half_window: int
) -> dict[bool, Array | None]:
    """`{is_local: boolean mask (batch or 1, 1, seq, seq) or None}`, as `transformers`' masks.

    Global layers see every real key; local ones those within `half_window` positions either
    side (`create_bidirectional_sliding_window_mask`: `|q - k| <= local_attention // 2`).
    """
    index = lax.iota(jnp.int32, seq)
    near = (jnp.abs(index[:, None] - index[None, :]) <= half_window)[None, None]
    if attention_mask is None:
        return {False: None, True: near}
    keys = attention_mask.astype(bool)[:, None, None, :]
    return {False: keys, True: keys & near}
