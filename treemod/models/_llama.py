"""The Llama decoder and causal LM from Hugging Face config dicts; the base of its variants.

Llama has optional attention and MLP biases and full attention on every layer. A variant
(Mistral, Qwen2: `_llama_variants.py`) declares the values its config class reads
(`config_values`) and its rules (`variant_rules`: biases, sliding windows); the rest is this
file's. Attribute paths are `transformers`' parameter names (`model.layers` is an `nn.Stack` of
`LlamaDecoderLayer`s).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import field
from treemod._sharding.axes import axis_names
from treemod.models._attention_parts import causal_mask, projection_keys, token_inputs
from treemod.models._base import (
    PretrainedConfig,
    PretrainedModel,
    config_error,
    register_architecture,
)
from treemod.models._causal_lm import (
    CacheLayout,
    CausalLM,
    KVCache,
    LMParts,
    MaybeCache,
    build_lm_head,
)
from treemod.models._config_values import Value, check_value, defaults, read_config
from treemod.models._hf_activations import hf_activation
from treemod.models._llama_layers import LayerParts, build_layer
from treemod.models._rope import Rope, rope_config

__all__ = [
    "COMMON_VALUES",
    "DEFAULTS",
    "IGNORED_KEYS",
    "LLAMA_VALUES",
    "LlamaForCausalLM",
    "LlamaModel",
]

COMMON_VALUES: dict[str, Value] = {
    "vocab_size": Value(32000, "size"),
    "hidden_size": Value(4096, "size"),
    "num_hidden_layers": Value(32, "size"),
    "num_attention_heads": Value(32, "size"),
    "num_key_value_heads": Value(None, "size", nullable=True),
    "head_dim": Value(None, "size", nullable=True),
    "hidden_act": Value("silu"),
    "initializer_range": Value(0.02),
    "rms_norm_eps": Value(1e-6),
    "tie_word_embeddings": Value(False),
    "attention_dropout": Value(0.0, "dropout"),
}
"""The values the Llama family's config classes read alike (`LlamaConfig`'s defaults)."""

LLAMA_VALUES: dict[str, Value] = {
    **COMMON_VALUES,
    "intermediate_size": Value(11008, "size"),
    "max_position_embeddings": Value(2048, "size"),
    "attention_bias": Value(False),
    "mlp_bias": Value(False),
}
"""The values `LlamaConfig` reads, with its defaults."""

DEFAULTS: dict[str, Any] = defaults(LLAMA_VALUES)
"""`transformers.LlamaConfig`'s defaults for the values the models read."""

IGNORED_KEYS = (r"rotary_emb\.inv_freq",)
"""Regular expressions (searched in names) of the tensors `transformers` skips when loading:
old Llama checkpoints hold each layer's `self_attn.rotary_emb.inv_freq` buffer."""


def _values(cls: type[LlamaModel], owner: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The config read with `cls.config_values`, checked, completed by `cls.variant_rules`."""
    v = read_config(owner, config, cls.config_values, cls.config_aliases)
    heads = v["num_attention_heads"]
    if v["num_key_value_heads"] is None:
        v["num_key_value_heads"] = heads
    kv_heads = v["num_key_value_heads"]
    if heads % kv_heads:
        raise config_error(
            owner, "num_key_value_heads", kv_heads, f"a divisor of num_attention_heads={heads}"
        )
    if v["head_dim"] is None:
        if v["hidden_size"] % heads:
            raise config_error(
                owner, "num_attention_heads", heads, "a divisor of hidden_size (or set head_dim)"
            )
        v["head_dim"] = check_value(owner, "head_dim", v["hidden_size"] // heads, "size")
    if v.get("is_causal", True) is not True:
        raise config_error(owner, "is_causal", v["is_causal"], "true (causal attention)")
    hf_activation(owner, cls.activation_key, v[cls.activation_key])
    v["hidden_act"] = v[cls.activation_key]
    cls.variant_rules(owner, v)
    return v


class LlamaModel(PretrainedModel):
    """The Llama decoder: token embedding, `num_hidden_layers` layers, a final RMSNorm.

    Called with `input_ids` `(batch, seq)` and optionally `attention_mask` (1 for tokens, 0 for
    padding; left padding works), `position_ids` (default `0..seq-1`, as `transformers`'
    forward; with `use_cache: false` in the config and no mask, jumps in explicit positions
    start packed sequences, as in `transformers`), and `key` for attention dropout in training
    mode. Returns `last_hidden_state` `(batch, seq, hidden_size)`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.llama import LlamaModel
        >>> config = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        ...           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}
        >>> model = LlamaModel.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3, 32)
    """

    architecture: ClassVar[str] = "LlamaModel"
    model_type: ClassVar[str] = "llama"
    base_model_prefix: ClassVar[str] = "model"
    keys_to_ignore_on_load_unexpected: ClassVar[tuple[str, ...]] = IGNORED_KEYS
    # The values the config class reads, with its defaults (a variant declares its own).
    config_values: ClassVar[Mapping[str, Value]] = LLAMA_VALUES
    # The config class's `attribute_map` (Mixtral's `num_experts`).
    config_aliases: ClassVar[Mapping[str, str]] = {}
    # The config key naming the MLP's activation (Gemma 2's is `hidden_activation`).
    activation_key: ClassVar[str] = "hidden_act"
    # How the layers' norms, attention and MLP are built (a variant's own parts).
    layer_parts: ClassVar[LayerParts] = LayerParts()

    embed_tokens: nn.Embedding
    layers: nn.Stack
    norm: nn.RMSNorm
    rotary_emb: Rope
    sliding_window: int | None = field(static=True)
    layer_kinds: tuple[int, ...] = field(static=True)
    packed_sequences: bool = field(static=True)
    # The sliding-window layers' own RoPE (Gemma 3's local base frequency); None: one for all.
    rotary_emb_local: Rope | None = None

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | PretrainedConfig,
        *,
        key: PRNGKeyArray,
        dtype: Any = None,
    ) -> Self:
        """Build with random weights (`transformers`' initialisation) from a config dict.

        Arguments:
            config: the `config.json` dict; absent keys take the `transformers` config class's
                defaults (`LlamaConfig`, `MistralConfig`, `Qwen2Config`).
            key: the PRNG key.
            dtype: the parameters' dtype (float32 by default).

        Returns:
            The model.
        """
        config = PretrainedConfig(config)
        return cls._build(config, _values(cls, cls.__name__, config), key, dtype)

    @classmethod
    def variant_rules(cls, owner: str, v: dict[str, Any]) -> None:
        """Set the values the layers read beyond the config's: Llama's rules.

        Sets `qkv_bias`, `o_bias` (`attention_bias`), `mlp_bias`, `sliding_window` (`None`)
        and `layer_kinds` (per layer, 0 for full attention and 1 for the sliding window). A
        variant overrides it with its own.

        Arguments:
            owner: the model class's name, for messages.
            v: the config values, checked; completed in place.
        """
        v["qkv_bias"] = v["o_bias"] = bool(v["attention_bias"])
        v["mlp_bias"] = bool(v["mlp_bias"])
        v["sliding_window"] = None
        v["layer_kinds"] = tuple(0 for _ in range(v["num_hidden_layers"]))

    @classmethod
    def rotary(cls, owner: str, v: Mapping[str, Any]) -> tuple[Rope, Rope | None]:
        """The RoPE tables: all layers', and the sliding-window layers' own (`None`: the same).

        Arguments:
            owner: the model class's name, for messages.
            v: the config values, completed by `variant_rules`.

        Returns:
            `(rope, local_rope)`.
        """
        params = rope_config(owner, v, v["max_position_embeddings"])
        rope = Rope.from_config(owner, params, v["head_dim"], v["max_position_embeddings"])
        return rope, None

    def embed(self, ids: Array) -> Array:
        """The token embeddings the first layer reads (Gemma scales them)."""
        return self.embed_tokens(ids)

    @classmethod
    def _build(
        cls,
        config: PretrainedConfig,
        v: Mapping[str, Any],
        key: PRNGKeyArray,
        dtype: Any,
        owner: str | None = None,
    ) -> Self:
        owner = cls.__name__ if owner is None else owner
        dtype = jnp.float32 if dtype is None else dtype
        rope, local_rope = cls.rotary(owner, v)
        k_embed, k_layers = jax.random.split(key)
        parts = cls.layer_parts
        return cls(
            config=config,
            embed_tokens=nn.Embedding(
                v["vocab_size"],
                v["hidden_size"],
                dtype=dtype,
                weight_init=nn.init.normal(v["initializer_range"]),
                key=k_embed,
            ),
            layers=nn.Stack(
                lambda k: build_layer(v, dtype, key=k, parts=parts),
                v["num_hidden_layers"],
                key=k_layers,
            ),
            norm=parts.norm(v["hidden_size"], v["rms_norm_eps"], dtype),
            rotary_emb=rope,
            rotary_emb_local=local_rope,
            sliding_window=v["sliding_window"],
            layer_kinds=v["layer_kinds"],
            packed_sequences=not v.get("use_cache", True),
        )

    def __call__(
        self,
        *,
        input_ids: Any,
        attention_mask: Any = None,
        position_ids: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """The last hidden state `(batch, seq, hidden_size)`.

        Arguments:
            input_ids: `(batch, seq)` token ids.
            attention_mask: `(batch, seq)`, 1 for tokens and 0 for padding.
            position_ids: `(batch, seq)` or `(1, seq)` positions.
            key: PRNG key for attention dropout (training mode only).

        Returns:
            `last_hidden_state`.
        """
        owner = type(self).__name__
        ids, mask, positions = token_inputs(owner, input_ids, attention_mask, position_ids)
        seq = ids.shape[1]
        pos = positions if positions is not None else jax.lax.iota(jnp.int32, seq)[None]
        # transformers reads packed sequences from explicit positions only without a cache,
        # which its forward makes whenever the config's use_cache is on (the default).
        packed = positions if self.packed_sequences else None
        hidden, _ = self._layers(
            ids, pos, lambda window: causal_mask(seq, mask, packed, window), None, key=key
        )
        return hidden

    def cache_layout(self) -> CacheLayout:
        """`num_hidden_layers` layers of `num_key_value_heads` heads of `head_dim`."""
        attn = self.layers.layers.self_attn
        dtype = self.embed_tokens.weight.dtype
        return CacheLayout(len(self.layers), attn.num_key_value_heads, attn.head_dim, dtype)

    def decode(self, ids: Array, positions: Array, cache: KVCache) -> tuple[Array, KVCache]:
        """The last hidden state over new tokens with `generate`'s cache (see `Decoder`)."""
        return self._layers(ids, positions, lambda window: cache.mask(ids.shape[1], window), cache)

    def _layers(
        self,
        ids: Array,
        positions: Array,
        make_mask: Callable[[int | None], Array],
        cache: MaybeCache,
        *,
        key: PRNGKeyArray | None = None,
    ) -> tuple[Array, MaybeCache]:
        """Embed, run the layers (one mask per attention kind, made by `make_mask(window)`)."""
        hidden = self.embed(ids)
        kinds = sorted(set(self.layer_kinds))
        windows = [None if kind == 0 else self.sliding_window for kind in kinds]
        masks = jnp.stack([make_mask(w) for w in windows])
        if self.rotary_emb_local is None:
            cos, sin = (t[None] for t in self.rotary_emb(positions, hidden.dtype))
        else:
            ropes = [self.rotary_emb if kind == 0 else self.rotary_emb_local for kind in kinds]
            tables = [rope(positions, hidden.dtype) for rope in ropes]
            cos, sin = (jnp.stack(t) for t in zip(*tables, strict=True))
        index = jnp.asarray([kinds.index(kind) for kind in self.layer_kinds], jnp.int32)
        carry = (hidden, jnp.zeros((), jnp.int32), cache)
        hidden, _, cache = self.layers(carry, cos, sin, masks, index, key=key)
        return self.norm(hidden), cache


@axis_names({"lm_head.weight": ("vocab", "embed")})
class LlamaForCausalLM(CausalLM):
    """A Llama-family decoder with its language-modelling head: returns `logits`.

    `lm_head` is a bias-free `nn.Linear`, or, with `tie_word_embeddings`, the token embedding
    itself (one array at `model.embed_tokens.weight`, `lm_head.weight` its alias in
    `tied_weights()`). Inputs as `LlamaModel`'s.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.llama import LlamaForCausalLM
        >>> config = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        ...           "num_attention_heads": 4, "vocab_size": 100, "tie_word_embeddings": True}
        >>> model = LlamaForCausalLM.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3, 100)
        >>> model.tied_weights()
        {'lm_head.weight': 'model.embed_tokens.weight'}
    """

    architecture: ClassVar[str] = "LlamaForCausalLM"
    model_type: ClassVar[str] = "llama"
    base_model_prefix: ClassVar[str] = "model"
    keys_to_ignore_on_load_unexpected: ClassVar[tuple[str, ...]] = IGNORED_KEYS
    token_embedding_name: ClassVar[str] = "model.embed_tokens"
    body: ClassVar[type[LlamaModel]] = LlamaModel

    model: LlamaModel
    lm_head: nn.Linear | None

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | PretrainedConfig,
        *,
        key: PRNGKeyArray,
        dtype: Any = None,
    ) -> Self:
        """Build with random weights from a config dict (see `LlamaModel.from_config`).

        Arguments:
            config: the `config.json` dict.
            key: the PRNG key.
            dtype: the parameters' dtype.

        Returns:
            The model.
        """
        config = PretrainedConfig(config)
        v = _values(cls.body, cls.__name__, config)
        k_body, k_head = jax.random.split(key)
        body = cls.body._build(config, v, k_body, dtype, cls.__name__)
        head = build_lm_head(
            v["hidden_size"],
            v["vocab_size"],
            v["tie_word_embeddings"],
            v["initializer_range"],
            dtype,
            key=k_head,
        )
        return cls(config=config, model=body, lm_head=head, **cls.head_options(v))

    @classmethod
    def head_options(cls, v: Mapping[str, Any]) -> dict[str, Any]:
        """A variant's own fields from the config values (Gemma 2's final soft-capping)."""
        return {}

    def lm_parts(self) -> LMParts:
        """`model`, `model.embed_tokens`, `lm_head`."""
        return LMParts(self.model, self.model.embed_tokens, self.lm_head)

    def __call__(
        self,
        *,
        input_ids: Any,
        attention_mask: Any = None,
        position_ids: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """The logits `(batch, seq, vocab_size)`; arguments as `LlamaModel.__call__`'s.

        Arguments:
            input_ids: `(batch, seq)` token ids.
            attention_mask: `(batch, seq)`, 1 for tokens and 0 for padding.
            position_ids: `(batch, seq)` or `(1, seq)` positions.
            key: PRNG key for attention dropout (training mode only).

        Returns:
            `logits`.
        """
        hidden = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, key=key
        )
        return self.logits(hidden, key=projection_keys(key, 1)[0])


register_architecture(LlamaModel)
register_architecture(LlamaForCausalLM)
