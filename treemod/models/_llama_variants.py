"""Mistral, Qwen2 and Qwen3: the Llama implementation with only what their configs differ in.

Each variant declares the values its config class reads (`config_values`, with its defaults)
and its rules (`variant_rules`). Mistral has no biases and a sliding window (`sliding_window`,
default 4096, null for none) on every layer; Qwen2 has biases on q, k and v, and sliding windows
on the layers its `layer_types` name (by default, with `use_sliding_window`, the layers from
`max_window_layers` on); Qwen3 is Qwen2 with `attention_bias` on q, k, v and o and an RMSNorm over
each head of the queries and keys (`q_norm`, `k_norm`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from treemod.models._base import config_error, register_architecture
from treemod.models._config_values import Value, check_value
from treemod.models._llama import COMMON_VALUES, LlamaForCausalLM, LlamaModel

__all__ = [
    "MISTRAL_VALUES",
    "QWEN2_VALUES",
    "QWEN3_VALUES",
    "MistralForCausalLM",
    "MistralModel",
    "Qwen2ForCausalLM",
    "Qwen2Model",
    "Qwen3ForCausalLM",
    "Qwen3Model",
    "layer_kinds",
    "sliding_window",
]

MISTRAL_VALUES: dict[str, Value] = {
    **COMMON_VALUES,
    "intermediate_size": Value(14336, "size"),
    "num_key_value_heads": Value(8, "size", nullable=True),
    "max_position_embeddings": Value(4096 * 32, "size"),
    "sliding_window": Value(4096),
}
"""The values `MistralConfig` reads, with its defaults."""

QWEN2_VALUES: dict[str, Value] = {
    **COMMON_VALUES,
    "vocab_size": Value(151936, "size"),
    "intermediate_size": Value(22016, "size"),
    "num_key_value_heads": Value(32, "size", nullable=True),
    "max_position_embeddings": Value(32768, "size"),
    "use_sliding_window": Value(False),
    "sliding_window": Value(4096),
    "max_window_layers": Value(28),
    "layer_types": Value(None),
}
"""The values `Qwen2Config` reads, with its defaults."""

QWEN3_VALUES: dict[str, Value] = {
    **QWEN2_VALUES,
    "head_dim": Value(128, "size", nullable=True),
    "attention_bias": Value(False),
}
"""The values `Qwen3Config` reads, with its defaults."""

_LAYER_TYPES = ("full_attention", "sliding_attention")


def sliding_window(owner: str, window: Any) -> int | None:
    """The config's `sliding_window`, checked: `None`, or a positive int."""
    checked: int | None = window
    if window is not None:
        checked = check_value(owner, "sliding_window", window, "size")
    return checked


def layer_kinds(
    owner: str, types: Any, n: int, window: int | None, hint: str = ""
) -> tuple[int, ...]:
    """The `layer_kinds` of a config's `layer_types` (0 full attention, 1 sliding window).

    Arguments:
        owner: the model class's name, for messages.
        types: the config's `layer_types`, a list of `n` names.
        n: `num_hidden_layers`.
        window: the sliding window (`None` refuses `"sliding_attention"` layers).
        hint: added to the refusal of a missing window.

    Returns:
        One kind per layer.
    """
    if not isinstance(types, list | tuple) or len(types) != n:
        raise config_error(owner, "layer_types", types, f"a list of {n} layer types")
    for i, kind in enumerate(types):
        if kind not in _LAYER_TYPES:
            expected = ", ".join(map(repr, _LAYER_TYPES))
            raise config_error(owner, f"layer_types[{i}]", kind, expected)
        if kind == "sliding_attention" and window is None:
            expected = f"an int window for 'sliding_attention' layers{hint}"
            raise config_error(owner, "sliding_window", window, expected)
    return tuple(_LAYER_TYPES.index(kind) for kind in types)


class MistralModel(LlamaModel):
    """Mistral's decoder (`LlamaModel` with Mistral's config: no biases, a sliding window)."""

    architecture: ClassVar[str] = "MistralModel"
    model_type: ClassVar[str] = "mistral"
    config_values: ClassVar[Mapping[str, Value]] = MISTRAL_VALUES

    @classmethod
    def variant_rules(cls, owner: str, v: dict[str, Any]) -> None:
        """No biases; `sliding_window` (null for none) on every layer."""
        v["qkv_bias"], v["o_bias"], v["mlp_bias"] = False, False, False
        v["sliding_window"] = window = sliding_window(owner, v["sliding_window"])
        v["layer_kinds"] = tuple(int(window is not None) for _ in range(v["num_hidden_layers"]))


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral with its language-modelling head (see `LlamaForCausalLM`)."""

    architecture: ClassVar[str] = "MistralForCausalLM"
    model_type: ClassVar[str] = "mistral"
    body: ClassVar[type[LlamaModel]] = MistralModel


class Qwen2Model(LlamaModel):
    """Qwen2's decoder (q, k, v biases; sliding windows on the layers `layer_types` names)."""

    architecture: ClassVar[str] = "Qwen2Model"
    model_type: ClassVar[str] = "qwen2"
    config_values: ClassVar[Mapping[str, Value]] = QWEN2_VALUES

    @classmethod
    def variant_rules(cls, owner: str, v: dict[str, Any]) -> None:
        """Biases on q, k and v (whatever the config says, as `transformers` builds them);
        sliding windows on the layers `layer_types` names, or else, with `use_sliding_window`,
        on the layers from `max_window_layers` on."""
        v["qkv_bias"], v["o_bias"], v["mlp_bias"] = True, False, False
        window = sliding_window(owner, v["sliding_window"]) if v["use_sliding_window"] else None
        if window is not None:  # unused, the config's value is kept (the field shows it)
            v["sliding_window"] = window
        n, types = v["num_hidden_layers"], v["layer_types"]
        if types is None:
            limit = check_value(owner, "max_window_layers", v["max_window_layers"], "count")
            v["layer_kinds"] = tuple(int(window is not None and i >= limit) for i in range(n))
            return
        hint = " (set use_sliding_window and sliding_window)"
        v["layer_kinds"] = layer_kinds(owner, types, n, window, hint)


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 with its language-modelling head (see `LlamaForCausalLM`)."""

    architecture: ClassVar[str] = "Qwen2ForCausalLM"
    model_type: ClassVar[str] = "qwen2"
    body: ClassVar[type[LlamaModel]] = Qwen2Model


class Qwen3Model(Qwen2Model):
    """Qwen3's decoder: Qwen2's windows, `attention_bias` on q, k, v and o, q and k normed.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.llama_variants import Qwen3Model
        >>> config = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        ...           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        ...           "vocab_size": 100}
        >>> model = Qwen3Model.from_config(config, key=jax.random.key(0))
        >>> model.layers.layers.self_attn.q_norm.weight.shape
        (2, 8)
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3, 32)
    """

    architecture: ClassVar[str] = "Qwen3Model"
    model_type: ClassVar[str] = "qwen3"
    config_values: ClassVar[Mapping[str, Value]] = QWEN3_VALUES

    @classmethod
    def variant_rules(cls, owner: str, v: dict[str, Any]) -> None:
        """Qwen2's sliding windows; `attention_bias` on all four projections; q/k norms."""
        super().variant_rules(owner, v)
        v["qkv_bias"] = v["o_bias"] = bool(v["attention_bias"])
        v["qk_norm"] = True


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 with its language-modelling head (see `LlamaForCausalLM`)."""

    architecture: ClassVar[str] = "Qwen3ForCausalLM"
    model_type: ClassVar[str] = "qwen3"
    body: ClassVar[type[LlamaModel]] = Qwen3Model


for _cls in (
    MistralModel,
    MistralForCausalLM,
    Qwen2Model,
    Qwen2ForCausalLM,
    Qwen3Model,
    Qwen3ForCausalLM,
):
    register_architecture(_cls)
