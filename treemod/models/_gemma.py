"""Gemma, Gemma 2 and Gemma 3 (text): the Llama implementation with only what they differ in.

Gemma: RMSNorms scale by `1 + weight` (weights start at zero, the product taken in float32
before the cast back), the token embeddings are multiplied by `sqrt(hidden_size)` rounded to the
model's dtype, `hidden_act` "gelu" means tanh-approximated GELU, biases follow `attention_bias`
on all four projections and the head is tied by default. Gemma 2 adds a norm after each
sublayer and one before the MLP, scores scaled by `query_pre_attn_scalar ** -0.5` and
soft-capped (`attn_logit_softcapping`), final logits soft-capped (`final_logit_softcapping`),
sliding windows on every other layer (`layer_types`), and reads its activation from
`hidden_activation`. Gemma 3 (text) adds an RMSNorm over each query and key head and its own
RoPE for the sliding layers (`rope_local_base_freq`, or `rope_parameters.sliding_attention`),
sliding windows on five layers of six (`sliding_window_pattern`), final soft-capping off by
default and no soft-capping of the scores (its attention ignores `attn_logit_softcapping`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np
from jax import Array, lax
from jaxtyping import PRNGKeyArray

from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names
from treemod.models._base import config_error, register_architecture
from treemod.models._config_values import Value
from treemod.models._llama import COMMON_VALUES, LlamaForCausalLM, LlamaModel
from treemod.models._llama_layers import LayerParts
from treemod.models._llama_variants import layer_kinds, sliding_window
from treemod.models._rope import Rope, rope_config

__all__ = [
    "GEMMA2_VALUES",
    "GEMMA3_VALUES",
    "GEMMA_VALUES",
    "Gemma2ForCausalLM",
    "Gemma2Model",
    "Gemma3ForCausalLM",
    "Gemma3TextModel",
    "GemmaForCausalLM",
    "GemmaModel",
    "GemmaRMSNorm",
]


@axis_names({"weight": ("norm",)})
class GemmaRMSNorm(Module):
    """Gemma's RMSNorm: `x / rms(x) * (1 + weight)` in float32, cast back to `x`'s dtype.

    Arguments:
        weight: `(size,)`, zero at initialisation (the identity scale).
        eps: added to the mean square.
    """

    weight: Array
    eps: float = field(static=True)

    def __call__(self, x: Array) -> Array:
        """Normalise `(..., size)` over its last axis."""
        h = x.astype(jnp.float32)
        h = h * lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + self.eps)
        scale = 1.0 + self.weight.astype(jnp.float32).reshape((1,) * (h.ndim - 1) + (-1,))
        return (h * scale).astype(x.dtype)


def gemma_norm(size: int, eps: float, dtype: Any) -> GemmaRMSNorm:
    """A `GemmaRMSNorm` of `size` with zero weights."""
    return GemmaRMSNorm(jnp.zeros((size,), dtype), eps)


_GEMMA_COMMON = {
    **COMMON_VALUES,
    "num_key_value_heads": Value(16, "size"),
    "head_dim": Value(256, "size", nullable=True),
    "tie_word_embeddings": Value(True),
    "attention_bias": Value(False),
    "use_bidirectional_attention": Value(None),
}

GEMMA_VALUES: dict[str, Value] = {
    **_GEMMA_COMMON,
    "vocab_size": Value(256000, "size"),
    "hidden_size": Value(3072, "size"),
    "intermediate_size": Value(24576, "size"),
    "num_hidden_layers": Value(28, "size"),
    "num_attention_heads": Value(16, "size"),
    "hidden_act": Value("gelu_pytorch_tanh"),
    "max_position_embeddings": Value(8192, "size"),
}
"""The values `GemmaConfig` reads, with its defaults."""

_GEMMA2_COMMON = {
    **{k: v for k, v in _GEMMA_COMMON.items() if k != "hidden_act"},
    "num_attention_heads": Value(8, "size"),
    "num_key_value_heads": Value(4, "size"),
    "hidden_size": Value(2304, "size"),
    "intermediate_size": Value(9216, "size"),
    "num_hidden_layers": Value(26, "size"),
    "hidden_activation": Value("gelu_pytorch_tanh"),
    "query_pre_attn_scalar": Value(256, "positive"),
    "sliding_window": Value(4096, "size", nullable=True),
    "layer_types": Value(None),
}

GEMMA2_VALUES: dict[str, Value] = {
    **_GEMMA2_COMMON,
    "vocab_size": Value(256000, "size"),
    "max_position_embeddings": Value(8192, "size"),
    "final_logit_softcapping": Value(30.0, "positive", nullable=True),
    "attn_logit_softcapping": Value(50.0, "positive", nullable=True),
}
"""The values `Gemma2Config` reads, with its defaults."""

GEMMA3_VALUES: dict[str, Value] = {
    **_GEMMA2_COMMON,
    "vocab_size": Value(262208, "size"),
    "max_position_embeddings": Value(131072, "size"),
    "final_logit_softcapping": Value(None, "positive", nullable=True),
    "attn_logit_softcapping": Value(None, "positive", nullable=True),
    "use_bidirectional_attention": Value(False),
    "sliding_window_pattern": Value(6, "size"),
    "rope_local_base_freq": Value(10000.0, "positive"),
}
"""The values `Gemma3TextConfig` reads, with its defaults (RoPE: `rope_parameters` per layer
type, or the older `rope_scaling`, `rope_theta` (default 1e6) and `rope_local_base_freq`)."""


class GemmaModel(LlamaModel):
    """Gemma's decoder: `LlamaModel` with `(1 + weight)` norms and scaled embeddings.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.gemma import GemmaModel
        >>> config = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        ...           "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 8,
        ...           "vocab_size": 100}
        >>> GemmaModel.from_config(config, key=jax.random.key(0))(
        ...     input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3, 32)
    """

    architecture: ClassVar[str] = "GemmaModel"
    model_type: ClassVar[str] = "gemma"
    config_values: ClassVar[Mapping[str, Value]] = GEMMA_VALUES
    layer_parts: ClassVar[LayerParts] = LayerParts(norm=gemma_norm)

    @classmethod
    def variant_rules(cls, owner: str, v: dict[str, Any]) -> None:
        """`attention_bias` on q, k, v and o; no MLP bias; causal attention only; "gelu" is
        the tanh approximation, as `GemmaConfig` rewrites it."""
        if v["use_bidirectional_attention"]:
            raise config_error(
                owner,
                "use_bidirectional_attention",
                v["use_bidirectional_attention"],
                "false or null (causal attention)",
            )
        v["qkv_bias"] = v["o_bias"] = bool(v["attention_bias"])
        v["mlp_bias"] = False
        if v["hidden_act"] == "gelu":
            v["hidden_act"] = "gelu_pytorch_tanh"
        v["sliding_window"] = None
        v["layer_kinds"] = tuple(0 for _ in range(v["num_hidden_layers"]))

    def embed(self, ids: Array) -> Array:
        """The token embeddings times `sqrt(hidden_size)` (a float32 number cast to the
        embeddings' dtype, as `transformers` rounds it)."""
        hidden = self.embed_tokens(ids)
        scale = np.float32(hidden.shape[-1] ** 0.5)
        return hidden * jnp.asarray(scale).astype(hidden.dtype)


class GemmaForCausalLM(LlamaForCausalLM):
    """Gemma with its language-modelling head, tied by default (see `LlamaForCausalLM`)."""

    architecture: ClassVar[str] = "GemmaForCausalLM"
    model_type: ClassVar[str] = "gemma"
    body: ClassVar[type[LlamaModel]] = GemmaModel


class Gemma2Model(GemmaModel):
    """Gemma 2's decoder: Gemma's with a norm after each sublayer and before the MLP, scores
    scaled by `query_pre_attn_scalar ** -0.5` and soft-capped, alternating sliding windows."""

    architecture: ClassVar[str] = "Gemma2Model"
    model_type: ClassVar[str] = "gemma2"
    config_values: ClassVar[Mapping[str, Value]] = GEMMA2_VALUES
    activation_key: ClassVar[str] = "hidden_activation"
    # Whether the config's sliding_window_pattern sets the default layer types.
    reads_pattern: ClassVar[bool] = False

    @classmethod
    def variant_rules(cls, owner: str, v: dict[str, Any]) -> None:
        """Gemma's rules, the four norms, the scores' scale and cap, and the layer types
        (by default a sliding window unless `(i + 1) % pattern == 0`)."""
        window = sliding_window(owner, v["sliding_window"])
        super().variant_rules(owner, v)
        v["sandwich_norms"] = True
        v["scaling"] = float(v["query_pre_attn_scalar"]) ** -0.5
        v["softcap"] = v["attn_logit_softcapping"]
        n, types = v["num_hidden_layers"], v["layer_types"]
        # Gemma 3's config reads the pattern (default 6); Gemma 2's is every other layer.
        pattern = v.get("sliding_window_pattern", 2) if cls.reads_pattern else 2
        if types is None:
            types = [
                "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)
            ]
        v["sliding_window"] = window
        v["layer_kinds"] = layer_kinds(owner, types, n, window)


class Gemma2ForCausalLM(GemmaForCausalLM):
    """Gemma 2 with its head; the logits soft-capped by `final_logit_softcapping` (if set)."""

    architecture: ClassVar[str] = "Gemma2ForCausalLM"
    model_type: ClassVar[str] = "gemma2"
    body: ClassVar[type[LlamaModel]] = Gemma2Model

    final_logit_softcapping: float | None = field(static=True, default=None)

    @classmethod
    def head_options(cls, v: Mapping[str, Any]) -> dict[str, Any]:
        """`final_logit_softcapping` from the config."""
        return {"final_logit_softcapping": v["final_logit_softcapping"]}

    def logits(self, hidden: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The head's logits, soft-capped: `cap * tanh(logits / cap)`."""
        logits = super().logits(hidden, key=key)
        cap = self.final_logit_softcapping
        if cap is None:
            return logits
        return jnp.tanh(logits / cap) * cap


class Gemma3TextModel(Gemma2Model):
    """Gemma 3's text decoder: Gemma 2's with q/k norms, its own RoPE on sliding layers."""

    architecture: ClassVar[str] = "Gemma3TextModel"
    model_type: ClassVar[str] = "gemma3_text"
    config_values: ClassVar[Mapping[str, Value]] = GEMMA3_VALUES
    reads_pattern: ClassVar[bool] = True

    @classmethod
    def variant_rules(cls, owner: str, v: dict[str, Any]) -> None:
        """Gemma 2's rules and an RMSNorm over each query and key head; the config's
        `attn_logit_softcapping` is read but unused, as in `transformers`' Gemma 3 attention."""
        super().variant_rules(owner, v)
        v["qk_norm"] = True
        v["softcap"] = None

    @classmethod
    def rotary(cls, owner: str, v: Mapping[str, Any]) -> tuple[Rope, Rope | None]:
        """Full-attention layers' RoPE (`rope_theta` 1e6, `rope_scaling`), sliding layers' own
        (`rope_local_base_freq`), as `Gemma3TextConfig` nests them in `rope_parameters`."""
        given = v.get("rope_parameters")
        if given is None:
            given = {"full_attention": None, "sliding_attention": None}
        if not isinstance(given, Mapping) or set(given) - {"full_attention", "sliding_attention"}:
            expected = "a dict of 'full_attention' and 'sliding_attention' RoPE dicts"
            raise config_error(owner, "rope_parameters", given, expected)
        full = dict(given.get("full_attention") or {"rope_type": "default"})
        local = dict(given.get("sliding_attention") or {"rope_type": "default"})
        full.update(v.get("rope_scaling") or {})
        full.setdefault("rope_theta", v.get("rope_theta", 1_000_000.0))
        local.setdefault("rope_theta", v["rope_local_base_freq"])
        ropes = []
        for params in (full, local):
            limit = v["max_position_embeddings"]
            standard = rope_config(owner, {"rope_parameters": params}, limit)
            ropes.append(Rope.from_config(owner, standard, v["head_dim"], limit))
        return ropes[0], ropes[1]


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """Gemma 3 (text) with its head (see `Gemma2ForCausalLM`); `model_type` "gemma3_text"."""

    architecture: ClassVar[str] = "Gemma3ForCausalLM"
    model_type: ClassVar[str] = "gemma3_text"
    body: ClassVar[type[LlamaModel]] = Gemma3TextModel


for _cls in (
    GemmaModel,
    GemmaForCausalLM,
    Gemma2Model,
    Gemma2ForCausalLM,
    Gemma3TextModel,
    Gemma3ForCausalLM,
):
    register_architecture(_cls)
