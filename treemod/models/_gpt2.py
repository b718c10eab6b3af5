"""GPT-2 (`GPT2Model`, `GPT2LMHeadModel`) from a Hugging Face `GPT2Config` dict.

Attribute paths are `transformers`' parameter names: `transformer.h` is an `nn.Stack` of
`GPT2Block`s, so `tm.state_dict` names `transformer.h.0.attn.c_attn.weight`. GPT-2's
projections are `Conv1D`s storing `(in, out)` weights as `transformers` does (PEFT's LoRA reads
them with `fan_in_fan_out=True`). The layer index travels in the `Stack`'s carry, for the
per-layer attention scale of `scale_attn_by_inverse_layer_idx`, with the key-value cache of
`generate` (`None` otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp
from jax import Array, lax
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names
from treemod.models._causal_lm import (
    CacheLayout,
    CausalLM,
    KVCache,
    LMParts,
    MaybeCache,
    build_lm_head,
)
from treemod.models._config_values import Value, defaults, read_config
from treemod.models._hf_activations import get_activation, hf_activation
from treemod.nn._linear import FanInFanOutLinear

from ._attention_parts import attend, causal_mask, projection_keys, split_key, token_inputs
from ._base import PretrainedConfig, PretrainedModel, config_error, register_architecture

__all__ = [
    "GPT2_DEFAULTS",
    "GPT2_VALUES",
    "IGNORED_KEYS",
    "Conv1D",
    "GPT2Attention",
    "GPT2Block",
    "GPT2LMHeadModel",
    "GPT2MLP",
    "GPT2Model",
]

GPT2_VALUES: dict[str, Value] = {
    "vocab_size": Value(50257, "size"),
    "n_positions": Value(1024, "size"),
    "n_embd": Value(768, "size"),
    "n_layer": Value(12, "size"),
    "n_head": Value(12, "size"),
    "n_inner": Value(None, "size", nullable=True),
    "activation_function": Value("gelu_new"),
    "resid_pdrop": Value(0.1, "dropout"),
    "embd_pdrop": Value(0.1, "dropout"),
    "attn_pdrop": Value(0.1, "dropout"),
    "layer_norm_epsilon": Value(1e-5),
    "initializer_range": Value(0.02),
    "scale_attn_weights": Value(True),
    "scale_attn_by_inverse_layer_idx": Value(False),
    "reorder_and_upcast_attn": Value(False),
    "add_cross_attention": Value(False),
    "tie_word_embeddings": Value(True),
}
"""The values the models read, with `transformers.GPT2Config`'s defaults."""

GPT2_DEFAULTS = defaults(GPT2_VALUES)
"""`transformers.GPT2Config`'s defaults for the values the models read."""

IGNORED_KEYS = ("attn.bias", "crossattention.bias")
"""Regular expressions (searched in names) of the tensors `transformers` skips when loading a
GPT-2 checkpoint: old files hold the causal-mask buffer `h.N.attn.bias` (and `masked_bias`)."""

_ALIASES = {
    "hidden_size": "n_embd",
    "max_position_embeddings": "n_positions",
    "num_attention_heads": "n_head",
    "num_hidden_layers": "n_layer",
}


# Axis names for `tm.shard`: Conv1D stores (in, out); attention splits by heads (Megatron).
@axis_names({"weight": ("embed", "mlp"), "bias": ("mlp",)})
class Conv1D(Module, FanInFanOutLinear):
    """`transformers`' `Conv1D`: a linear map storing its weight as `(in_features, out_features)`.

    Arguments:
        weight: `(in, out)`.
        bias: `(out,)`.
    """

    weight: Array
    bias: Array

    @classmethod
    def build(cls, n_in: int, n_out: int, std: float, dtype: Any, *, key: PRNGKeyArray) -> Self:
        """`transformers`' initialisation: weight from N(0, std²), bias zeros."""
        weight = (jax.random.normal(key, (n_in, n_out), jnp.float32) * std).astype(dtype)
        return cls(weight=weight, bias=jnp.zeros((n_out,), dtype))

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`x @ weight + bias` for `x` of shape `(..., in)` (`key` ignored, as `nn.Linear`'s)."""
        y = lax.dot_general(x, self.weight, (((x.ndim - 1,), (0,)), ((), ())))
        return y + self.bias.reshape((1,) * (y.ndim - 1) + self.bias.shape)


@axis_names(
    {
        "c_attn.weight": ("embed", "heads"),
        "c_attn.bias": ("heads",),
        "c_proj.weight": ("heads", "embed"),
        "c_proj.bias": ("embed",),
    }
)
class GPT2Attention(Module):
    """Causal self-attention: `c_attn` makes q, k and v, `attend` mixes, `c_proj` projects."""

    c_attn: Conv1D
    c_proj: Conv1D
    attn_dropout: nn.Dropout
    resid_dropout: nn.Dropout
    num_heads: int = field(static=True)
    scales: tuple[float, ...] = field(static=True)
    upcast: bool = field(static=True)

    def __call__(
        self,
        x: Array,
        mask: Array,
        layer: Array,
        *,
        key: PRNGKeyArray | None = None,
        cache: KVCache | None = None,
    ) -> tuple[Array, KVCache | None]:
        """Attend over `x` `(batch, seq, embed)` with the boolean `mask`; `layer` is the index.

        With a `cache`, the new keys and values are written into it and the queries attend
        over all its slots (`mask` then covers them); returns `(output, cache)`.
        """
        batch, seq, embed = x.shape
        head_dim = embed // self.num_heads
        k_qkv, k_out = projection_keys(key, 2)
        q, k, v = jnp.split(self.c_attn(x, key=k_qkv), 3, axis=-1)
        q, k, v = (t.reshape(batch, seq, self.num_heads, head_dim) for t in (q, k, v))
        if cache is not None:
            cache, k, v = cache.write(k, v)
        scale: float | Array = self.scales[0]
        if len(self.scales) > 1:
            scale = jnp.asarray(self.scales, jnp.float32)[layer]
        k_attn, k_resid = split_key(key, 2)
        out = attend(
            q,
            k,
            v,
            mask,
            scale=scale,
            dropout=self.attn_dropout,
            key=k_attn,
            scores="float32_inputs" if self.upcast else "float32",
        )
        out = self.c_proj(out.reshape(batch, seq, embed), key=k_out)
        return self.resid_dropout(out, key=k_resid), cache


@axis_names({"c_proj.weight": ("mlp", "embed"), "c_proj.bias": ("embed",)})
class GPT2MLP(Module):
    """`c_proj(act(c_fc(x)))`, then dropout."""

    c_fc: Conv1D
    c_proj: Conv1D
    dropout: nn.Dropout
    act: str = field(static=True)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Apply the MLP to `(..., embed)`."""
        k_fc, k_proj = projection_keys(key, 2)
        h = get_activation(self.act)(self.c_fc(x, key=k_fc))
        return self.dropout(self.c_proj(h, key=k_proj), key=key)


class GPT2Block(Module):
    """One pre-norm block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.

    Called by `nn.Stack` with the carry `(hidden, layer_index, cache)`; returns the next carry.
    """

    ln_1: nn.LayerNorm
    attn: GPT2Attention
    ln_2: nn.LayerNorm
    mlp: GPT2MLP

    def __call__(
        self,
        carry: tuple[Array, Array, KVCache | None],
        mask: Array,
        *,
        key: PRNGKeyArray | None = None,
    ) -> tuple[Array, Array, KVCache | None]:
        """`(hidden, layer, cache)` -> `(new hidden, layer + 1, cache)`."""
        x, layer, cache = carry
        k_attn, k_mlp = split_key(key, 2)
        h, cache = self.attn(self.ln_1(x), mask, layer, key=k_attn, cache=cache)
        x = x + h
        x = x + self.mlp(self.ln_2(x), key=k_mlp)
        return x, layer + 1, cache


def _gpt2_values(owner: str, config: Mapping[str, Any]) -> dict[str, Any]:
    values = read_config(owner, config, GPT2_VALUES, _ALIASES)
    if values["n_embd"] % values["n_head"]:
        raise config_error(
            owner, "n_head", values["n_head"], f"a divisor of n_embd={values['n_embd']}"
        )
    if values["add_cross_attention"]:
        raise config_error(owner, "add_cross_attention", True, "false (decoder-only GPT-2)")
    if values.get("is_causal", True) is not True:
        raise config_error(owner, "is_causal", values["is_causal"], "true (causal attention)")
    hf_activation(owner, "activation_function", values["activation_function"])
    return values


def _dropout(p: float) -> nn.Dropout:
    # Built in inference mode, as transformers' from_pretrained gives an eval() model; switch
    # with tm.nn.inference_mode(model, False) to train with dropout.
    return nn.Dropout(p, inference=True)


def _block(values: Mapping[str, Any], dtype: Any, *, key: PRNGKeyArray) -> GPT2Block:
    e, n = values["n_embd"], values["n_layer"]
    inner = values["n_inner"] if values["n_inner"] is not None else 4 * e
    std = values["initializer_range"]
    residual_std = std / (2 * n) ** 0.5  # transformers' scaled init of the c_proj layers
    head_dim = e // values["n_head"]
    scale = head_dim**-0.5 if values["scale_attn_weights"] else 1.0
    scales: tuple[float, ...] = (scale,)
    if values["scale_attn_by_inverse_layer_idx"]:
        scales = tuple(scale / float(i + 1) for i in range(n))
    keys = jax.random.split(key, 4)
    eps = values["layer_norm_epsilon"]
    attn = GPT2Attention(
        c_attn=Conv1D.build(e, 3 * e, std, dtype, key=keys[0]),
        c_proj=Conv1D.build(e, e, residual_std, dtype, key=keys[1]),
        attn_dropout=_dropout(values["attn_pdrop"]),
        resid_dropout=_dropout(values["resid_pdrop"]),
        num_heads=values["n_head"],
        scales=scales,
        upcast=bool(values["reorder_and_upcast_attn"]),
    )
    mlp = GPT2MLP(
        c_fc=Conv1D.build(e, inner, std, dtype, key=keys[2]),
        c_proj=Conv1D.build(inner, e, residual_std, dtype, key=keys[3]),
        dropout=_dropout(values["resid_pdrop"]),
        act=values["activation_function"],
    )
    return GPT2Block(
        ln_1=nn.LayerNorm(e, eps=eps, dtype=dtype),
        attn=attn,
        ln_2=nn.LayerNorm(e, eps=eps, dtype=dtype),
        mlp=mlp,
    )


@register_architecture
@axis_names({"wpe.weight": (None, "embed")})
class GPT2Model(PretrainedModel):
    """GPT-2's transformer: token and position embeddings, `n_layer` blocks, a final LayerNorm.

    Called with `input_ids` `(batch, seq)` and optionally `attention_mask` (1 for tokens, 0
    for padding), `position_ids` (default `0..seq-1`, as `transformers`' forward, padded or
    not; with `use_cache: false` in the config and no mask, jumps in explicit positions start
    packed sequences, as in `transformers`), `token_type_ids` (embedded with `wte`, as GPT-2
    does), and `key` for dropout in training mode. Returns `last_hidden_state`
    `(batch, seq, n_embd)`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.gpt2 import GPT2Model
        >>> config = {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 100}
        >>> model = GPT2Model.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3, 32)
    """

    architecture = "GPT2Model"
    model_type = "gpt2"
    base_model_prefix: ClassVar[str] = "transformer"
    keys_to_ignore_on_load_unexpected: ClassVar[tuple[str, ...]] = IGNORED_KEYS

    wte: nn.Embedding
    wpe: nn.Embedding
    drop: nn.Dropout
    h: nn.Stack
    ln_f: nn.LayerNorm
    packed_sequences: bool = field(static=True)

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | PretrainedConfig,
        *,
        key: PRNGKeyArray,
        dtype: Any = None,
    ) -> Self:
        """Build with random weights (`transformers`' initialisation) from a GPT-2 config.

        Arguments:
            config: the `config.json` dict; absent keys take `GPT2Config`'s defaults.
            key: the PRNG key.
            dtype: the parameters' dtype (float32 by default).

        Returns:
            The model.
        """
        config = PretrainedConfig(config)
        values = _gpt2_values(cls.__name__, config)
        return cls._build(config, values, key=key, dtype=dtype)

    @classmethod
    def _build(
        cls, config: PretrainedConfig, values: Mapping[str, Any], *, key: PRNGKeyArray, dtype: Any
    ) -> Self:
        dtype = jnp.float32 if dtype is None else dtype
        k_wte, k_wpe, k_h = jax.random.split(key, 3)
        e, std = values["n_embd"], values["initializer_range"]
        init = nn.init.normal(std)
        return cls(
            config=config,
            wte=nn.Embedding(values["vocab_size"], e, dtype=dtype, weight_init=init, key=k_wte),
            wpe=nn.Embedding(values["n_positions"], e, dtype=dtype, weight_init=init, key=k_wpe),
            drop=_dropout(values["embd_pdrop"]),
            h=nn.Stack(lambda k: _block(values, dtype, key=k), values["n_layer"], key=k_h),
            ln_f=nn.LayerNorm(e, eps=values["layer_norm_epsilon"], dtype=dtype),
            packed_sequences=not values.get("use_cache", True),
        )

    def __call__(
        self,
        *,
        input_ids: Any,
        attention_mask: Any = None,
        token_type_ids: Any = None,
        position_ids: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """The last hidden state `(batch, seq, n_embd)`.

        Arguments:
            input_ids: `(batch, seq)` token ids.
            attention_mask: `(batch, seq)`, 1 for tokens and 0 for padding.
            token_type_ids: `(batch, seq)` ids embedded with `wte` and added.
            position_ids: `(batch, seq)` or `(1, seq)` positions.
            key: PRNG key for dropout (training mode only).

        Returns:
            `last_hidden_state`.
        """
        owner = type(self).__name__
        ids, mask, positions = token_inputs(owner, input_ids, attention_mask, position_ids)
        seq = ids.shape[1]
        hidden = self.wte(ids)
        # lax.iota, not jnp.arange: jax2onnx's jnp.arange cannot take a symbolic length.
        pos = positions if positions is not None else lax.iota(jnp.int32, seq)[None]
        hidden = hidden + self.wpe(pos)
        if token_type_ids is not None:
            types = jnp.asarray(token_type_ids)
            if types.shape != ids.shape:
                raise ValueError(
                    f"{owner}: `token_type_ids` must have the shape of `input_ids` "
                    f"{list(ids.shape)}; got {list(types.shape)}."
                )
            hidden = hidden + self.wte(types)
        k_drop, k_layers = split_key(key, 2)
        hidden = self.drop(hidden, key=k_drop)
        # transformers reads packed sequences from explicit positions only without a cache,
        # which its forward makes whenever the config's use_cache is on (the default).
        attn_mask = causal_mask(seq, mask, positions if self.packed_sequences else None)
        hidden, _ = self._layers(hidden, attn_mask, None, key=k_layers)
        return hidden

    def cache_layout(self) -> CacheLayout:
        """`n_layer` layers of `n_head` heads of `n_embd // n_head`, in the embedding's dtype."""
        wte, heads = self.wte.weight, self.h.layers.attn.num_heads
        return CacheLayout(len(self.h), heads, wte.shape[1] // heads, wte.dtype)

    def decode(self, ids: Array, positions: Array, cache: KVCache) -> tuple[Array, KVCache]:
        """The last hidden state over new tokens with `generate`'s cache (see `Decoder`)."""
        hidden = self.wte(ids) + self.wpe(positions)
        return self._layers(hidden, cache.mask(ids.shape[1], None), cache)

    def _layers(
        self, hidden: Array, mask: Array, cache: MaybeCache, *, key: PRNGKeyArray | None = None
    ) -> tuple[Array, MaybeCache]:
        carry = (hidden, jnp.zeros((), jnp.int32), cache)
        hidden, _, cache = self.h(carry, mask, key=key)
        return self.ln_f(hidden), cache


@register_architecture
class GPT2LMHeadModel(CausalLM):
    """GPT-2 with its language-modelling head: returns `logits` `(batch, seq, vocab_size)`.

    With `tie_word_embeddings` (the default) the head is the token embedding itself (one
    array, `transformer.wte.weight`; `lm_head.weight` is its alias in `tied_weights()`);
    otherwise `lm_head` is its own bias-free `nn.Linear`. Inputs as `GPT2Model`'s.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.gpt2 import GPT2LMHeadModel
        >>> config = {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 100}
        >>> model = GPT2LMHeadModel.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3, 100)
        >>> model.tied_weights()
        {'lm_head.weight': 'transformer.wte.weight'}
    """

    architecture = "GPT2LMHeadModel"
    model_type = "gpt2"
    base_model_prefix: ClassVar[str] = "transformer"
    keys_to_ignore_on_load_unexpected: ClassVar[tuple[str, ...]] = IGNORED_KEYS
    token_embedding_name: ClassVar[str] = "transformer.wte"

    transformer: GPT2Model
    lm_head: nn.Linear | None

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | PretrainedConfig,
        *,
        key: PRNGKeyArray,
        dtype: Any = None,
    ) -> Self:
        """Build with random weights from a GPT-2 config (see `GPT2Model.from_config`).

        Arguments:
            config: the `config.json` dict.
            key: the PRNG key.
            dtype: the parameters' dtype.

        Returns:
            The model.
        """
        config = PretrainedConfig(config)
        values = _gpt2_values(cls.__name__, config)
        k_body, k_head = jax.random.split(key)
        body = GPT2Model._build(config, values, key=k_body, dtype=dtype)
        head = build_lm_head(
            values["n_embd"],
            values["vocab_size"],
            values["tie_word_embeddings"],
            values["initializer_range"],
            dtype,
            key=k_head,
        )
        return cls(config=config, transformer=body, lm_head=head)

    def lm_parts(self) -> LMParts:
        """`transformer`, `transformer.wte`, `lm_head`."""
        return LMParts(self.transformer, self.transformer.wte, self.lm_head)

    def max_positions(self) -> tuple[str, int]:
        """`("n_positions", n)`: GPT-2 has no positions beyond its position embedding's."""
        return "n_positions", self.transformer.wpe.weight.shape[0]

    def __call__(
        self,
        *,
        input_ids: Any,
        attention_mask: Any = None,
        token_type_ids: Any = None,
        position_ids: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """The logits `(batch, seq, vocab_size)`; arguments as `GPT2Model.__call__`'s.

        Arguments:
            input_ids: `(batch, seq)` token ids.
            attention_mask: `(batch, seq)`, 1 for tokens and 0 for padding.
            token_type_ids: `(batch, seq)` ids embedded with `wte` and added.
            position_ids: `(batch, seq)` or `(1, seq)` positions.
            key: PRNG key for dropout (training mode only).

        Returns:
            `logits`.
        """
        hidden = self.transformer(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            key=key,
        )
        return self.logits(hidden, key=projection_keys(key, 1)[0])
