"""Phi-3: the Llama implementation with fused projections and a partial, long-context RoPE.

Phi-3's checkpoints hold q, k and v in one `qkv_proj` (queries, then keys, then values along
the output) and the MLP's gate and up projections in one `gate_up_proj` (gate first); treemod
keeps them fused, so the tensors and PEFT's `target_modules` names are the checkpoint's. RoPE
turns the first `partial_rotary_factor` of each head, with `"default"` or `"longrope"` scaling
(from the config's `original_max_position_embeddings`). A sliding window, if set, is on every layer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names
from treemod.models._attention_parts import projection_keys
from treemod.models._axis_layouts import attention_in, attention_out, mlp_out
from treemod.models._base import config_error, register_architecture
from treemod.models._causal_lm import KVCache
from treemod.models._config_values import Value
from treemod.models._hf_activations import get_activation
from treemod.models._llama import COMMON_VALUES, LlamaForCausalLM, LlamaModel
from treemod.models._llama_layers import LayerParts, Linear, Norm, attention_output
from treemod.models._llama_variants import sliding_window
from treemod.models._rope import Rope, apply_rope, rope_config

__all__ = ["PHI3_VALUES", "Phi3Attention", "Phi3ForCausalLM", "Phi3MLP", "Phi3Model"]

PHI3_VALUES: dict[str, Value] = {
    **COMMON_VALUES,
    "vocab_size": Value(32064, "size"),
    "hidden_size": Value(3072, "size"),
    "intermediate_size": Value(8192, "size"),
    "rms_norm_eps": Value(1e-5),
    "max_position_embeddings": Value(4096, "size"),
    "original_max_position_embeddings": Value(4096, "size"),
    "resid_pdrop": Value(0.0, "dropout"),
    "embd_pdrop": Value(0.0, "dropout"),
    "sliding_window": Value(None, "size", nullable=True),
}
"""The values `Phi3Config` reads, with its defaults."""

# Phi3Config renames "su" and "yarn" to "longrope" only after its validation, which then
# misses their original_max_position_embeddings: transformers 5 cannot build those configs.
_ROPE_TYPES = ("default", "longrope")


@axis_names({**attention_in("qkv_proj"), **attention_out("o_proj")})
class Phi3Attention(Module):
    """Phi-3's attention: `LlamaAttention`'s with q, k and v from one fused `qkv_proj`."""

    qkv_proj: nn.Linear
    o_proj: nn.Linear
    attention_dropout: nn.Dropout
    num_heads: int = field(static=True)
    num_key_value_heads: int = field(static=True)
    head_dim: int = field(static=True)
    scaling: float | None = field(static=True, default=None)
    softcap: float | None = field(static=True, default=None)

    def project(
        self, x: Array, cos: Array, sin: Array, *, keys: list[PRNGKeyArray | None]
    ) -> tuple[Array, Array, Array]:
        """Queries, keys, values `(batch, seq, heads, head_dim)` split from `qkv_proj(x)`
        (`keys`: three projection keys, the first `qkv_proj`'s)."""
        batch, seq, _ = x.shape
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_key_value_heads * self.head_dim
        qkv = self.qkv_proj(x, key=keys[0])
        q = qkv[..., :q_size].reshape(batch, seq, self.num_heads, self.head_dim)
        k = qkv[..., q_size : q_size + kv_size]
        v = qkv[..., q_size + kv_size :]
        k = k.reshape(batch, seq, self.num_key_value_heads, self.head_dim)
        v = v.reshape(batch, seq, self.num_key_value_heads, self.head_dim)
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
        """As `LlamaAttention.__call__`."""
        return attention_output(self, x, cos, sin, mask, key=key, cache=cache)


@axis_names(mlp_out("down_proj"))
class Phi3MLP(Module):
    """`down_proj(up * act(gate))`, gate and up the halves of one `gate_up_proj`."""

    gate_up_proj: nn.Linear
    down_proj: nn.Linear
    act: str = field(static=True)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Apply the MLP to `(..., hidden)` (`key`: the projections' keys, for LoRA dropout)."""
        k_gate_up, k_down = projection_keys(key, 2)
        gate_up = self.gate_up_proj(x, key=k_gate_up)
        half = gate_up.shape[-1] // 2
        h = gate_up[..., half:] * get_activation(self.act)(gate_up[..., :half])
        return self.down_proj(h, key=k_down)


def _attention(values: Mapping[str, Any], linear: Linear, norm: Norm, dtype: Any) -> Any:
    hidden, heads, kv_heads, head_dim = (
        values["hidden_size"],
        values["num_attention_heads"],
        values["num_key_value_heads"],
        values["head_dim"],
    )
    return Phi3Attention(
        qkv_proj=linear(hidden, (heads + 2 * kv_heads) * head_dim, False),
        o_proj=linear(heads * head_dim, hidden, False),
        attention_dropout=nn.Dropout(values["attention_dropout"], inference=True),
        num_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
    )


def _mlp(
    values: Mapping[str, Any], linear: Linear, dtype: Any, next_key: Callable[[], PRNGKeyArray]
) -> Any:
    hidden, inner = values["hidden_size"], values["intermediate_size"]
    return Phi3MLP(
        gate_up_proj=linear(hidden, 2 * inner, False),
        down_proj=linear(inner, hidden, False),
        act=values["hidden_act"],
    )


class Phi3Model(LlamaModel):
    """Phi-3's decoder: fused projections, partial long-context RoPE, no biases.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.phi3 import Phi3Model
        >>> config = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        ...           "num_attention_heads": 4, "vocab_size": 100, "partial_rotary_factor": 0.5}
        >>> model = Phi3Model.from_config(config, key=jax.random.key(0))
        >>> model.layers.layers.self_attn.qkv_proj.weight.shape
        (2, 96, 32)
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3, 32)
    """

    architecture: ClassVar[str] = "Phi3Model"
    model_type: ClassVar[str] = "phi3"
    config_values: ClassVar[Mapping[str, Value]] = PHI3_VALUES
    layer_parts: ClassVar[LayerParts] = LayerParts(attention=_attention, mlp=_mlp)

    @classmethod
    def variant_rules(cls, owner: str, v: dict[str, Any]) -> None:
        """No biases; `sliding_window` (null for none) on every layer; the residual and
        embedding dropouts refused unless zero (they act in training only)."""
        for name in ("resid_pdrop", "embd_pdrop"):
            if v[name]:
                raise config_error(owner, name, v[name], "0.0 (no residual or embedding dropout)")
        v["qkv_bias"], v["o_bias"], v["mlp_bias"] = False, False, False
        v["sliding_window"] = window = sliding_window(owner, v["sliding_window"])
        v["layer_kinds"] = tuple(int(window is not None) for _ in range(v["num_hidden_layers"]))

    @classmethod
    def rotary(cls, owner: str, v: Mapping[str, Any]) -> tuple[Rope, Rope | None]:
        """The partial RoPE, `"default"` or `"longrope"` from the config's
        `original_max_position_embeddings`."""
        given = v.get("rope_scaling") or v.get("rope_parameters") or {}
        where = "rope_scaling" if v.get("rope_scaling") else "rope_parameters"
        if not isinstance(given, Mapping):
            raise config_error(owner, where, given, "a dict of RoPE parameters, or null")
        kind = given.get("rope_type", given.get("type", "default"))
        if kind not in _ROPE_TYPES:
            raise config_error(owner, f"{where}.rope_type", kind, ", ".join(map(repr, _ROPE_TYPES)))
        params = {k: val for k, val in given.items() if k != "type"}
        params["rope_type"] = kind
        if params["rope_type"] == "longrope":
            params["original_max_position_embeddings"] = v["original_max_position_embeddings"]
        limit = v["max_position_embeddings"]
        standard = rope_config(owner, {**v, "rope_scaling": None, "rope_parameters": params}, limit)
        return Rope.from_config(owner, standard, v["head_dim"], limit, partial_rotary=True), None


class Phi3ForCausalLM(LlamaForCausalLM):
    """Phi-3 with its language-modelling head (see `LlamaForCausalLM`).

    With `"longrope"`, `generate` stops at `original_max_position_embeddings`: past it
    `transformers` recomputes the whole sequence with the long factors, which a key-value
    cache of the short ones cannot give.
    """

    architecture: ClassVar[str] = "Phi3ForCausalLM"
    model_type: ClassVar[str] = "phi3"
    body: ClassVar[type[LlamaModel]] = Phi3Model

    def max_positions(self) -> tuple[str, int] | None:
        """`("original_max_position_embeddings", n)` with `"longrope"`, else `None`."""
        rope = self.model.rotary_emb
        if rope.rope_type != "longrope":
            return None
        return "original_max_position_embeddings", rope.threshold


register_architecture(Phi3Model)
register_architecture(Phi3ForCausalLM)
