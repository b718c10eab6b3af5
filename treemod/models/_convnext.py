"""ConvNeXt as `transformers` builds it: `ConvNextModel`, `ConvNextForImageClassification`.

Each layer: a depthwise 7x7 convolution, a LayerNorm over the channels (channels last), a
pointwise MLP as two linear layers, an optional layer scale, and the residual. The stem and
the downsampling layers normalise channels first (a LayerNorm over the channel axis of an NCHW
map); those norms use eps 1e-6 whatever the config says (`layer_norm_eps` is the final norm's),
as in `transformers`. Models are built in inference mode; stochastic depth (`drop_path_rate`)
acts in training only and is not applied.
"""

# exports: ConvNextModel, ConvNextForImageClassification

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Self

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names

from ._attention_parts import projection_keys, split_key, unwrapped
from ._axis_layouts import mlp_out
from ._base import PretrainedConfig, PretrainedModel, config_error, register_architecture
from ._config_values import Value, num_labels, read_config
from ._hf_activations import get_activation, hf_activation
from ._vit import _pair

__all__ = ["ConvNextModel", "ConvNextForImageClassification"]

# The values these classes read, with `transformers.ConvNextConfig`'s defaults (image_size and
# the backbone's out_features are not read by these classes).
_VALUES: dict[str, Value] = {
    "num_channels": Value(3, "size"),
    "patch_size": Value(4),  # checked by `_pair`
    "num_stages": Value(4, "size"),
    "hidden_sizes": Value((96, 192, 384, 768)),  # checked by `_sizes`
    "depths": Value((3, 3, 9, 3)),
    "hidden_act": Value("gelu"),
    "layer_norm_eps": Value(1e-12, "positive"),
    "layer_scale_init_value": Value(1e-6),  # a number; > 0 adds the layer scale
    "drop_path_rate": Value(0.0, "prob"),
}
_INNER_EPS = 1e-6  # the stem's, the downsampling layers' and each layer's LayerNorm


def _sizes(cls_name: str, c: dict[str, Any], key: str) -> tuple[int, ...]:
    value = c[key]
    if not (
        isinstance(value, list | tuple)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    ):
        raise config_error(cls_name, key, value, "a non-empty list of positive integers")
    return tuple(value)


def _read(cls_name: str, config: PretrainedConfig) -> dict[str, Any]:
    """The config values ConvNeXt reads, checked; refused values raise `CheckpointError`."""
    c = read_config(cls_name, config, _VALUES)
    c["depths"] = _sizes(cls_name, c, "depths")
    c["hidden_sizes"] = _sizes(cls_name, c, "hidden_sizes")
    stages = c["num_stages"]
    if not len(c["depths"]) == len(c["hidden_sizes"]) == stages:
        # transformers builds num_stages stages but sizes its last norm by hidden_sizes[-1].
        raise config_error(
            cls_name,
            "num_stages",
            stages,
            f"the length of depths {list(c['depths'])} and of hidden_sizes "
            f"{list(c['hidden_sizes'])}",
        )
    scale = c["layer_scale_init_value"]
    if isinstance(scale, bool) or not isinstance(scale, int | float):
        raise config_error(cls_name, "layer_scale_init_value", scale, "a number")
    c["patch_size"] = _pair(cls_name, config, "patch_size", 4)
    hf_activation(cls_name, "hidden_act", c["hidden_act"])
    return c


def _channels_first_norm(norm: nn.LayerNorm, x: Array) -> Array:
    """`norm` over the channel axis of `(batch, channels, height, width)`."""
    return jnp.moveaxis(norm(jnp.moveaxis(x, 1, -1)), -1, 1)


class ConvNextEmbeddings(Module):
    """The stem: a patchifying convolution and a channels-first LayerNorm."""

    patch_embeddings: nn.Conv2d
    layernorm: nn.LayerNorm

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, channels, h, w)` to `(batch, hidden_sizes[0], h / patch, w / patch)`
        (`key`: the convolution's, for LoRA dropout)."""
        return _channels_first_norm(self.layernorm, self.patch_embeddings(x, key=key))


@axis_names({**mlp_out("pwconv2"), "layer_scale_parameter": ("norm",)})
class ConvNextLayer(Module):
    """Depthwise 7x7 convolution, LayerNorm, pointwise MLP, layer scale, residual."""

    dwconv: nn.Conv2d
    layernorm: nn.LayerNorm
    pwconv1: nn.Linear
    pwconv2: nn.Linear
    layer_scale_parameter: Array | None
    act: str = field(static=True)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, dim, h, w)` to the same shape (`key`: the projections', for LoRA dropout;
        the depthwise `dwconv` has groups, which LoRA does not adapt)."""
        k1, k2 = projection_keys(key, 2)
        h = jnp.moveaxis(self.dwconv(x), 1, -1)
        h = get_activation(self.act)(self.pwconv1(self.layernorm(h), key=k1))
        h = self.pwconv2(h, key=k2)
        if self.layer_scale_parameter is not None:
            h = h * self.layer_scale_parameter.astype(h.dtype).reshape(1, 1, 1, -1)
        return x + jnp.moveaxis(h, -1, 1)


class ConvNextStage(Module):
    """A stage: the downsampling layer (a channels-first norm and a stride-2 2x2 convolution,
    none in the first stage), then its layers."""

    downsampling_layer: tuple[nn.LayerNorm, nn.Conv2d] | tuple[()]
    layers: nn.Stack

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The stage's output (`key`: split for the projections, for LoRA dropout)."""
        k_conv, k_layers = split_key(key, 2)
        if self.downsampling_layer:
            norm, conv = self.downsampling_layer
            x = conv(_channels_first_norm(norm, x), key=k_conv)
        out: Array = self.layers(x, key=k_layers)
        return out


class ConvNextEncoder(Module):
    """The stages (`encoder.stages.{i}`)."""

    stages: tuple[ConvNextStage, ...]

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The last feature map (`key`: split for the projections, for LoRA dropout)."""
        for stage, k in zip(self.stages, split_key(key, len(self.stages)), strict=True):
            x = stage(x, key=k)
        return x


def _layer(c: dict[str, Any], dim: int, dtype: Any, key: PRNGKeyArray) -> ConvNextLayer:
    ks = jax.random.split(key, 3)
    scale = None
    if c["layer_scale_init_value"] > 0:
        scale = jnp.full((dim,), c["layer_scale_init_value"], dtype or jnp.float32)
    return ConvNextLayer(
        dwconv=nn.Conv2d(dim, dim, 7, padding=3, groups=dim, dtype=dtype, key=ks[0]),
        layernorm=nn.LayerNorm(dim, eps=_INNER_EPS, dtype=dtype),
        pwconv1=nn.Linear(dim, 4 * dim, dtype=dtype, key=ks[1]),
        pwconv2=nn.Linear(4 * dim, dim, dtype=dtype, key=ks[2]),
        layer_scale_parameter=scale,
        act=c["hidden_act"],
    )


def _build(c: dict[str, Any], key: PRNGKeyArray, dtype: Any) -> dict[str, Any]:
    sizes = c["hidden_sizes"]
    k_stem, *k_stages = jax.random.split(key, 1 + len(sizes))
    embeddings = ConvNextEmbeddings(
        nn.Conv2d(
            c["num_channels"],
            sizes[0],
            kernel_size=c["patch_size"],
            stride=c["patch_size"],
            dtype=dtype,
            key=k_stem,
        ),
        nn.LayerNorm(sizes[0], eps=_INNER_EPS, dtype=dtype),
    )
    stages = []
    previous = sizes[0]
    for i, (depth, dim) in enumerate(zip(c["depths"], sizes, strict=True)):
        k_down, k_layers = jax.random.split(k_stages[i])
        down: tuple[nn.LayerNorm, nn.Conv2d] | tuple[()] = ()
        if i > 0:  # stride 2 (transformers downsamples whenever the stride is above 1)
            down = (
                nn.LayerNorm(previous, eps=_INNER_EPS, dtype=dtype),
                nn.Conv2d(previous, dim, 2, stride=2, dtype=dtype, key=k_down),
            )
        layers = nn.Stack(functools.partial(_layer, c, dim, dtype), depth, key=k_layers)
        stages.append(ConvNextStage(down, layers))
        previous = dim
    layernorm = nn.LayerNorm(sizes[-1], eps=c["layer_norm_eps"], dtype=dtype)
    return {
        "embeddings": embeddings,
        "encoder": ConvNextEncoder(tuple(stages)),
        "layernorm": layernorm,
    }


@register_architecture
class ConvNextModel(PretrainedModel):
    """ConvNeXt's backbone (`transformers.ConvNextModel`): returns `last_hidden_state`.

    Call it with `pixel_values` `(batch, num_channels, height, width)` of any size; the result
    is the last stage's map `(batch, hidden_sizes[-1], h', w')`. `pooler_output` gives
    `transformers`' `pooler_output` (the map's mean, normalised).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.convnext import ConvNextModel
        >>> config = {"hidden_sizes": [8, 16], "depths": [1, 1], "num_stages": 2}
        >>> model = ConvNextModel.from_config(config, key=jax.random.key(0))
        >>> model(pixel_values=jnp.ones((1, 3, 32, 32))).shape
        (1, 16, 4, 4)
        >>> model.pooler_output(pixel_values=jnp.ones((1, 3, 32, 32))).shape
        (1, 16)
    """

    architecture = "ConvNextModel"
    model_type = "convnext"
    base_model_prefix = "convnext"

    embeddings: ConvNextEmbeddings
    encoder: ConvNextEncoder
    layernorm: nn.LayerNorm

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights from a `ConvNextConfig` dict.

        Arguments:
            config: the config; keys it lacks take `ConvNextConfig`'s defaults.
            key: the PRNG key.
            dtype: the parameters' dtype (default float32).

        Returns:
            The model, in inference mode.
        """
        config = PretrainedConfig(config)
        return cls(config=config, **_build(_read(cls.__name__, config), key, dtype))

    def __call__(self, *, pixel_values: Any, key: PRNGKeyArray | None = None) -> Array:
        """`last_hidden_state` `(batch, hidden_sizes[-1], h', w')`.

        Arguments:
            pixel_values: `(batch, num_channels, height, width)`, cast to the parameters' dtype.
            key: the projections' dropout keys are split from it (LoRA dropout in training
                mode; ConvNeXt has no dropout of its own).

        Returns:
            `last_hidden_state`.
        """
        conv = unwrapped(self.embeddings.patch_embeddings)
        x = jnp.asarray(pixel_values).astype(conv.weight.dtype)
        if x.ndim != 4 or x.shape[1] != conv.in_channels:
            raise ValueError(
                f"{type(self).__name__}: pixel_values has shape {x.shape}; expected (batch, "
                f"{conv.in_channels}, height, width), with the config's num_channels."
            )
        k_embed, k_encoder = split_key(key, 2)
        return self.encoder(self.embeddings(x, key=k_embed), key=k_encoder)

    def pooler_output(self, *, pixel_values: Any, key: PRNGKeyArray | None = None) -> Array:
        """`transformers`' `pooler_output` `(batch, hidden_sizes[-1])`: the final LayerNorm of
        the last map's spatial mean (`key` as `__call__`'s)."""
        return self.layernorm(self(pixel_values=pixel_values, key=key).mean(axis=(-2, -1)))


@register_architecture
class ConvNextForImageClassification(PretrainedModel):
    """ConvNeXt with a linear classifier on the pooled features
    (`transformers.ConvNextForImageClassification`): `logits` `(batch, num_labels)`.

    With `num_labels` 0 the classifier is the identity, as in `transformers`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.convnext import ConvNextForImageClassification
        >>> config = {"hidden_sizes": [8, 16], "depths": [1, 1], "num_stages": 2,
        ...           "num_labels": 10}
        >>> model = ConvNextForImageClassification.from_config(config, key=jax.random.key(0))
        >>> model(pixel_values=jnp.ones((2, 3, 32, 32))).shape
        (2, 10)
    """

    architecture = "ConvNextForImageClassification"
    model_type = "convnext"
    base_model_prefix = "convnext"

    convnext: ConvNextModel
    classifier: nn.Linear | nn.Identity

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights from a `ConvNextConfig` dict (see
        `ConvNextModel`)."""
        config = PretrainedConfig(config)
        labels = num_labels(cls.__name__, config)
        c = _read(cls.__name__, config)
        k_model, k_cls = jax.random.split(key)
        convnext = ConvNextModel(config=config, **_build(c, k_model, dtype))
        classifier: nn.Linear | nn.Identity = nn.Identity()
        if labels > 0:
            classifier = nn.Linear(c["hidden_sizes"][-1], labels, dtype=dtype, key=k_cls)
        return cls(config=config, convnext=convnext, classifier=classifier)

    def __call__(self, *, pixel_values: Any, key: PRNGKeyArray | None = None) -> Array:
        """The `logits` `(batch, num_labels)`; arguments as `ConvNextModel`'s."""
        k_body, k_classifier = split_key(key, 2)
        pooled = self.convnext.pooler_output(pixel_values=pixel_values, key=k_body)
        out: Array = self.classifier(pooled, key=k_classifier)
        return out
