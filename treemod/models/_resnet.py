"""ResNet as `transformers` builds it: `ResNetModel`, `ResNetForImageClassification`.

Basic and bottleneck layers, any `depths` and `hidden_sizes`, `downsample_in_first_stage`,
`downsample_in_bottleneck`, `hidden_act`. BatchNorm's running statistics are `State`, loaded
from `running_mean`/`running_var`. Models are built in inference mode (BatchNorm normalises
with its running statistics, as `transformers`' models do after `eval()`); training mode
(`tm.nn.inference_mode(model, False)`) runs under `tm.stateful`.
"""

# exports: ResNetModel, ResNetForImageClassification

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module, field

from ._attention_parts import projection_keys, split_key, unwrapped
from ._base import PretrainedConfig, PretrainedModel, config_error, register_architecture
from ._config_values import Value, num_labels, read_config
from ._hf_activations import get_activation, hf_activation

__all__ = ["ResNetModel", "ResNetForImageClassification"]

# The values these classes read, with `transformers.ResNetConfig`'s defaults.
_VALUES: dict[str, Value] = {
    "num_channels": Value(3, "size"),
    "embedding_size": Value(64, "size"),
    "hidden_sizes": Value((256, 512, 1024, 2048)),  # checked by `_sizes`
    "depths": Value((3, 4, 6, 3)),
    "layer_type": Value("bottleneck"),
    "hidden_act": Value("relu"),
    "downsample_in_first_stage": Value(False, "bool"),
    "downsample_in_bottleneck": Value(False, "bool"),
}


def _sizes(cls_name: str, config: PretrainedConfig, key: str) -> tuple[int, ...]:
    value = config.get(key, _VALUES[key].default)
    if not (
        isinstance(value, tuple)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    ):
        raise config_error(cls_name, key, value, "a non-empty list of positive integers")
    return value


def _read(cls_name: str, config: PretrainedConfig) -> dict[str, Any]:
    """The config values ResNet reads, checked; refused values raise `CheckpointError`."""

    c = read_config(cls_name, config, _VALUES)
    c["depths"] = _sizes(cls_name, config, "depths")
    c["hidden_sizes"] = _sizes(cls_name, config, "hidden_sizes")
    if len(c["depths"]) != len(c["hidden_sizes"]):
        # transformers builds min(len) stages but sizes its classifier by hidden_sizes[-1].
        raise config_error(
            cls_name,
            "depths",
            list(c["depths"]),
            f"one depth per stage of hidden_sizes={list(c['hidden_sizes'])}",
        )
    if c["layer_type"] not in ("basic", "bottleneck"):
        raise config_error(cls_name, "layer_type", c["layer_type"], "'basic', 'bottleneck'")
    if c["layer_type"] == "bottleneck" and min(c["hidden_sizes"]) < 4:
        raise config_error(
            cls_name,
            "hidden_sizes",
            list(c["hidden_sizes"]),
            "sizes of at least 4 for bottleneck layers (they reduce the channels 4 times)",
        )
    hf_activation(cls_name, "hidden_act", c["hidden_act"])
    return c


class ResNetConvLayer(Module):
    """Convolution (no bias, padding `kernel // 2`), BatchNorm, then an activation or none."""

    convolution: nn.Conv2d
    normalization: nn.BatchNorm
    act: str | None = field(static=True)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, in, h, w)` to `(batch, out, h', w')` (`key`: the convolution's, for LoRA
        dropout)."""
        x = self.normalization(self.convolution(x, key=key))
        return x if self.act is None else get_activation(self.act)(x)


class ResNetShortCut(Module):
    """The residual's projection: a 1x1 convolution (strided to downsample) and BatchNorm."""

    convolution: nn.Conv2d
    normalization: nn.BatchNorm

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The projected residual (`key`: the convolution's, for LoRA dropout)."""
        return self.normalization(self.convolution(x, key=key))


class ResNetResidualLayer(Module):
    """A basic (two 3x3) or bottleneck (1x1, 3x3, 1x1) layer with its shortcut.

    `transformers` calls these `ResNetBasicLayer` and `ResNetBottleNeckLayer`; their tensors
    have the same names (`shortcut.*`, `layer.{i}.*`), so one class serves both.
    """

    shortcut: ResNetShortCut | nn.Identity
    layer: tuple[ResNetConvLayer, ...]
    act: str = field(static=True)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The layer's output (`key`: the convolutions', for LoRA dropout)."""
        *keys, k_shortcut = projection_keys(key, len(self.layer) + 1)
        h = x
        for conv, k in zip(self.layer, keys, strict=True):
            h = conv(h, key=k)
        return get_activation(self.act)(h + self.shortcut(x, key=k_shortcut))


class ResNetStage(Module):
    """One stage: its layers, the first of which may downsample and widen."""

    layers: tuple[ResNetResidualLayer, ...]

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The stage's output (`key`: split for the convolutions, for LoRA dropout)."""
        for layer, k in zip(self.layers, split_key(key, len(self.layers)), strict=True):
            x = layer(x, key=k)
        return x


class ResNetEmbeddings(Module):
    """The stem: a 7x7 stride-2 convolution layer, then 3x3 stride-2 max pooling."""

    embedder: ResNetConvLayer
    pooler: nn.MaxPool2d

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, channels, h, w)` to `(batch, embedding_size, h / 4, w / 4)` (`key`: the
        convolution's, for LoRA dropout)."""
        return self.pooler(self.embedder(x, key=key))


class ResNetEncoder(Module):
    """The stages (`encoder.stages.{i}`)."""

    stages: tuple[ResNetStage, ...]

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The final feature map (`key`: split for the convolutions, for LoRA dropout)."""
        for stage, k in zip(self.stages, split_key(key, len(self.stages)), strict=True):
            x = stage(x, key=k)
        return x


def _conv_layer(
    n_in: int, n_out: int, kernel: int, stride: int, act: str | None, dtype: Any, key: PRNGKeyArray
) -> ResNetConvLayer:
    conv = nn.Conv2d(
        n_in, n_out, kernel, stride, padding=kernel // 2, use_bias=False, dtype=dtype, key=key
    )
    return ResNetConvLayer(conv, nn.BatchNorm(n_out, inference=True, dtype=dtype), act)


def _residual(
    c: dict[str, Any], n_in: int, n_out: int, stride: int, dtype: Any, key: PRNGKeyArray
) -> ResNetResidualLayer:
    ks = jax.random.split(key, 4)
    shortcut: ResNetShortCut | nn.Identity = nn.Identity()
    if n_in != n_out or stride != 1:
        conv = nn.Conv2d(n_in, n_out, 1, stride, use_bias=False, dtype=dtype, key=ks[0])
        shortcut = ResNetShortCut(conv, nn.BatchNorm(n_out, inference=True, dtype=dtype))
    # The inner layers use ReLU whatever hidden_act says (transformers' default argument).
    layer: tuple[ResNetConvLayer, ...]
    if c["layer_type"] == "basic":
        layer = (
            _conv_layer(n_in, n_out, 3, stride, "relu", dtype, ks[1]),
            _conv_layer(n_out, n_out, 3, 1, None, dtype, ks[2]),
        )
    else:
        mid = n_out // 4
        first, second = (stride, 1) if c["downsample_in_bottleneck"] else (1, stride)
        layer = (
            _conv_layer(n_in, mid, 1, first, "relu", dtype, ks[1]),
            _conv_layer(mid, mid, 3, second, "relu", dtype, ks[2]),
            _conv_layer(mid, n_out, 1, 1, None, dtype, ks[3]),
        )
    return ResNetResidualLayer(shortcut, layer, c["hidden_act"])


def _build(c: dict[str, Any], dtype: Any, key: PRNGKeyArray) -> tuple[Any, ...]:
    k_stem, k_stages = jax.random.split(key)
    embedder = ResNetEmbeddings(
        _conv_layer(c["num_channels"], c["embedding_size"], 7, 2, c["hidden_act"], dtype, k_stem),
        nn.MaxPool2d(3, 2, 1),
    )
    stages = []
    n_in = c["embedding_size"]
    first_stride = 2 if c["downsample_in_first_stage"] else 1
    stage_keys = jax.random.split(k_stages, len(c["depths"]))
    for i, (depth, n_out) in enumerate(zip(c["depths"], c["hidden_sizes"], strict=True)):
        ks = jax.random.split(stage_keys[i], depth)
        stride = first_stride if i == 0 else 2
        layers = [_residual(c, n_in, n_out, stride, dtype, ks[0])]
        layers += [_residual(c, n_out, n_out, 1, dtype, k) for k in ks[1:]]
        stages.append(ResNetStage(tuple(layers)))
        n_in = n_out
    return embedder, ResNetEncoder(tuple(stages))


def _check_pixels(name: str, model: ResNetModel, pixel_values: Any) -> Array:
    weight = unwrapped(model.embedder.embedder.convolution).weight
    x = jnp.asarray(pixel_values).astype(weight.dtype)
    channels = weight.shape[1]
    if x.ndim != 4 or x.shape[1] != channels:
        raise ValueError(
            f"{name}: pixel_values has shape {x.shape}; expected (batch, {channels}, height, "
            "width), with the config's num_channels."
        )
    return x


@register_architecture
class ResNetModel(PretrainedModel):
    """ResNet's backbone (`transformers.ResNetModel`): returns `last_hidden_state`.

    `last_hidden_state` is the final feature map `(batch, hidden_sizes[-1], h, w)`, as
    `transformers` returns it (before the average pooling).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models import ResNetModel
        >>> config = {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1],
        ...           "layer_type": "basic"}
        >>> model = ResNetModel.from_config(config, key=jax.random.key(0))
        >>> model(pixel_values=jnp.ones((2, 3, 32, 32))).shape
        (2, 16, 4, 4)
    """

    architecture = "ResNetModel"
    model_type = "resnet"
    base_model_prefix = "resnet"

    embedder: ResNetEmbeddings
    encoder: ResNetEncoder

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | PretrainedConfig,
        *,
        key: PRNGKeyArray,
        dtype: Any = None,
    ) -> Self:
        """Build the model with random weights from a `ResNetConfig` dict.

        Arguments:
            config: the config; keys it lacks take `ResNetConfig`'s defaults.
            key: the PRNG key.
            dtype: the parameters' and running statistics' dtype (default float32).

        Returns:
            The model, in inference mode.
        """
        config = PretrainedConfig(config)
        embedder, encoder = _build(_read(cls.__name__, config), dtype, key)
        return cls(config=config, embedder=embedder, encoder=encoder)

    def __call__(self, *, pixel_values: Any, key: PRNGKeyArray | None = None) -> Array:
        """`last_hidden_state`, the final feature map.

        Arguments:
            pixel_values: `(batch, num_channels, height, width)`, cast to the parameters' dtype.
            key: the convolutions' dropout keys are split from it (LoRA dropout in training
                mode; ResNet has no dropout of its own).

        Returns:
            `(batch, hidden_sizes[-1], height', width')`.
        """
        x = _check_pixels(type(self).__name__, self, pixel_values)
        k_embed, k_encoder = split_key(key, 2)
        return self.encoder(self.embedder(x, key=k_embed), key=k_encoder)


@register_architecture
class ResNetForImageClassification(PretrainedModel):
    """ResNet with a linear classifier (`transformers.ResNetForImageClassification`): `logits`.

    The classifier is `classifier.1` (`transformers` puts a `Flatten` at index 0) on the
    feature map's spatial mean; with `num_labels` 0 it is the identity.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models import ResNetForImageClassification
        >>> config = {"embedding_size": 8, "hidden_sizes": [16, 32], "depths": [1, 1],
        ...           "num_labels": 10}
        >>> model = ResNetForImageClassification.from_config(config, key=jax.random.key(0))
        >>> model(pixel_values=jnp.ones((2, 3, 32, 32))).shape
        (2, 10)
    """

    architecture = "ResNetForImageClassification"
    model_type = "resnet"
    base_model_prefix = "resnet"

    resnet: ResNetModel
    classifier: tuple[nn.Identity, nn.Linear | nn.Identity]

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | PretrainedConfig,
        *,
        key: PRNGKeyArray,
        dtype: Any = None,
    ) -> Self:
        """Build the model with random weights from a `ResNetConfig` dict (see `ResNetModel`)."""
        config = PretrainedConfig(config)
        c = _read(cls.__name__, config)
        labels = num_labels(cls.__name__, config)
        k_resnet, k_fc = jax.random.split(key)
        embedder, encoder = _build(c, dtype, k_resnet)
        resnet = ResNetModel(config=config, embedder=embedder, encoder=encoder)
        head: nn.Linear | nn.Identity = nn.Identity()
        if labels > 0:
            head = nn.Linear(c["hidden_sizes"][-1], labels, dtype=dtype, key=k_fc)
        return cls(config=config, resnet=resnet, classifier=(nn.Identity(), head))

    def __call__(self, *, pixel_values: Any, key: PRNGKeyArray | None = None) -> Array:
        """The `logits` `(batch, num_labels)`; arguments as `ResNetModel`'s."""
        k_body, k_classifier = split_key(key, 2)
        features = self.resnet(pixel_values=pixel_values, key=k_body)
        pooled = jnp.mean(features, axis=(2, 3))
        out: Array = self.classifier[1](pooled, key=k_classifier)
        return out
