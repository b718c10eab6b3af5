"""Normalisation layers: `LayerNorm`, `GroupNorm`, `RMSNorm`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Num, PRNGKeyArray

from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names

from ._batching import Core, batch_apply
from ._layout import apply_image_layer, per_channel
from ._utils import (
    check_number,
    check_size,
    compute_dtype,
    default_dtype,
    lead,
    promote_input,
)

_EPS_NOTE = " It is added to the variance before its square root (1e-5 is usual)."

__all__ = ["LayerNorm", "GroupNorm", "RMSNorm"]


def _shape(owner: str, shape: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(shape, str) or not hasattr(shape, "__iter__"):
        return (check_size(owner, "shape", shape),)
    return tuple(check_size(owner, f"shape[{i}]", d) for i, d in enumerate(shape))


def _scale_shift(y: Array, weight: Array | None, bias: Array | None) -> Array:
    """`y * weight + bias` with both broadcast over `y`'s leading axes, each skipped if `None`."""
    if weight is not None:
        y = y * lead(weight.astype(y.dtype), y.ndim)
    if bias is not None:
        y = y + lead(bias.astype(y.dtype), y.ndim)
    return y


@axis_names({"weight": ("norm",), "bias": ("norm",)})
class LayerNorm(Module):
    """Layer normalisation over the trailing `shape` dimensions (PyTorch's `nn.LayerNorm`).

    Normalises each example with the mean and biased variance of its last `len(shape)`
    dimensions, then applies an elementwise weight (init 1) and bias (init 0). Statistics are
    computed in float32 at least. No key: nothing is random.

    Arguments:
        shape: the normalised trailing shape (an int or a tuple).
        eps: added to the variance (a positive number).
        use_weight: learn an elementwise scale.
        use_bias: learn an elementwise shift.
        dtype: parameter dtype.
        elementwise_affine: deprecated alias setting both `use_weight` and `use_bias`.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> ln = nn.LayerNorm(4)
        >>> y = ln(jnp.arange(8.0).reshape(2, 4))
        >>> jnp.round(y.mean(-1), 5)
        Array([0., 0.], dtype=float32)
    """

    weight: Float[Array, "*shape"] | None
    bias: Float[Array, "*shape"] | None
    shape: tuple[int, ...] = field(static=True)
    eps: float = field(static=True)
    use_weight: bool = field(static=True)
    use_bias: bool = field(static=True)

    def __init__(
        self,
        shape: int | Sequence[int],
        eps: float = 1e-5,
        use_weight: bool = True,
        use_bias: bool = True,
        dtype: Any = None,
        *,
        elementwise_affine: bool | None = None,
    ) -> None:
        if elementwise_affine is not None:
            use_weight = use_bias = elementwise_affine
        dtype = default_dtype("LayerNorm", dtype)
        self.shape = _shape("LayerNorm", shape)
        self.eps = check_number("LayerNorm", "eps", eps, 0, low_open=True, note=_EPS_NOTE)
        self.use_weight = use_weight
        self.use_bias = use_bias
        self.weight = jnp.ones(self.shape, dtype) if use_weight else None
        self.bias = jnp.zeros(self.shape, dtype) if use_bias else None

    def __call__(
        self, x: Num[Array, "*batch_and_shape"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "*batch_and_shape"]:
        """Normalise `x` of shape `(*batch, *shape)`.

        Arguments:
            x: the input (integers are promoted to the parameters' dtype).
            key: ignored.

        Returns:
            An array of the shape and (promoted) dtype of `x`.
        """
        x = promote_input(x, None if self.weight is None else self.weight.dtype)
        core = tuple((f"shape[{i}]", s) for i, s in enumerate(self.shape))
        return batch_apply("LayerNorm", self._flat, [Core("x", x, core)])

    def _flat(self, x: Array) -> Array:
        axes = tuple(range(1, x.ndim))
        xf = x.astype(compute_dtype(x.dtype))
        mean = xf.mean(axes, keepdims=True)
        var = jnp.square(xf - mean).mean(axes, keepdims=True)
        y = (xf - mean) * lax.rsqrt(var + self.eps)
        return _scale_shift(y, self.weight, self.bias).astype(x.dtype)


@axis_names({"weight": ("norm",), "bias": ("norm",)})
class RMSNorm(Module):
    """Root-mean-square normalisation over the trailing `shape` dimensions.

    `y = x / sqrt(mean(x**2) + eps) * weight + bias` (PyTorch's `nn.RMSNorm` has no bias;
    Equinox's has one, on by default). Statistics in float32 at least. No key.

    Arguments:
        shape: the normalised trailing shape.
        eps: added to the mean square (a positive number).
        use_weight: learn an elementwise scale (init 1).
        use_bias: learn an elementwise shift (init 0).
        dtype: parameter dtype.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> y = nn.RMSNorm(2, use_bias=False)(jnp.array([3.0, 4.0]))
        >>> tuple(round(v, 3) for v in y.tolist())
        (0.849, 1.131)
    """

    weight: Float[Array, "*shape"] | None
    bias: Float[Array, "*shape"] | None
    shape: tuple[int, ...] = field(static=True)
    eps: float = field(static=True)
    use_weight: bool = field(static=True)
    use_bias: bool = field(static=True)

    def __init__(
        self,
        shape: int | Sequence[int],
        eps: float = 1e-5,
        use_weight: bool = True,
        use_bias: bool = True,
        dtype: Any = None,
    ) -> None:
        dtype = default_dtype("RMSNorm", dtype)
        self.shape = _shape("RMSNorm", shape)
        note = " It is added to the mean square before its square root (1e-5 is usual)."
        self.eps = check_number("RMSNorm", "eps", eps, 0, low_open=True, note=note)
        self.use_weight = use_weight
        self.use_bias = use_bias
        self.weight = jnp.ones(self.shape, dtype) if use_weight else None
        self.bias = jnp.zeros(self.shape, dtype) if use_bias else None

    def __call__(
        self, x: Num[Array, "*batch_and_shape"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "*batch_and_shape"]:
        """Normalise `x` of shape `(*batch, *shape)`.

        Arguments:
            x: the input (integers are promoted to the parameters' dtype).
            key: ignored.

        Returns:
            An array of the shape and (promoted) dtype of `x`.
        """
        x = promote_input(x, None if self.weight is None else self.weight.dtype)
        core = tuple((f"shape[{i}]", s) for i, s in enumerate(self.shape))
        return batch_apply("RMSNorm", self._flat, [Core("x", x, core)])

    def _flat(self, x: Array) -> Array:
        axes = tuple(range(1, x.ndim))
        xf = x.astype(compute_dtype(x.dtype))
        y = xf * lax.rsqrt(jnp.square(xf).mean(axes, keepdims=True) + self.eps)
        return _scale_shift(y, self.weight, self.bias).astype(x.dtype)


@axis_names({"weight": ("norm",), "bias": ("norm",)})
class GroupNorm(Module):
    """Group normalisation over channels-first input (PyTorch's `nn.GroupNorm`), or channels-last.

    Channels are split into `groups`; each group of each example is normalised with its own
    mean and biased variance, then a per-channel weight (init 1) and bias (init 0) apply.

    As in Equinox, by default the input is one example `(channels, *spatial)`. To accept
    leading batch dimensions `(*batch, channels, *spatial)` (PyTorch's layout, or more), give
    `spatial_ndim`, the number of spatial dimensions: without it the layer cannot tell batch
    dimensions from spatial ones (`(4, 4, 5)` is one example or a batch of 4). Without it, an
    input whose first axis is not `channels` is refused, with the `spatial_ndim` to pass. With
    `channels_last=True` the channels are the last axis, `(*spatial, channels)` or
    `(*batch, *spatial, channels)`.

    Arguments:
        groups: number of groups (divides `channels`).
        channels: number of channels (needed for the affine parameters).
        eps: added to the variance (a positive number).
        channelwise_affine: learn a per-channel weight and bias.
        dtype: parameter dtype.
        spatial_ndim: number of spatial dimensions; `None` means the input is a single
            unbatched example.
        channels_last: the channels are the last axis of `x` rather than the first after the
            batch.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> gn = nn.GroupNorm(2, 4, spatial_ndim=2)
        >>> gn(jnp.ones((8, 4, 5, 5))).shape
        (8, 4, 5, 5)
        >>> nn.GroupNorm(2, 4, spatial_ndim=2, channels_last=True)(jnp.ones((8, 5, 5, 4))).shape
        (8, 5, 5, 4)
    """

    weight: Float[Array, " channels"] | None
    bias: Float[Array, " channels"] | None
    groups: int = field(static=True)
    channels: int | None = field(static=True)
    eps: float = field(static=True)
    channelwise_affine: bool = field(static=True)
    spatial_ndim: int | None = field(static=True)
    channels_last: bool = field(static=True)

    def __init__(
        self,
        groups: int,
        channels: int | None = None,
        eps: float = 1e-5,
        channelwise_affine: bool = True,
        dtype: Any = None,
        *,
        spatial_ndim: int | None = None,
        channels_last: bool = False,
    ) -> None:
        check_size("GroupNorm", "groups", groups)
        if channels is not None:
            check_size("GroupNorm", "channels", channels)
        if spatial_ndim is not None:
            check_size("GroupNorm", "spatial_ndim", spatial_ndim, minimum=0)
        if channels is not None and channels % groups:
            raise ValueError(f"GroupNorm: groups={groups} must divide channels={channels}.")
        if channelwise_affine and channels is None:
            raise ValueError(
                "GroupNorm: channelwise_affine=True needs `channels` (the size of the weight)."
            )
        dtype = default_dtype("GroupNorm", dtype)
        self.groups = groups
        self.channels = channels
        self.eps = check_number("GroupNorm", "eps", eps, 0, low_open=True, note=_EPS_NOTE)
        self.channelwise_affine = channelwise_affine
        self.spatial_ndim = spatial_ndim
        self.channels_last = channels_last
        self.weight = jnp.ones((channels,), dtype) if channelwise_affine else None
        self.bias = jnp.zeros((channels,), dtype) if channelwise_affine else None

    def __call__(
        self, x: Num[Array, "..."], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "..."]:
        """Normalise `x` of shape `(channels, *spatial)`, or `(*batch, channels, *spatial)`.

        Arguments:
            x: the input (leading batch dimensions need `spatial_ndim`); channels last if
                `channels_last`.
            key: ignored.

        Returns:
            An array of the shape and dtype of `x`.
        """
        x = promote_input(x, None if self.weight is None else self.weight.dtype)
        if self.spatial_ndim is not None:
            return apply_image_layer(
                self, self._flat, x, "channels", self.channels, self.spatial_ndim
            )
        try:  # one example (channels, *spatial): its first axis must be the channels
            return apply_image_layer(
                self, self._flat, x, "channels", self.channels, max(x.ndim - 1, 0)
            )
        except ValueError as e:
            if self.channels_last or self.channels is None or x.ndim < 2:
                raise
            raise ValueError(self._unbatched_error(x.shape)) from e

    def _unbatched_error(self, shape: tuple[int, ...]) -> str:
        """The error for a channels-first input read as one example whose channels do not fit:
        usually a batch given without `spatial_ndim`."""
        c = self.channels
        guess = next((len(shape) - 1 - i for i, d in enumerate(shape) if d == c), None)
        read = f"one {len(shape) - 1}-d example with {shape[0]} channels"
        how = f"no axis of {shape} has the {c} channels"
        if guess is not None:
            k = len(shape) - 1 - guess
            how = (
                f"GroupNorm({self.groups}, {c}, spatial_ndim={guess}) reads {shape} as a batch "
                f"{shape[:k]} of examples of shape {shape[k:]}"
            )
        return (
            f"GroupNorm: without `spatial_ndim`, the input is one example (channels={c}, "
            f"*spatial); got shape {shape}, read as {read}. For a batch (*batch, channels, "
            f"*spatial), as PyTorch's GroupNorm takes (N, C, *), pass `spatial_ndim=` the number "
            f"of spatial dimensions: {how}."
        )

    def _flat(self, x: Array) -> Array:
        n, c = x.shape[0], x.shape[-1 if self.channels_last else 1]
        if c % self.groups:
            raise ValueError(f"GroupNorm: groups={self.groups} must divide the {c} channels.")
        xf = x.astype(compute_dtype(x.dtype))
        axes: tuple[int, ...]
        if self.channels_last:  # (N, *spatial, C) -> (N, positions, groups, C / groups)
            g, axes = xf.reshape((n, -1, self.groups, c // self.groups)), (1, 3)
        else:  # (N, C, *spatial) -> (N, groups, values)
            g, axes = xf.reshape((n, self.groups, -1)), (2,)
        mean = g.mean(axes, keepdims=True)
        var = jnp.square(g - mean).mean(axes, keepdims=True)
        y = ((g - mean) * lax.rsqrt(var + self.eps)).reshape(xf.shape)
        if self.weight is not None and self.bias is not None:
            spatial = x.ndim - 2
            y = y * per_channel(self.weight.astype(y.dtype), spatial, self.channels_last)
            y = y + per_channel(self.bias.astype(y.dtype), spatial, self.channels_last)
        return y.astype(x.dtype)
