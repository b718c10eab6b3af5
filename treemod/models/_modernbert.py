"""ModernBERT: `ModernBertModel`, `ModernBertForMaskedLM`, `ModernBertForSequenceClassification`,
`ModernBertForTokenClassification`.

Each reads every `ModernBertConfig` value `transformers`' class reads (the older keys
`global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta` and `rope_scaling` too)
and refuses, by name, the ones it does not compute. Padded batches are computed whole with a
mask (no unpadding), which gives `transformers`' eager and SDPA numbers on the real tokens.
Models are built in inference mode (dropout off); `tm.nn.inference_mode(model, False)` switches
dropout on, and a call's `key=` then drives it.
"""

# exports: ModernBertModel, ModernBertForMaskedLM, ModernBertForSequenceClassification,
# ModernBertForTokenClassification

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names

from ._attention_parts import projection_keys, split_key
from ._base import PretrainedConfig, PretrainedModel, config_error, register_architecture
from ._config_values import Value, num_labels, read_config
from ._hf_activations import hf_activation
from ._modernbert_layers import (
    ModernBertAttention,
    ModernBertEmbeddings,
    ModernBertEncoderLayer,
    ModernBertMLP,
    ModernBertPredictionHead,
    ModernBertRotary,
    window_masks,
)
from ._rope import Rope

__all__ = [
    "ModernBertModel",
    "ModernBertForMaskedLM",
    "ModernBertForSequenceClassification",
    "ModernBertForTokenClassification",
]

# The values these classes read, with `transformers.ModernBertConfig`'s defaults.
_VALUES: dict[str, Value] = {
    "vocab_size": Value(50368, "size"),
    "hidden_size": Value(768, "size"),
    "intermediate_size": Value(1152, "size"),
    "num_hidden_layers": Value(22, "size"),
    "num_attention_heads": Value(12, "size"),
    "hidden_activation": Value("gelu"),
    "max_position_embeddings": Value(8192, "size"),
    "norm_eps": Value(1e-5, "positive"),
    "norm_bias": Value(False, "bool"),
    "pad_token_id": Value(50283),
    "attention_bias": Value(False, "bool"),
    "attention_dropout": Value(0.0, "dropout"),
    "layer_types": Value(None, nullable=True),
    "global_attn_every_n_layers": Value(3, "size"),
    "rope_parameters": Value(None, nullable=True),
    "rope_scaling": Value(None, nullable=True),
    "global_rope_theta": Value(160_000.0, "positive"),
    "local_rope_theta": Value(10_000.0, "positive"),
    "local_attention": Value(128, "count"),
    "embedding_dropout": Value(0.0, "dropout"),
    "mlp_bias": Value(False, "bool"),
    "mlp_dropout": Value(0.0, "dropout"),
    "decoder_bias": Value(True, "bool"),
    "classifier_pooling": Value("cls"),
    "classifier_dropout": Value(0.0, "dropout"),
    "classifier_bias": Value(False, "bool"),
    "classifier_activation": Value("gelu"),
    "tie_word_embeddings": Value(True, "bool"),
    "head_dim": Value(None, "size", nullable=True),
}
_LAYER_TYPES = ("full_attention", "sliding_attention")
_ROPE_TYPES = ("default", "linear")


def _rope_params(name: str, c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each layer type's RoPE dict as `ModernBertConfig.convert_rope_params_to_dict` makes it."""
    given = c["rope_parameters"] or {}
    if not isinstance(given, Mapping):
        raise config_error(name, "rope_parameters", given, "a dict per layer type, or null")
    out: dict[str, dict[str, Any]] = {}
    thetas = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}
    for kind in _LAYER_TYPES:
        params = dict(given.get(kind) or {"rope_type": "default"})
        params.update(c["rope_scaling"] or {})
        params.setdefault("rope_theta", c[thetas[kind]])
        params.setdefault("rope_type", params.get("type", "default"))
        if params["rope_type"] not in _ROPE_TYPES:
            key = f"rope_parameters.{kind}.rope_type"
            raise config_error(name, key, params["rope_type"], ", ".join(map(repr, _ROPE_TYPES)))
        out[kind] = params
    return out


def _read(name: str, config: PretrainedConfig) -> dict[str, Any]:
    """The config values ModernBERT reads, checked; refused values raise `CheckpointError`."""
    c = read_config(name, config, _VALUES)
    for key in ("hidden_activation", "classifier_activation"):
        hf_activation(name, key, c[key])
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    if hidden % heads:
        raise config_error(name, "num_attention_heads", heads, f"a divisor of hidden_size={hidden}")
    if c["head_dim"] not in (None, hidden // heads):
        # transformers' rotary reads head_dim, its attention hidden_size // heads: they clash.
        raise config_error(name, "head_dim", c["head_dim"], f"null or {hidden // heads}")
    if (hidden // heads) % 2:
        raise config_error(name, "num_attention_heads", heads, "one giving an even head size")
    layers = c["num_hidden_layers"]
    types = c["layer_types"]
    if types is None:
        every = c["global_attn_every_n_layers"]
        types = ["sliding_attention" if i % every else "full_attention" for i in range(layers)]
    if len(types) != layers or any(t not in _LAYER_TYPES for t in types):
        supported = f"{layers} of 'full_attention', 'sliding_attention'"
        raise config_error(name, "layer_types", c["layer_types"], supported)
    c["layer_types"] = list(types)
    if c["classifier_pooling"] not in ("cls", "mean"):
        raise config_error(name, "classifier_pooling", c["classifier_pooling"], "'cls', 'mean'")
    pad = c["pad_token_id"]
    if pad is not None and not (
        isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < c["vocab_size"]
    ):
        raise config_error(name, "pad_token_id", pad, "null or a token id below vocab_size")
    c["rope"] = _rope_params(name, c)
    return c


def _norm(c: dict[str, Any], dtype: Any) -> nn.LayerNorm:
    return nn.LayerNorm(c["hidden_size"], eps=c["norm_eps"], use_bias=c["norm_bias"], dtype=dtype)


def _layer(c: dict[str, Any], i: int, dtype: Any, key: PRNGKeyArray) -> ModernBertEncoderLayer:
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    k_qkv, k_o, k_i, k_mo = jax.random.split(key, 4)
    attention = ModernBertAttention(
        Wqkv=nn.Linear(hidden, 3 * hidden, c["attention_bias"], dtype, key=k_qkv),
        Wo=nn.Linear(hidden, hidden, c["attention_bias"], dtype, key=k_o),
        attn_drop=nn.Dropout(c["attention_dropout"], inference=True),
        out_drop=nn.Dropout(c["attention_dropout"], inference=True),
        num_heads=c["num_attention_heads"],
    )
    mlp = ModernBertMLP(
        Wi=nn.Linear(hidden, 2 * inter, c["mlp_bias"], dtype, key=k_i),
        Wo=nn.Linear(inter, hidden, c["mlp_bias"], dtype, key=k_mo),
        drop=nn.Dropout(c["mlp_dropout"], inference=True),
        act=c["hidden_activation"],
    )
    return ModernBertEncoderLayer(
        attn_norm=None if i == 0 else _norm(c, dtype),
        attn=attention,
        mlp_norm=_norm(c, dtype),
        mlp=mlp,
        local=c["layer_types"][i] == "sliding_attention",
    )


def _head(c: dict[str, Any], dtype: Any, key: PRNGKeyArray) -> ModernBertPredictionHead:
    hidden = c["hidden_size"]
    return ModernBertPredictionHead(
        dense=nn.Linear(hidden, hidden, c["classifier_bias"], dtype, key=key),
        norm=_norm(c, dtype),
        act=c["classifier_activation"],
    )


@register_architecture
class ModernBertModel(PretrainedModel):
    """ModernBERT's encoder (`transformers.ModernBertModel`): returns `last_hidden_state`.

    Rotary positions (`global_rope_theta` in global layers, `local_rope_theta` in local ones),
    a local layer between global ones as `layer_types` (or `global_attn_every_n_layers`) says,
    attending within `local_attention // 2` positions either side; GeGLU MLPs; a final norm.
    Call it with `input_ids` `(batch, seq)` (or `inputs_embeds`), optionally `attention_mask`
    (1 to attend, 0 for padding) and `position_ids`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.modernbert import ModernBertModel
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 3,
        ...           "num_attention_heads": 2, "intermediate_size": 24, "pad_token_id": 0}
        >>> model = ModernBertModel.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]]), attention_mask=jnp.array([[0, 1, 1]])).shape
        (1, 3, 16)
        >>> [layer.local for layer in model.layers]
        [False, True, True]
    """

    architecture = "ModernBertModel"
    model_type = "modernbert"
    base_model_prefix = "model"

    embeddings: ModernBertEmbeddings
    layers: tuple[ModernBertEncoderLayer, ...]
    final_norm: nn.LayerNorm
    rotary_emb: ModernBertRotary
    half_window: int = field(static=True)

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | PretrainedConfig,
        *,
        key: PRNGKeyArray,
        dtype: Any = None,
    ) -> Self:
        """Build the model with random weights from a `ModernBertConfig` dict.

        Arguments:
            config: the config; keys it lacks take `ModernBertConfig`'s defaults.
            key: the PRNG key.
            dtype: the parameters' dtype (default float32).

        Returns:
            The model, in inference mode.
        """
        config = PretrainedConfig(config)
        c = _read(cls.__name__, config)
        k_emb, *k_layers = jax.random.split(key, 1 + c["num_hidden_layers"])
        word = nn.Embedding(c["vocab_size"], c["hidden_size"], dtype=dtype, key=k_emb)
        if c["pad_token_id"] is not None:  # PyTorch's padding_idx: the padding row starts at zero
            word = nn.Embedding(weight=word.weight.at[c["pad_token_id"]].set(0))
        embeddings = ModernBertEmbeddings(
            tok_embeddings=word,
            norm=_norm(c, dtype),
            drop=nn.Dropout(c["embedding_dropout"], inference=True),
        )
        head_dim = c["hidden_size"] // c["num_attention_heads"]
        ropes = {
            kind: Rope.from_config(cls.__name__, c["rope"][kind], head_dim, 0)
            for kind in ("full_attention", "sliding_attention")
        }
        return cls(
            config=config,
            embeddings=embeddings,
            layers=tuple(_layer(c, i, dtype, k) for i, k in enumerate(k_layers)),
            final_norm=_norm(c, dtype),
            rotary_emb=ModernBertRotary(ropes["full_attention"], ropes["sliding_attention"]),
            half_window=c["local_attention"] // 2,
        )

    def __call__(
        self,
        *,
        input_ids: Any = None,
        attention_mask: Any = None,
        position_ids: Any = None,
        inputs_embeds: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """The last layer's normalised hidden states `(batch, seq, hidden)`.

        Arguments:
            input_ids: token ids `(batch, seq)`; or give `inputs_embeds` instead.
            attention_mask: `(batch, seq)`, 1 for tokens to attend to, 0 for padding.
            position_ids: positions `(batch, seq)` or `(1, seq)` (default `0..seq-1`).
            inputs_embeds: token embeddings `(batch, seq, hidden)` instead of `input_ids`.
            key: PRNG key for dropout (used only after `tm.nn.inference_mode(model, False)`).

        Returns:
            `last_hidden_state`, `(batch, seq, hidden)`.
        """
        name = type(self).__name__
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(f"{name}: give exactly one of input_ids and inputs_embeds.")
        k_emb, *k_layers = split_key(key, 1 + len(self.layers))
        if input_ids is not None:
            ids = jnp.asarray(input_ids)
            if ids.ndim != 2 or not jnp.issubdtype(ids.dtype, jnp.integer):
                raise ValueError(
                    f"{name}: input_ids must be integer token ids (batch, sequence); got "
                    f"{ids.dtype}{list(ids.shape)}."
                )
            words = self.embeddings.tok_embeddings(ids)
        else:
            words = jnp.asarray(inputs_embeds)
            if words.ndim != 3:
                raise ValueError(
                    f"{name}: inputs_embeds has shape {words.shape}; expected (batch, sequence, "
                    "hidden_size)."
                )
        batch, seq = words.shape[:2]
        mask = None
        if attention_mask is not None:
            mask = jnp.asarray(attention_mask)
            if mask.shape != (batch, seq):
                raise ValueError(
                    f"{name}: attention_mask has shape {mask.shape}; expected (batch, sequence)"
                    f" = {(batch, seq)}, with 1 for the tokens to attend to and 0 for padding."
                )
        positions = (
            jax.lax.iota(jnp.int32, seq)[None]
            if position_ids is None
            else jnp.asarray(position_ids)
        )
        if positions.ndim != 2 or positions.shape[1] != seq:
            raise ValueError(
                f"{name}: position_ids has shape {positions.shape}; expected (batch, {seq}) or "
                f"(1, {seq})."
            )
        x = self.embeddings(words, key=k_emb)
        ropes = self.rotary_emb(positions, x.dtype)
        masks = window_masks(mask, seq, self.half_window)
        for layer, k in zip(self.layers, k_layers, strict=True):
            x = layer(x, masks, ropes, key=k)
        return self.final_norm(x)


@axis_names({"weight": ("vocab", "embed"), "bias": ("vocab",)})
class ModernBertDecoder(Module):
    """The masked-LM projection: `weight` is `None` when tied to the token embeddings."""

    weight: Array | None
    bias: Array | None

    def __call__(self, x: Array, tied: Array) -> Array:
        """`(batch, seq, hidden)` to `(batch, seq, vocab)` logits."""
        w = tied if self.weight is None else self.weight
        y = x @ w.T.astype(x.dtype)
        if self.bias is None:
            return y
        return y + jnp.expand_dims(self.bias.astype(y.dtype), tuple(range(y.ndim - 1)))


def _base(config: PretrainedConfig, key: PRNGKeyArray, dtype: Any) -> ModernBertModel:
    # The heads read the config first, so refusals name the class asked for.
    return ModernBertModel.from_config(config, key=key, dtype=dtype)


@register_architecture
class ModernBertForMaskedLM(PretrainedModel):
    """ModernBERT with its masked-LM head (`transformers.ModernBertForMaskedLM`): `logits`.

    `head` (dense, activation, norm), then `decoder`, whose weight is the token embeddings'
    array when `tie_word_embeddings` (the default) and whose bias is there with
    `decoder_bias`. Called as `ModernBertModel` is; `sparse_prediction` only applies with
    labels, which this call does not take, so logits cover every token.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.modernbert import ModernBertForMaskedLM
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 24, "pad_token_id": 0}
        >>> model = ModernBertForMaskedLM.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3, 50)
        >>> model.tied_weights()
        {'decoder.weight': 'model.embeddings.tok_embeddings.weight'}
    """

    architecture = "ModernBertForMaskedLM"
    model_type = "modernbert"
    base_model_prefix = "model"

    model: ModernBertModel
    head: ModernBertPredictionHead
    decoder: ModernBertDecoder

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights (see `ModernBertModel.from_config`)."""
        config = PretrainedConfig(config)
        c = _read(cls.__name__, config)
        k_model, k_head, k_dec = jax.random.split(key, 3)
        model = _base(config, k_model, dtype)
        weight = None
        if not c["tie_word_embeddings"]:
            weight = nn.Linear(c["hidden_size"], c["vocab_size"], False, dtype, key=k_dec).weight
        word = model.embeddings.tok_embeddings.weight
        bias = jnp.zeros(c["vocab_size"], word.dtype) if c["decoder_bias"] else None
        return cls(
            config=config,
            model=model,
            head=_head(c, dtype, k_head),
            decoder=ModernBertDecoder(weight=weight, bias=bias),
        )

    def tied_weights(self) -> dict[str, str]:
        """`decoder.weight` is the token embeddings' array when tied."""
        if self.decoder.weight is not None:
            return {}
        return {"decoder.weight": "model.embeddings.tok_embeddings.weight"}

    def __call__(self, **inputs: Any) -> Array:
        """The masked-LM `logits` `(batch, seq, vocab_size)`; arguments as `ModernBertModel`'s."""
        hidden = self.model(**inputs)
        h = self.head(hidden, key=projection_keys(inputs.get("key"), 1)[0])
        return self.decoder(h, self.model.embeddings.tok_embeddings.weight)


class _Classifier(PretrainedModel):
    """The classifiers' shared build: `model`, `head`, `drop`, `classifier`."""

    model_type = "modernbert"
    base_model_prefix = "model"

    model: ModernBertModel
    head: ModernBertPredictionHead
    drop: nn.Dropout
    classifier: nn.Linear

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights (see `ModernBertModel.from_config`); the number
        of labels is `id2label`'s size, else `num_labels`, else 2, as `transformers` counts."""
        config = PretrainedConfig(config)
        name = cls.__name__
        c = _read(name, config)
        labels = num_labels(name, config)
        if labels < 1:
            raise config_error(name, "num_labels", labels, "at least 1 label")
        k_model, k_head, k_cls = jax.random.split(key, 3)
        return cls(
            config=config,
            model=_base(config, k_model, dtype),
            head=_head(c, dtype, k_head),
            drop=nn.Dropout(c["classifier_dropout"], inference=True),
            classifier=nn.Linear(c["hidden_size"], labels, dtype=dtype, key=k_cls),
        )

    def _logits(self, pooled: Array, key: PRNGKeyArray | None) -> Array:
        k_head, k_classifier = projection_keys(key, 2)
        h = self.drop(self.head(pooled, key=k_head), key=key)
        return self.classifier(h, key=k_classifier)


@register_architecture
class ModernBertForSequenceClassification(_Classifier):
    """ModernBERT with a classifier (`transformers.ModernBertForSequenceClassification`).

    Pools by `classifier_pooling`: `"cls"` the first token, `"mean"` the mean over the tokens
    `attention_mask` marks. Returns `logits` `(batch, num_labels)`. With `"cls"`, pad on the
    right (the tokenizer's side): a left-padded row's first token is padding, whose value
    `transformers`' eager and SDPA attention give differently (treemod gives eager's).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.modernbert import ModernBertForSequenceClassification
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 24, "pad_token_id": 0,
        ...           "classifier_pooling": "mean", "num_labels": 3}
        >>> model = ModernBertForSequenceClassification.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3)
    """

    architecture = "ModernBertForSequenceClassification"

    def __call__(self, **inputs: Any) -> Array:
        """The `logits` `(batch, num_labels)`; arguments as `ModernBertModel`'s."""
        k_model, k_drop = split_key(inputs.pop("key", None), 2)
        hidden = self.model(**inputs, key=k_model)
        if self.config.get("classifier_pooling", "cls") == "cls":
            return self._logits(hidden[:, 0], k_drop)
        mask = inputs.get("attention_mask")
        weights = jnp.ones(hidden.shape[:2]) if mask is None else jnp.asarray(mask)
        weights = weights.astype(hidden.dtype)
        pooled = (hidden * weights[..., None]).sum(1) / weights.sum(1, keepdims=True)
        return self._logits(pooled, k_drop)


@register_architecture
class ModernBertForTokenClassification(_Classifier):
    """ModernBERT with a classifier per token (`transformers.ModernBertForTokenClassification`).

    Returns `logits` `(batch, seq, num_labels)`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.modernbert import ModernBertForTokenClassification
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 24, "pad_token_id": 0}
        >>> model = ModernBertForTokenClassification.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3, 2)
    """

    architecture = "ModernBertForTokenClassification"

    def __call__(self, **inputs: Any) -> Array:
        """The `logits` `(batch, seq, num_labels)`; arguments as `ModernBertModel`'s."""
        k_model, k_drop = split_key(inputs.pop("key", None), 2)
        return self._logits(self.model(**inputs, key=k_model), k_drop)
