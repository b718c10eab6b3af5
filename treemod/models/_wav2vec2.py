"""wav2vec2: `Wav2Vec2Model`, `Wav2Vec2ForCTC`, `Wav2Vec2ForSequenceClassification`.

Each reads every `Wav2Vec2Config` value its `transformers` class reads and refuses, by name, the
ones it does not compute (adapters, the weighted layer sum). Training-only values (SpecAugment's
`mask_time_*` / `mask_feature_*`, `layerdrop`) do not change inference; treemod's training mode
applies dropout but neither SpecAugment nor layer drop. Models are built in inference mode;
`tm.nn.inference_mode(model, False)` switches dropout on, and a call's `key=` then drives it.
Files with the positional convolution's older `weight_g` / `weight_v` load as `transformers` 5
loads them (as `parametrizations.weight.original0` / `original1`).
"""

# exports: Wav2Vec2Model, Wav2Vec2ForCTC, Wav2Vec2ForSequenceClassification

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
from ._axis_layouts import vocab_head
from ._base import PretrainedConfig, PretrainedModel, config_error, register_architecture
from ._config_values import Value, num_labels, read_config
from ._hf_activations import hf_activation
from ._wav2vec2_layers import (
    ChannelNorm,
    Wav2Vec2Attention,
    Wav2Vec2ConvLayer,
    Wav2Vec2EncoderLayer,
    Wav2Vec2FeatureProjection,
    Wav2Vec2FeedForward,
    Wav2Vec2PositionalConvEmbedding,
    WeightNormConv1d,
    WeightNormOriginals,
    WeightNormParametrizations,
    conv_lengths,
)

__all__ = ["Wav2Vec2Model", "Wav2Vec2ForCTC", "Wav2Vec2ForSequenceClassification"]

# The values these classes read, with `transformers.Wav2Vec2Config`'s defaults.
_VALUES: dict[str, Value] = {
    "vocab_size": Value(32, "size", nullable=True),
    "hidden_size": Value(768, "size"),
    "num_hidden_layers": Value(12, "size"),
    "num_attention_heads": Value(12, "size"),
    "intermediate_size": Value(3072, "size"),
    "hidden_act": Value("gelu"),
    "hidden_dropout": Value(0.1, "dropout"),
    "activation_dropout": Value(0.1, "dropout"),
    "attention_dropout": Value(0.1, "dropout"),
    "feat_proj_dropout": Value(0.0, "dropout"),
    "final_dropout": Value(0.1, "dropout"),
    "layerdrop": Value(0.1, "dropout"),
    "layer_norm_eps": Value(1e-5, "positive"),
    "feat_extract_norm": Value("group"),
    "feat_extract_activation": Value("gelu"),
    "conv_dim": Value((512, 512, 512, 512, 512, 512, 512)),
    "conv_stride": Value((5, 2, 2, 2, 2, 2, 2)),
    "conv_kernel": Value((10, 3, 3, 3, 3, 2, 2)),
    "conv_bias": Value(False, "bool"),
    "num_conv_pos_embeddings": Value(128, "size"),
    "num_conv_pos_embedding_groups": Value(16, "size"),
    "do_stable_layer_norm": Value(False, "bool"),
    "mask_time_prob": Value(0.05, "prob"),
    "mask_feature_prob": Value(0.0, "prob"),
    "add_adapter": Value(False, "bool"),
    "adapter_attn_dim": Value(None, nullable=True),
    "use_weighted_layer_sum": Value(False, "bool"),
    "classifier_proj_size": Value(256, "size"),
}
# transformers 5's conversion of older files' weight-norm names (its "legacy" mapping).
_LOAD_RENAMES = (
    (r"\.weight_g$", ".parametrizations.weight.original0"),
    (r"\.weight_v$", ".parametrizations.weight.original1"),
)


def _read(name: str, config: PretrainedConfig) -> dict[str, Any]:
    """The config values wav2vec2 reads, checked; refused values raise `CheckpointError`."""
    c = read_config(name, config, _VALUES)
    for key in ("hidden_act", "feat_extract_activation"):
        hf_activation(name, key, c[key])
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    if hidden % heads:
        raise config_error(name, "num_attention_heads", heads, f"a divisor of hidden_size={hidden}")
    if hidden % c["num_conv_pos_embedding_groups"]:
        value = c["num_conv_pos_embedding_groups"]
        raise config_error(name, "num_conv_pos_embedding_groups", value, f"a divisor of {hidden}")
    for key in ("conv_dim", "conv_stride", "conv_kernel"):
        values = c[key]
        ok = isinstance(values, list | tuple) and len(values) > 0
        if not ok or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
            raise config_error(name, key, values, "a non-empty list of positive integers")
        c[key] = tuple(values)
    if not len(c["conv_dim"]) == len(c["conv_stride"]) == len(c["conv_kernel"]):
        supported = f"{len(c['conv_dim'])} strides, as many as conv_dim's layers"
        raise config_error(name, "conv_stride", list(c["conv_stride"]), supported)
    if c["feat_extract_norm"] not in ("group", "layer"):
        raise config_error(name, "feat_extract_norm", c["feat_extract_norm"], "'group', 'layer'")
    for key, off in (("add_adapter", False), ("adapter_attn_dim", None)):
        if c[key] != off:
            raise config_error(name, key, c[key], f"{off!r}: adapters are not implemented")
    return c


def _conv_layers(c: dict[str, Any], dtype: Any, key: PRNGKeyArray) -> tuple[Any, ...]:
    layers = []
    dims = (1, *c["conv_dim"])
    for i, k in enumerate(jax.random.split(key, len(c["conv_dim"]))):
        out = dims[i + 1]
        conv = nn.Conv1d(
            dims[i],
            out,
            c["conv_kernel"][i],
            stride=c["conv_stride"][i],
            use_bias=c["conv_bias"],
            dtype=dtype,
            key=k,
        )
        norm: Any = None
        if c["feat_extract_norm"] == "layer":
            norm = nn.LayerNorm(out, dtype=dtype)
        elif i == 0:
            norm = ChannelNorm(jnp.ones(out, conv.weight.dtype), jnp.zeros(out, conv.weight.dtype))
        layers.append(Wav2Vec2ConvLayer(conv, norm, c["feat_extract_activation"]))
    return tuple(layers)


def _layer(c: dict[str, Any], dtype: Any, key: PRNGKeyArray) -> Wav2Vec2EncoderLayer:
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    ks = jax.random.split(key, 6)
    q, k, v, o = (nn.Linear(hidden, hidden, dtype=dtype, key=k) for k in ks[:4])
    attention = Wav2Vec2Attention(
        q_proj=q,
        k_proj=k,
        v_proj=v,
        out_proj=o,
        dropout=nn.Dropout(c["attention_dropout"], inference=True),
        num_heads=c["num_attention_heads"],
    )
    feed_forward = Wav2Vec2FeedForward(
        intermediate_dense=nn.Linear(hidden, inter, dtype=dtype, key=ks[4]),
        intermediate_dropout=nn.Dropout(c["activation_dropout"], inference=True),
        output_dense=nn.Linear(inter, hidden, dtype=dtype, key=ks[5]),
        output_dropout=nn.Dropout(c["hidden_dropout"], inference=True),
        act=c["hidden_act"],
    )
    return Wav2Vec2EncoderLayer(
        attention=attention,
        dropout=nn.Dropout(c["hidden_dropout"], inference=True),
        layer_norm=nn.LayerNorm(hidden, eps=c["layer_norm_eps"], dtype=dtype),
        feed_forward=feed_forward,
        final_layer_norm=nn.LayerNorm(hidden, eps=c["layer_norm_eps"], dtype=dtype),
        stable=c["do_stable_layer_norm"],
    )


class Wav2Vec2FeatureEncoder(Module):
    """The convolutions from raw audio (`conv_layers.{i}`)."""

    conv_layers: tuple[Wav2Vec2ConvLayer, ...]

    def __call__(self, audio: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, samples)` to `(batch, conv_dim[-1], frames)` (`key`: the convolutions',
        for LoRA dropout)."""
        x = audio[:, None]
        keys = projection_keys(key, len(self.conv_layers))
        for layer, k in zip(self.conv_layers, keys, strict=True):
            x = layer(x, key=k)
        return x


class Wav2Vec2Encoder(Module):
    """Positions, the layers (`layers`, an `nn.Stack`) and the encoder's `layer_norm` (before the
    layers, or after them with `do_stable_layer_norm`)."""

    pos_conv_embed: Wav2Vec2PositionalConvEmbedding
    layer_norm: nn.LayerNorm
    dropout: nn.Dropout
    layers: nn.Stack
    stable: bool = field(static=True)

    def __call__(self, x: Array, frames: Array | None, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, frames, hidden)` with the `(batch, frames)` boolean mask of real frames."""
        k_drop, k_layers = split_key(key, 2)
        mask = None
        if frames is not None:
            x = jnp.where(frames[..., None], x, jnp.zeros((), x.dtype))
            mask = frames[:, None, None, :]
        x = x + self.pos_conv_embed(x)
        if not self.stable:
            x = self.layer_norm(x)
        x = self.layers(self.dropout(x, key=k_drop), mask, key=k_layers)
        return self.layer_norm(x) if self.stable else x


@register_architecture
class Wav2Vec2Model(PretrainedModel):
    """wav2vec2's encoder (`transformers.Wav2Vec2Model`): returns `last_hidden_state`.

    Raw audio `input_values` `(batch, samples)` go through the convolutional feature encoder
    (`feat_extract_norm` `"group"` or `"layer"`), the feature projection, the positional
    convolution and the Transformer layers. An `attention_mask` `(batch, samples)` (1 for real
    samples) masks the padded frames as `transformers` does; the checkpoints of models trained
    without one (`feat_extract_norm: "group"`) expect none.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.wav2vec2 import Wav2Vec2Model
        >>> config = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        ...           "intermediate_size": 32, "conv_dim": [8, 8], "conv_stride": [4, 2],
        ...           "conv_kernel": [8, 3], "num_conv_pos_embeddings": 6,
        ...           "num_conv_pos_embedding_groups": 2}
        >>> model = Wav2Vec2Model.from_config(config, key=jax.random.key(0))
        >>> model(input_values=jnp.ones((1, 400))).shape   # (400 - 8) // 4 + 1 = 99, then 49
        (1, 49, 16)
    """

    architecture = "Wav2Vec2Model"
    model_type = "wav2vec2"
    base_model_prefix = "wav2vec2"
    load_renames = _LOAD_RENAMES

    feature_extractor: Wav2Vec2FeatureEncoder
    feature_projection: Wav2Vec2FeatureProjection
    masked_spec_embed: Array | None
    encoder: Wav2Vec2Encoder

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights from a `Wav2Vec2Config` dict.

        Arguments:
            config: the config; keys it lacks take `Wav2Vec2Config`'s defaults.
            key: the PRNG key.
            dtype: the parameters' dtype (default float32).

        Returns:
            The model, in inference mode.
        """
        config = PretrainedConfig(config)
        c = _read(cls.__name__, config)
        hidden, last = c["hidden_size"], c["conv_dim"][-1]
        k_conv, k_proj, k_spec, k_pos, k_layers = jax.random.split(key, 5)
        kernel, groups = c["num_conv_pos_embeddings"], c["num_conv_pos_embedding_groups"]
        pos = nn.Conv1d(hidden, hidden, kernel, groups=groups, dtype=dtype, key=k_pos)
        assert pos.bias is not None
        norm = jnp.sqrt(jnp.sum(jnp.square(pos.weight), axis=(0, 1), keepdims=True))
        conv = WeightNormConv1d(
            WeightNormParametrizations(WeightNormOriginals(norm, pos.weight)), pos.bias, groups
        )
        encoder = Wav2Vec2Encoder(
            pos_conv_embed=Wav2Vec2PositionalConvEmbedding(conv, c["feat_extract_activation"]),
            layer_norm=nn.LayerNorm(hidden, eps=c["layer_norm_eps"], dtype=dtype),
            dropout=nn.Dropout(c["hidden_dropout"], inference=True),
            layers=nn.Stack(lambda k: _layer(c, dtype, k), c["num_hidden_layers"], key=k_layers),
            stable=c["do_stable_layer_norm"],
        )
        projection = Wav2Vec2FeatureProjection(
            layer_norm=nn.LayerNorm(last, eps=c["layer_norm_eps"], dtype=dtype),
            projection=nn.Linear(last, hidden, dtype=dtype, key=k_proj),
            dropout=nn.Dropout(c["feat_proj_dropout"], inference=True),
        )
        spec = None  # transformers keeps it only for SpecAugment, which training applies
        if c["mask_time_prob"] > 0 or c["mask_feature_prob"] > 0:
            spec = jax.random.uniform(k_spec, (hidden,), pos.weight.dtype)
        return cls(
            config=config,
            feature_extractor=Wav2Vec2FeatureEncoder(_conv_layers(c, dtype, k_conv)),
            feature_projection=projection,
            masked_spec_embed=spec,
            encoder=encoder,
        )

    def frames_mask(self, attention_mask: Any, frames: int) -> Array | None:
        """The `(batch, frames)` mask of real frames of a `(batch, samples)` sample mask."""
        if attention_mask is None:
            return None
        mask = jnp.asarray(attention_mask)
        lengths = mask.astype(jnp.int32).sum(-1)
        convs = self.feature_extractor.conv_layers
        kernels = tuple(layer.conv.kernel_size[0] for layer in convs)
        strides = tuple(layer.conv.stride[0] for layer in convs)
        out = conv_lengths(lengths, kernels, strides)
        return jnp.arange(frames)[None, :] < out[:, None]

    def __call__(
        self,
        *,
        input_values: Any,
        attention_mask: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """The last hidden states `(batch, frames, hidden)` (`last_hidden_state`).

        Arguments:
            input_values: raw audio `(batch, samples)`, float.
            attention_mask: `(batch, samples)`, 1 for real samples, 0 for padding.
            key: PRNG key for dropout (used only after `tm.nn.inference_mode(model, False)`).

        Returns:
            `last_hidden_state`, `(batch, frames, hidden)`.
        """
        name = type(self).__name__
        audio = jnp.asarray(input_values)
        if audio.ndim != 2 or not jnp.issubdtype(audio.dtype, jnp.floating):
            raise ValueError(
                f"{name}: input_values must be float audio (batch, samples); got "
                f"{audio.dtype}{list(audio.shape)}."
            )
        if attention_mask is not None and jnp.shape(attention_mask) != audio.shape:
            raise ValueError(
                f"{name}: attention_mask has shape {jnp.shape(attention_mask)}; expected "
                f"{audio.shape}, the shape of input_values."
            )
        k_proj, k_enc = split_key(key, 2)
        features = jnp.swapaxes(self.feature_extractor(audio, key=key), 1, 2)
        frames = self.frames_mask(attention_mask, features.shape[1])
        x = self.feature_projection(features, key=k_proj)
        return self.encoder(x, frames, key=k_enc)


def _base(name: str, config: PretrainedConfig, key: PRNGKeyArray, dtype: Any) -> Any:
    _read(name, config)  # refusals name the class asked for
    return Wav2Vec2Model.from_config(config, key=key, dtype=dtype)


@register_architecture
@axis_names(vocab_head("lm_head"))
class Wav2Vec2ForCTC(PretrainedModel):
    """wav2vec2 with its CTC head (`transformers.Wav2Vec2ForCTC`): `logits`
    `(batch, frames, vocab_size)`. Called as `Wav2Vec2Model` is.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.wav2vec2 import Wav2Vec2ForCTC
        >>> config = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        ...           "intermediate_size": 32, "conv_dim": [8], "conv_stride": [5],
        ...           "conv_kernel": [10], "num_conv_pos_embeddings": 4,
        ...           "num_conv_pos_embedding_groups": 2, "vocab_size": 20}
        >>> Wav2Vec2ForCTC.from_config(config, key=jax.random.key(0))(
        ...     input_values=jnp.ones((2, 100))).shape
        (2, 19, 20)
    """

    architecture = "Wav2Vec2ForCTC"
    model_type = "wav2vec2"
    base_model_prefix = "wav2vec2"
    load_renames = _LOAD_RENAMES

    wav2vec2: Wav2Vec2Model
    dropout: nn.Dropout
    lm_head: nn.Linear

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights (see `Wav2Vec2Model.from_config`)."""
        config = PretrainedConfig(config)
        c = _read(cls.__name__, config)
        if c["vocab_size"] is None:
            raise config_error(cls.__name__, "vocab_size", None, "a vocabulary size for the head")
        k_model, k_head = jax.random.split(key)
        return cls(
            config=config,
            wav2vec2=_base(cls.__name__, config, k_model, dtype),
            dropout=nn.Dropout(c["final_dropout"], inference=True),
            lm_head=nn.Linear(c["hidden_size"], c["vocab_size"], dtype=dtype, key=k_head),
        )

    def __call__(self, **inputs: Any) -> Array:
        """The CTC `logits`; arguments as `Wav2Vec2Model`'s."""
        key = inputs.pop("key", None)
        k_model, k_drop = split_key(key, 2)
        (k_head,) = projection_keys(key, 1)
        hidden = self.wav2vec2(**inputs, key=k_model)
        return self.lm_head(self.dropout(hidden, key=k_drop), key=k_head)


@register_architecture
class Wav2Vec2ForSequenceClassification(PretrainedModel):
    """wav2vec2 with a classifier on its frames' mean
    (`transformers.Wav2Vec2ForSequenceClassification`): `logits` `(batch, num_labels)`.

    The hidden states go through `projector` (`classifier_proj_size`), then their mean over the
    real frames (all frames without an `attention_mask`), then `classifier`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.wav2vec2 import Wav2Vec2ForSequenceClassification
        >>> config = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        ...           "intermediate_size": 32, "conv_dim": [8], "conv_stride": [5],
        ...           "conv_kernel": [10], "num_conv_pos_embeddings": 4,
        ...           "num_conv_pos_embedding_groups": 2, "classifier_proj_size": 8}
        >>> Wav2Vec2ForSequenceClassification.from_config(config, key=jax.random.key(0))(
        ...     input_values=jnp.ones((2, 100))).shape
        (2, 2)
    """

    architecture = "Wav2Vec2ForSequenceClassification"
    model_type = "wav2vec2"
    base_model_prefix = "wav2vec2"
    load_renames = _LOAD_RENAMES

    wav2vec2: Wav2Vec2Model
    projector: nn.Linear
    classifier: nn.Linear

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights (see `Wav2Vec2Model.from_config`)."""
        config = PretrainedConfig(config)
        name = cls.__name__
        c = _read(name, config)
        if c["use_weighted_layer_sum"]:
            raise config_error(name, "use_weighted_layer_sum", True, "false")
        labels = num_labels(name, config)
        if labels < 1:
            raise config_error(name, "num_labels", labels, "at least 1 label")
        k_model, k_proj, k_cls = jax.random.split(key, 3)
        proj = c["classifier_proj_size"]
        return cls(
            config=config,
            wav2vec2=_base(name, config, k_model, dtype),
            projector=nn.Linear(c["hidden_size"], proj, dtype=dtype, key=k_proj),
            classifier=nn.Linear(proj, labels, dtype=dtype, key=k_cls),
        )

    def __call__(self, **inputs: Any) -> Array:
        """The `logits` `(batch, num_labels)`; arguments as `Wav2Vec2Model`'s."""
        # The body draws its projections' keys from the key itself: another stream here.
        k_projector, k_classifier = projection_keys(inputs.get("key"), 2, stream=1)
        h = self.projector(self.wav2vec2(**inputs), key=k_projector)
        frames = self.wav2vec2.frames_mask(inputs.get("attention_mask"), h.shape[1])
        if frames is None:
            return self.classifier(h.mean(1), key=k_classifier)
        keep = frames[..., None]
        total = jnp.where(keep, h, jnp.zeros((), h.dtype)).sum(1)
        pooled = total / frames.sum(1, keepdims=True).astype(h.dtype)
        return self.classifier(pooled, key=k_classifier)
