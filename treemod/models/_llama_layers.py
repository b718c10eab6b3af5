"""The Llama family's layers: attention with grouped-query heads and RoPE, SwiGLU MLP, block.

Attribute names are `transformers`' (`self_attn.q_proj`, `mlp.gate_proj`, `input_layernorm`,
...), every projection an `nn.Linear`, so `tm.state_dict` names them as `transformers` does and
PEFT's `target_modules` names select them. `generate`'s key-value cache is an argument of the
attention (`cache=None` otherwise), carried through the layers' `nn.Stack` scan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names
from treemod.models._attention_parts import attend, projection_keys
from treemod.models._causal_lm import KVCache
from treemod.models._hf_activations import get_activation
from treemod.models._rope import apply_rope

__all__ = [
    "LayerParts",
    "LlamaAttention",
    "LlamaDecoderLayer",
    "LlamaMLP",
    "attention_output",
    "build_layer",
    "llama_attention",
    "llama_mlp",
    "rms_norm",
]


# Axis names for `tm.shard`: attention splits by heads, the MLP by its hidden units (Megatron).
@axis_names(
    {
        "q_proj.weight": ("heads", "embed"),
        "k_proj.weight": ("heads", "embed"),
        "v_proj.weight": ("heads", "embed"),
        "q_proj.bias": ("heads",),
        "k_proj.bias": ("heads",),
        "v_proj.bias": ("heads",),
        "o_proj.weight": ("embed", "heads"),
        "o_proj.bias": ("embed",),
    }
)
class LlamaAttention(Module):
    """Multi-head attention with `num_key_value_heads` shared key-value heads and RoPE.

    A variant's options: `q_norm`/`k_norm` normalise each head of the queries and keys before
    the rotation (Qwen3, Gemma 3), `scaling` replaces `head_dim ** -0.5` (Gemma 2's
    `query_pre_attn_scalar`), `softcap` soft-caps the scores (Gemma 2).
    """

    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear
    o_proj: nn.Linear
    attention_dropout: nn.Dropout
    num_heads: int = field(static=True)
    num_key_value_heads: int = field(static=True)
    head_dim: int = field(static=True)
    q_norm: Any = None
    k_norm: Any = None
    scaling: float | None = field(static=True, default=None)
    softcap: float | None = field(static=True, default=None)

    def project(
        self, x: Array, cos: Array, sin: Array, *, keys: list[PRNGKeyArray | None]
    ) -> tuple[Array, Array, Array]:
        """Queries, keys and values `(batch, seq, heads, head_dim)`, q and k rotated.

        Arguments:
            x: the normalised hidden states `(batch, seq, hidden)`.
            cos: `Rope`'s cosine table `(batch or 1, seq, head_dim)`.
            sin: `Rope`'s sine table.
            keys: `projection_keys(key, 3)`, the q, k and v projections' keys.

        Returns:
            `(q, k, v)`; k and v have `num_key_value_heads` heads.
        """
        batch, seq, _ = x.shape
        kq, kk, kv = keys
        q = self.q_proj(x, key=kq).reshape(batch, seq, self.num_heads, self.head_dim)
        k = self.k_proj(x, key=kk).reshape(batch, seq, self.num_key_value_heads, self.head_dim)
        v = self.v_proj(x, key=kv).reshape(batch, seq, self.num_key_value_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
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
        return attention_output(self, x, cos, sin, mask, key=key, cache=cache)


def attention_output(
    attn: Any,
    x: Array,
    cos: Array,
    sin: Array,
    mask: Array,
    *,
    key: PRNGKeyArray | None,
    cache: KVCache | None,
) -> tuple[Array, KVCache | None]:
    """An attention's call from its `project`: the cache written, `attend`, `o_proj`.

    `attn` has `project(x, cos, sin, keys=...)`, `o_proj`, `attention_dropout`, `head_dim`,
    `scaling` and `softcap` (`LlamaAttention`, or a variant's attention with other
    projections). `key` is the attention dropout's; the projections' keys (LoRA dropout) are
    `projection_keys(key, 4)`, the last for `o_proj`.
    """
    batch, seq, _ = x.shape
    *k_project, k_out = projection_keys(key, 4)
    q, k, v = attn.project(x, cos, sin, keys=k_project)
    if cache is not None:
        cache, k, v = cache.write(k, v)
    scale = attn.head_dim**-0.5 if attn.scaling is None else attn.scaling
    out = attend(
        q,
        k,
        v,
        mask,
        scale=scale,
        softcap=attn.softcap,
        dropout=attn.attention_dropout,
        key=key,
    )
    return attn.o_proj(out.reshape(batch, seq, q.shape[2] * q.shape[3]), key=k_out), cache


@axis_names({"down_proj.weight": ("embed", "mlp"), "down_proj.bias": ("embed",)})
class LlamaMLP(Module):
    """SwiGLU: `down_proj(act(gate_proj(x)) * up_proj(x))`."""

    gate_proj: nn.Linear
    up_proj: nn.Linear
    down_proj: nn.Linear
    act: str = field(static=True)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Apply the MLP to `(..., hidden)` (`key`: the projections' keys, for LoRA dropout)."""
        k_gate, k_up, k_down = projection_keys(key, 3)
        gate = get_activation(self.act)(self.gate_proj(x, key=k_gate))
        return self.down_proj(gate * self.up_proj(x, key=k_up), key=k_down)


class LlamaDecoderLayer(Module):
    """One pre-norm block: `x + self_attn(input_layernorm(x))`, then the MLP likewise.

    With `pre_feedforward_layernorm` and `post_feedforward_layernorm` (Gemma 2 and 3) each
    sublayer's output is normalised too: `x + post_attention_layernorm(self_attn(...))`, then
    `x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))`.

    Called by `nn.Stack` with the carry `(hidden, layer_index, cache)`. `masks` holds one mask
    per attention kind the model uses (full, sliding window), `cos` and `sin` one table per kind
    (or one for all), and `mask_index[layer]` picks this layer's, so layers of different kinds
    share one scanned body.
    """

    self_attn: Any  # LlamaAttention, or a variant's attention
    mlp: Any  # LlamaMLP, or a variant's MLP
    input_layernorm: Any
    post_attention_layernorm: Any
    pre_feedforward_layernorm: Any = None
    post_feedforward_layernorm: Any = None

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
        """`(hidden, layer, cache)` -> `(new hidden, layer + 1, cache)`.

        `cos`, `sin`: `(kinds or 1, batch or 1, seq, rotary)`; `masks`: `(kinds or 1, ...)`.
        """
        x, layer, cache = carry
        kind = mask_index[layer]
        mask = masks[0] if masks.shape[0] == 1 else masks[kind]
        if cos.shape[0] > 1:
            cos, sin = cos[kind], sin[kind]
        else:
            cos, sin = cos[0], sin[0]
        h, cache = self.self_attn(self.input_layernorm(x), cos, sin, mask, key=key, cache=cache)
        # The attention takes `key` itself (its dropout's key, as before) and draws its
        # projections' keys from it; the MLP's come from another stream.
        (k_mlp,) = projection_keys(key, 1, stream=1)
        if self.pre_feedforward_layernorm is None:
            x = x + h
            x = x + self.mlp(self.post_attention_layernorm(x), key=k_mlp)
        else:
            x = x + self.post_attention_layernorm(h)
            h = self.mlp(self.pre_feedforward_layernorm(x), key=k_mlp)
            x = x + self.post_feedforward_layernorm(h)
        return x, layer + 1, cache


Linear = Callable[[int, int, bool], nn.Linear]
"""`linear(n_in, n_out, bias)`: a layer's next `nn.Linear`, `transformers`' initialisation."""
Norm = Callable[[int, float, Any], Any]
"""`norm(size, eps, dtype)`: a family's RMSNorm."""


def rms_norm(size: int, eps: float, dtype: Any) -> nn.RMSNorm:
    """Llama's RMSNorm: weight only, initialised to ones."""
    return nn.RMSNorm(size, eps, use_bias=False, dtype=dtype)


def llama_attention(values: Mapping[str, Any], linear: Linear, norm: Norm, dtype: Any) -> Any:
    """Llama's attention from resolved config `values` (`qk_norm`, `scaling`, `softcap` the
    options a variant sets)."""
    hidden, heads, kv_heads, head_dim = (
        values["hidden_size"],
        values["num_attention_heads"],
        values["num_key_value_heads"],
        values["head_dim"],
    )
    qk_norm = values.get("qk_norm", False)
    return LlamaAttention(
        q_proj=linear(hidden, heads * head_dim, values["qkv_bias"]),
        k_proj=linear(hidden, kv_heads * head_dim, values["qkv_bias"]),
        v_proj=linear(hidden, kv_heads * head_dim, values["qkv_bias"]),
        o_proj=linear(heads * head_dim, hidden, values["o_bias"]),
        # Inference mode, as transformers' from_pretrained gives an eval() model.
        attention_dropout=nn.Dropout(values["attention_dropout"], inference=True),
        num_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        q_norm=norm(head_dim, values["rms_norm_eps"], dtype) if qk_norm else None,
        k_norm=norm(head_dim, values["rms_norm_eps"], dtype) if qk_norm else None,
        scaling=values.get("scaling"),
        softcap=values.get("softcap"),
    )


def llama_mlp(
    values: Mapping[str, Any], linear: Linear, dtype: Any, next_key: Callable[[], PRNGKeyArray]
) -> Any:
    """Llama's SwiGLU MLP from resolved config `values` (`next_key` for parameters that are no
    `nn.Linear`: unused)."""
    hidden, inner = values["hidden_size"], values["intermediate_size"]
    return LlamaMLP(
        gate_proj=linear(hidden, inner, values["mlp_bias"]),
        up_proj=linear(hidden, inner, values["mlp_bias"]),
        down_proj=linear(inner, hidden, values["mlp_bias"]),
        act=values["hidden_act"],
    )


class LayerParts(NamedTuple):
    """How a family builds a layer's parts (Llama's by default)."""

    norm: Norm = rms_norm
    attention: Callable[[Mapping[str, Any], Linear, Norm, Any], Any] = llama_attention
    mlp: Callable[[Mapping[str, Any], Linear, Any, Callable[[], PRNGKeyArray]], Any] = llama_mlp


def build_layer(
    values: Mapping[str, Any],
    dtype: Any,
    *,
    key: PRNGKeyArray,
    parts: LayerParts = LayerParts(),
) -> LlamaDecoderLayer:
    """One decoder layer with `transformers`' initialisation, from resolved config `values`.

    `values` holds `hidden_size`, `intermediate_size`, `num_attention_heads`,
    `num_key_value_heads`, `head_dim`, `qkv_bias`, `o_bias`, `mlp_bias`, `hidden_act`,
    `rms_norm_eps`, `attention_dropout` and `initializer_range`, and optionally `qk_norm`,
    `scaling`, `softcap` (of the scores) and `sandwich_norms` (Gemma 2's four norms). `parts`
    builds the norms, attention and MLP.
    """
    hidden = values["hidden_size"]
    init, zeros = nn.init.normal(values["initializer_range"]), nn.init.zeros
    keys = iter(jax.random.split(key, 7))

    def linear(n_in: int, n_out: int, bias: bool) -> nn.Linear:
        return nn.Linear(
            n_in, n_out, bias, dtype, weight_init=init, bias_init=zeros, key=next(keys)
        )

    eps = values["rms_norm_eps"]
    attn = parts.attention(values, linear, parts.norm, dtype)
    mlp = parts.mlp(values, linear, dtype, lambda: next(keys))
    sandwich = values.get("sandwich_norms", False)
    return LlamaDecoderLayer(
        self_attn=attn,
        mlp=mlp,
        input_layernorm=parts.norm(hidden, eps, dtype),
        post_attention_layernorm=parts.norm(hidden, eps, dtype),
        pre_feedforward_layernorm=parts.norm(hidden, eps, dtype) if sandwich else None,
        post_feedforward_layernorm=parts.norm(hidden, eps, dtype) if sandwich else None,
    )
