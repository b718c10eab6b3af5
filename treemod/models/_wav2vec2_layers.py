"""wav2vec2's parts: the convolutional feature encoder, the feature projection, the positional
convolution (weight-normed), the encoder layers (post-norm, or pre-norm with
`do_stable_layer_norm`).

Attribute names are `transformers`' module names (`feature_extractor.conv_layers.{i}.conv`,
`encoder.pos_conv_embed.conv.parametrizations.weight.original0`, `encoder.layers.{i}`, ...), so
`tm.state_dict` names each array as `transformers`' `state_dict()` does. The feature encoder's
layers differ in shape, so they are a tuple; the encoder layers are one `nn.Stack`.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array, lax
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names

from ._attention_parts import attend, projection_keys, split_key
from ._axis_layouts import attention_in, attention_out, mlp_out
from ._hf_activations import get_activation

__all__ = [
    "ChannelNorm",
    "Wav2Vec2ConvLayer",
    "Wav2Vec2EncoderLayer",
    "Wav2Vec2FeatureProjection",
    "Wav2Vec2PositionalConvEmbedding",
    "conv_lengths",
]


def conv_lengths(lengths: Array, kernels: tuple[int, ...], strides: tuple[int, ...]) -> Array:
    """The feature encoder's output lengths of inputs of `lengths` samples
    (`_get_feat_extract_output_lengths`: `(length - kernel) // stride + 1` per layer)."""
    for kernel, stride in zip(kernels, strides, strict=True):
        lengths = (lengths - kernel) // stride + 1
    return lengths


@axis_names({"weight": ("norm",), "bias": ("norm",)})
class ChannelNorm(Module):
    """`nn.GroupNorm` with one group per channel on `(batch, channels, time)`: each channel
    normalised over time, then scaled and shifted (PyTorch's eps 1e-5)."""

    weight: Array
    bias: Array
    eps: float = field(static=True, default=1e-5)

    def __call__(self, x: Array) -> Array:
        """`(batch, channels, time)` to the same shape."""
        mean = x.mean(-1, keepdims=True)
        var = jnp.square(x - mean).mean(-1, keepdims=True)
        y = (x - mean) * lax.rsqrt(var + jnp.asarray(self.eps, x.dtype))
        return y * self.weight[None, :, None].astype(x.dtype) + self.bias[None, :, None].astype(
            x.dtype
        )


class Wav2Vec2ConvLayer(Module):
    """One feature-encoder layer: a strided convolution, a norm (group norm on the first layer
    with `feat_extract_norm: "group"`, layer norm on every layer with `"layer"`), activation."""

    conv: nn.Conv1d
    layer_norm: ChannelNorm | nn.LayerNorm | None
    act: str = field(static=True)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, in_channels, time)` to `(batch, out_channels, new_time)` (`key`: `conv`'s,
        for LoRA dropout)."""
        x = self.conv(x, key=key)
        if isinstance(self.layer_norm, nn.LayerNorm):
            x = jnp.swapaxes(self.layer_norm(jnp.swapaxes(x, 1, 2)), 1, 2)
        elif self.layer_norm is not None:
            x = self.layer_norm(x)
        return get_activation(self.act)(x)


class Wav2Vec2FeatureProjection(Module):
    """LayerNorm over the last convolution's channels, then the projection to `hidden_size`."""

    layer_norm: nn.LayerNorm
    projection: nn.Linear
    dropout: nn.Dropout

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, time, conv_dim[-1])` to `(batch, time, hidden)`."""
        (k_projection,) = projection_keys(key, 1)
        return self.dropout(self.projection(self.layer_norm(x), key=k_projection), key=key)


class WeightNormOriginals(Module):
    """`parametrizations.weight`: the magnitude `original0` `(1, 1, kernel)` and the direction
    `original1` `(out, in / groups, kernel)` of PyTorch's `weight_norm(dim=2)`."""

    original0: Array
    original1: Array


class WeightNormParametrizations(Module):
    """`parametrizations` of a weight-normed module (PyTorch's names)."""

    weight: WeightNormOriginals


class WeightNormConv1d(Module):
    """A grouped 1-d convolution whose weight is `g * v / |v|`, the norm over all axes but the
    kernel's (PyTorch's `weight_norm(conv, dim=2)`); same padding `kernel // 2`."""

    parametrizations: WeightNormParametrizations
    bias: Array
    groups: int = field(static=True)

    def weight(self) -> Array:
        """The convolution's weight `(out, in / groups, kernel)`."""
        g = self.parametrizations.weight.original0
        v = self.parametrizations.weight.original1
        norm = jnp.sqrt(jnp.sum(jnp.square(v), axis=(0, 1), keepdims=True))
        return v * (g / norm)

    def __call__(self, x: Array) -> Array:
        """`(batch, channels, time)` to `(batch, channels, time + 1 - kernel % 2)`."""
        w = self.weight().astype(x.dtype)
        pad = w.shape[-1] // 2
        y = lax.conv_general_dilated(
            x,
            w,
            window_strides=(1,),
            padding=[(pad, pad)],
            dimension_numbers=("NCH", "OIH", "NCH"),
            feature_group_count=self.groups,
            precision=lax.Precision.HIGHEST,
        )
        return y + self.bias[None, :, None].astype(y.dtype)


class Wav2Vec2PositionalConvEmbedding(Module):
    """The positions: a wide grouped convolution over time, trimmed to the input's length
    (an even kernel's one extra step), then the activation."""

    conv: WeightNormConv1d
    act: str = field(static=True)

    def __call__(self, x: Array) -> Array:
        """`(batch, time, hidden)` to the same shape."""
        y = self.conv(jnp.swapaxes(x, 1, 2))[:, :, : x.shape[1]]
        return jnp.swapaxes(get_activation(self.act)(y), 1, 2)


@axis_names({**attention_in("q_proj", "k_proj", "v_proj"), **attention_out("out_proj")})
class Wav2Vec2Attention(Module):
    """Multi-head self-attention with biased projections."""

    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear
    out_proj: nn.Linear
    dropout: nn.Dropout
    num_heads: int = field(static=True)

    def __call__(self, x: Array, mask: Array | None, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, time, hidden)` to the same shape."""
        b, t, _ = x.shape
        *keys, k_out = projection_keys(key, 4)
        q, k, v = (
            p(x, key=pk).reshape(b, t, self.num_heads, -1)
            for p, pk in zip((self.q_proj, self.k_proj, self.v_proj), keys, strict=True)
        )
        scale = q.shape[-1] ** -0.5
        out = attend(q, k, v, mask, scale=scale, dropout=self.dropout, key=key, scores="input")
        return self.out_proj(out.reshape(b, t, -1), key=k_out)


@axis_names(mlp_out("output_dense"))
class Wav2Vec2FeedForward(Module):
    """`output_dense(act(intermediate_dense(x)))` with their dropouts."""

    intermediate_dense: nn.Linear
    intermediate_dropout: nn.Dropout
    output_dense: nn.Linear
    output_dropout: nn.Dropout
    act: str = field(static=True)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, time, hidden)` to the same shape."""
        k1, k2 = split_key(key, 2)
        k_in, k_out = projection_keys(key, 2)
        h = get_activation(self.act)(self.intermediate_dense(x, key=k_in))
        h = self.intermediate_dropout(h, key=k1)
        return self.output_dropout(self.output_dense(h, key=k_out), key=k2)


class Wav2Vec2EncoderLayer(Module):
    """Post-norm (`x = layer_norm(x + attention(x))`, `final_layer_norm(x + ff(x))`), or with
    `stable` pre-norm (`x + attention(layer_norm(x))`, `x + ff(final_layer_norm(x))`)."""

    attention: Wav2Vec2Attention
    dropout: nn.Dropout
    layer_norm: nn.LayerNorm
    feed_forward: Wav2Vec2FeedForward
    final_layer_norm: nn.LayerNorm
    stable: bool = field(static=True)

    def __call__(self, x: Array, mask: Array | None, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, time, hidden)` to the same shape."""
        k1, k2, k3 = split_key(key, 3)
        if self.stable:
            x = x + self.dropout(self.attention(self.layer_norm(x), mask, key=k1), key=k2)
            return x + self.feed_forward(self.final_layer_norm(x), key=k3)
        x = self.layer_norm(x + self.dropout(self.attention(x, mask, key=k1), key=k2))
        return self.final_layer_norm(x + self.feed_forward(x, key=k3))
