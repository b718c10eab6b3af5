"""The Llama family's layers: attention with grouped-query heads and RoPE, SwiGLU MLP, block.

Attribute names are `transformers`' (`self_attn.q_proj`, `mlp.gate_proj`, `input_layernorm`,
...), every projection an `nn.Linear`, so `tm.state_dict` names them as `transformers` does and
PEFT's `target_modules` names select them. `generate`'s key-value cache is an argument of the
attention (`cache=None` otherwise), carried through the layers' `nn.Stack` scan.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module, field
from treemod.models._attention_parts import attend
from treemod.models._causal_lm import KVCache
from treemod.models._hf_activations import get_activation
from treemod.models._rope import apply_rope

__all__ = ["LlamaAttention", "LlamaDecoderLayer", "LlamaMLP", "build_layer"]


class LlamaAttention(Module):
    """Multi-head attention with `num_key_value_heads` shared key-value heads and RoPE."""

    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear
    o_proj: nn.Linear
    attention_dropout: nn.Dropout
    num_heads: int = field(static=True)
    num_key_value_heads: int = field(static=True)
    head_dim: int = field(static=True)

    def project(self, x: Array, cos: Array, sin: Array) -> tuple[Array, Array, Array]:
        """Queries, keys and values `(batch, seq, heads, head_dim)`, q and k rotated.

        Arguments:
            x: the normalised hidden states `(batch, seq, hidden)`.
            cos: `Rope`'s cosine table `(batch or 1, seq, head_dim)`.
            sin: `Rope`'s sine table.

        Returns:
            `(q, k, v)`; k and v have `num_key_value_heads` heads.
        """
        batch, seq, _ = x.shape
        q = self.q_proj(x).reshape(batch, seq, self.num_heads, self.head_dim)
        k = self.k_proj(x).reshape(batch, seq, self.num_key_value_heads, self.head_dim)
        v = self.v_proj(x).reshape(batch, seq, self.num_key_value_heads, self.head_dim)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def __call__(
        self,
        x: Array,
        cos: Array,
        sin: Array,
        mask: Array,
        *,
        key: PRNGKeyArray | None = None,
        cache: KVCache | None = None,
    ) -> tuple[Array, KVCache | None]:
        """Attention output `(batch, seq, hidden)` for `x` under the boolean `mask`.

        Arguments:
            x: the normalised hidden states `(batch, seq, hidden)`.
            cos: `Rope`'s cosine table.
            sin: `Rope`'s sine table.
            mask: booleans `(batch or 1, 1, seq, keys)`, True to attend (`keys` is `seq`, or
                the cache's slots).
            key: dropout key (training mode only).
            cache: `generate`'s key-value cache: the new keys and values are written into it
                and the queries attend over all its slots.

        Returns:
            `(output, cache)`: `o_proj` of the attended values, and the cache.
        """
        batch, seq, _ = x.shape
        q, k, v = self.project(x, cos, sin)
        if cache is not None:
            cache, k, v = cache.write(k, v)
        out = attend(
            q, k, v, mask, scale=self.head_dim**-0.5, dropout=self.attention_dropout, key=key
        )
        return self.o_proj(out.reshape(batch, seq, self.num_heads * self.head_dim)), cache


class LlamaMLP(Module):
    """SwiGLU: `down_proj(act(gate_proj(x)) * up_proj(x))`."""

    gate_proj: nn.Linear
    up_proj: nn.Linear
    down_proj: nn.Linear
    act: str = field(static=True)

    def __call__(self, x: Array) -> Array:
        """Apply the MLP to `(..., hidden)`."""
        return self.down_proj(get_activation(self.act)(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(Module):
    """One pre-norm block: `x + self_attn(input_layernorm(x))`, then the MLP likewise.

    Called by `nn.Stack` with the carry `(hidden, layer_index, cache)`. `masks` holds one mask per
    attention kind the model uses (full, sliding window) and `mask_index[layer]` picks this
    layer's, so layers of different kinds share one scanned body.
    """

    self_attn: LlamaAttention
    mlp: LlamaMLP
    input_layernorm: nn.RMSNorm
    post_attention_layernorm: nn.RMSNorm

    def __call__(
        self,
        carry: tuple[Array, Array, KVCache | None],
        cos: Array,
        sin: Array,
        masks: Array,
        mask_index: Array,
        *,
        key: PRNGKeyArray | None = None,
    ) -> tuple[Array, Array, KVCache | None]:
        """`(hidden, layer, cache)` -> `(new hidden, layer + 1, cache)`."""
        x, layer, cache = carry
        mask = masks[0] if masks.shape[0] == 1 else masks[mask_index[layer]]
        h, cache = self.self_attn(self.input_layernorm(x), cos, sin, mask, key=key, cache=cache)
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, layer + 1, cache


def build_layer(values: Mapping[str, Any], dtype: Any, *, key: PRNGKeyArray) -> LlamaDecoderLayer:
    """One decoder layer with `transformers`' initialisation, from resolved config `values`.

    `values` holds `hidden_size`, `intermediate_size`, `num_attention_heads`,
    `num_key_value_heads`, `head_dim`, `qkv_bias`, `o_bias`, `mlp_bias`, `hidden_act`,
    `rms_norm_eps`, `attention_dropout` and `initializer_range`.
    """
    hidden, inner = values["hidden_size"], values["intermediate_size"]
    heads, kv_heads, head_dim = (
        values["num_attention_heads"],
        values["num_key_value_heads"],
        values["head_dim"],
    )
    init, zeros = nn.init.normal(values["initializer_range"]), nn.init.zeros
    keys = iter(jax.random.split(key, 7))

    def linear(n_in: int, n_out: int, bias: bool) -> nn.Linear:
        return nn.Linear(
            n_in, n_out, bias, dtype, weight_init=init, bias_init=zeros, key=next(keys)
        )

    attn = LlamaAttention(
        q_proj=linear(hidden, heads * head_dim, values["qkv_bias"]),
        k_proj=linear(hidden, kv_heads * head_dim, values["qkv_bias"]),
        v_proj=linear(hidden, kv_heads * head_dim, values["qkv_bias"]),
        o_proj=linear(heads * head_dim, hidden, values["o_bias"]),
        # Inference mode, as transformers' from_pretrained gives an eval() model.
        attention_dropout=nn.Dropout(values["attention_dropout"], inference=True),
        num_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
    )
    mlp = LlamaMLP(
        gate_proj=linear(hidden, inner, values["mlp_bias"]),
        up_proj=linear(hidden, inner, values["mlp_bias"]),
        down_proj=linear(inner, hidden, values["mlp_bias"]),
        act=values["hidden_act"],
    )
    eps = values["rms_norm_eps"]
    return LlamaDecoderLayer(
        self_attn=attn,
        mlp=mlp,
        input_layernorm=nn.RMSNorm(hidden, eps, use_bias=False, dtype=dtype),
        post_attention_layernorm=nn.RMSNorm(hidden, eps, use_bias=False, dtype=dtype),
    )
