"""Transposed convolutions: `ConvTranspose`, `ConvTranspose1d`, `ConvTranspose2d`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Inexact, PRNGKeyArray

from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names

from . import init as _init
from ._conv import _init_params, _padding, conv_axes
from ._layout import (
    apply_image_layer,
    conv_dimension_numbers,
    kernel_spatial_axes,
    layer_name,
    per_channel,
    spatial_shape,
)
from ._utils import as_tuple, check_size

__all__ = ["ConvTranspose", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"]


@axis_names(lambda conv: conv_axes(conv.channels_last, conv.num_spatial_dims))
class ConvTranspose(Module):
    """An N-d transposed convolution (PyTorch's `nn.ConvTransposeNd`, Equinox's layout).

    The weight has Equinox's layout `(out, in/groups, *kernel)` (PyTorch stores
    `(in, out/groups, *kernel)`). Output length per spatial dim:
    `(L - 1) * stride - pad_low - pad_high + dilation * (kernel - 1) + output_padding + 1`.
    Default init matches PyTorch (U(±1/sqrt(fan_in)) with PyTorch's fan_in, `out/groups *
    prod(kernel)`). The key is split once into two (weight, bias).

    With `channels_last=True` the input is `(*batch, *spatial, in_channels)`, the output
    `(*batch, *new_spatial, out_channels)` and the weight `(*kernel, in/groups, out)`; see
    `Conv`.

    Arguments:
        num_spatial_dims: number of spatial dimensions.
        in_channels: input channels.
        out_channels: output channels.
        kernel_size: an int or one per spatial dimension.
        stride: an int or one per spatial dimension.
        padding: an int, one int or `(low, high)` pair per spatial dim (ints >= 0, cropped from the
            full output), `"VALID"` (= 0), or `"SAME"`/`"SAME_LOWER"`: an output `stride` times
            the input size, as in Equinox.
        output_padding: extra size added on the high side of each output dim (< stride);
            explicit padding only.
        dilation: an int or one per spatial dimension.
        groups: number of channel groups.
        use_bias: whether to add a bias.
        padding_mode: `"ZEROS"`, or `"CIRCULAR"`: the transpose of a `Conv` with circular
            padding, whose output wraps around (what falls off one end is added to the other).
            `"REFLECT"` and `"REPLICATE"` have no transpose here.
        dtype: parameter dtype (float32 by default; floating or complex).
        weight_init: weight initialiser.
        bias_init: bias initialiser.
        key: the PRNG key.
        channels_last: take and return channels-last arrays, with a channels-last kernel.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> key = jax.random.key(0)
        >>> up = nn.ConvTranspose(1, 4, 2, kernel_size=4, stride=2, padding=1, key=key)
        >>> up(jnp.ones((4, 8))).shape
        (2, 16)
    """

    weight: Inexact[Array, "..."]  # (out, in/groups, *kernel), or (*kernel, in/groups, out)
    bias: Inexact[Array, " out"] | None
    num_spatial_dims: int = field(static=True)
    in_channels: int = field(static=True)
    out_channels: int = field(static=True)
    kernel_size: tuple[int, ...] = field(static=True)
    stride: tuple[int, ...] = field(static=True)
    padding: str | tuple[tuple[int, int], ...] = field(static=True)
    output_padding: tuple[int, ...] = field(static=True)
    dilation: tuple[int, ...] = field(static=True)
    groups: int = field(static=True)
    use_bias: bool = field(static=True)
    padding_mode: str = field(static=True)
    channels_last: bool = field(static=True)

    def __init__(
        self,
        num_spatial_dims: int,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: str | int | Sequence[int] | Sequence[tuple[int, int]] = 0,
        output_padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        use_bias: bool = True,
        padding_mode: str = "ZEROS",
        dtype: Any = None,
        *,
        weight_init: _init.Initializer | None = None,
        bias_init: _init.Initializer | None = None,
        key: PRNGKeyArray,
        channels_last: bool = False,
    ) -> None:
        name = type(self).__name__
        n = check_size(name, "num_spatial_dims", num_spatial_dims)
        check_size(name, "in_channels", in_channels)
        check_size(name, "out_channels", out_channels)
        check_size(name, "groups", groups)
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"{name}: `groups`={groups} must divide in_channels={in_channels} and "
                f"out_channels={out_channels}."
            )
        pad = _padding(name, padding, n)
        self.padding = ((0, 0),) * n if pad == "VALID" else pad
        self.kernel_size = as_tuple(name, "kernel_size", kernel_size, n)
        self.stride = as_tuple(name, "stride", stride, n)
        self.dilation = as_tuple(name, "dilation", dilation, n)
        self.output_padding = as_tuple(name, "output_padding", output_padding, n, minimum=0)
        for op, s, d in zip(self.output_padding, self.stride, self.dilation, strict=True):
            if op >= max(s, d):
                raise ValueError(
                    f"{name}: `output_padding` {self.output_padding} must be smaller than the "
                    f"stride {self.stride} or the dilation {self.dilation}."
                )
        if not isinstance(padding_mode, str) or padding_mode.upper() not in ("ZEROS", "CIRCULAR"):
            raise ValueError(
                f"{name}: `padding_mode` must be 'ZEROS' or 'CIRCULAR'; got {padding_mode!r} "
                "(reflect and replicate padding have no transposed convolution here)."
            )
        self.padding_mode = padding_mode.upper()
        if isinstance(self.padding, str) and any(self.output_padding):
            raise ValueError(
                f"{name}: `output_padding` {self.output_padding} applies to explicit padding "
                f"only; padding={self.padding!r} already makes the output `stride` times the "
                "input size. Give explicit (low, high) padding instead."
            )
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        fan_in = out_channels // groups * math.prod(self.kernel_size)
        self.weight, self.bias = _init_params(
            name, shape, fan_in, use_bias, dtype, weight_init, bias_init, key, channels_last
        )
        self.channels_last = channels_last
        self.num_spatial_dims = n
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.groups = groups
        self.use_bias = use_bias

    def __call__(
        self, x: Inexact[Array, "..."], *, key: PRNGKeyArray | None = None
    ) -> Inexact[Array, "..."]:
        """Apply to `x` of shape `(*batch, in_channels, *spatial)`.

        Arguments:
            x: the input (`(*batch, *spatial, in_channels)` if `channels_last`).
            key: ignored.

        Returns:
            `(*batch, out_channels, *new_spatial)` (`(*batch, *new_spatial, out_channels)` if
            `channels_last`).
        """
        n = self.num_spatial_dims
        return apply_image_layer(self, self._flat, x, "in_channels", self.in_channels, n)

    def _kernel(self) -> Array:
        """The kernel the transposed convolution runs as a convolution with: the flipped weight."""
        n = self.num_spatial_dims
        return jnp.flip(self.weight, axis=kernel_spatial_axes(n, self.channels_last))

    def _crops(self) -> list[tuple[int, int, int]]:
        """Per spatial dim: `(low, high, extra)`, what to crop from each end of the full output
        (the transposed convolution without padding) and what to add at its high end.

        Explicit `(low, high)` padding crops by `low` and `high`, and `output_padding` is the
        extra. `"SAME"` crops the full output to `stride` times the input size (half of the
        excess from each end, the odd one from the high end; from the low end for
        `"SAME_LOWER"`), or extends its high end when it is shorter.
        """
        crops = []
        sizes = zip(self.kernel_size, self.stride, self.dilation, strict=True)
        for i, (k, s, d) in enumerate(sizes):
            if isinstance(self.padding, str):  # the full output is (L - 1) * s + span + 1
                excess = d * (k - 1) + 1 - s
                crop = max(excess, 0)
                lo = (crop + (self.padding == "SAME_LOWER")) // 2
                crops.append((lo, crop - lo, max(-excess, 0)))
            else:
                (lo, hi), extra = self.padding[i], self.output_padding[i]
                crops.append((lo, hi, extra))
        return crops

    def _flat(self, x: Array) -> Array:
        n, last = self.num_spatial_dims, self.channels_last
        crops = self._crops()
        circular = self.padding_mode == "CIRCULAR"
        spans = [d * (k - 1) for k, d in zip(self.kernel_size, self.dilation, strict=True)]
        sizes = zip(spatial_shape(x, n, last), self.stride, spans, crops, strict=True)
        for i, (length, s, span, (lo, hi, extra)) in enumerate(sizes):
            full = (length - 1) * s + span + 1 + extra
            if full - lo - hi < 1:
                raise ValueError(
                    f"{layer_name(self)}: padding {self.padding} crops the whole output of "
                    f"spatial dim {i} (length {full} before cropping); give less padding or a "
                    "larger input."
                )
        # The transposed convolution runs as a convolution of the dilated input, padded by
        # `span` less the crops (circular: no crop; the overhang is folded back below).
        padding = [
            (span, span + extra) if circular else (span - lo, span - hi + extra)
            for span, (lo, hi, extra) in zip(spans, crops, strict=True)
        ]
        w = self._kernel()
        y = lax.conv_general_dilated(
            x,
            w,
            window_strides=(1,) * n,
            padding=padding,
            lhs_dilation=self.stride,
            rhs_dilation=self.dilation,
            feature_group_count=self.groups,
            dimension_numbers=conv_dimension_numbers(n, last),
        )
        if circular:
            for i, (lo, hi, _) in enumerate(crops):
                axis = 1 + i if last else 2 + i
                y = _wrap(y, axis, lo, y.shape[axis] - lo - hi)
        if self.bias is not None:
            y = y + per_channel(self.bias, n, last)
        return y


def _wrap(y: Array, axis: int, low: int, size: int) -> Array:
    """Fold `y` along `axis` onto `size` entries: entry `j` of `y` adds to `(j - low) % size`.

    This is the transpose of circular padding by `low` in front and the rest behind."""
    total, out, start = y.shape[axis], None, 0
    while start < total:
        at = (start - low) % size
        stop = min(total, start + size - at)
        pads = [(0, 0, 0)] * y.ndim
        pads[axis] = (at, size - at - (stop - start), 0)
        piece = lax.pad(lax.slice_in_dim(y, start, stop, axis=axis), jnp.zeros((), y.dtype), pads)
        out = piece if out is None else out + piece
        start = stop
    assert out is not None
    return out


class ConvTranspose1d(ConvTranspose):
    """A 1-d transposed convolution over `(*batch, in_channels, length)`; see `ConvTranspose`.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> up = nn.ConvTranspose1d(4, 2, kernel_size=2, stride=2, key=jax.random.key(0))
        >>> up(jnp.ones((3, 4, 8))).shape
        (3, 2, 16)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: str | int | Sequence[int] | Sequence[tuple[int, int]] = 0,
        output_padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        use_bias: bool = True,
        padding_mode: str = "ZEROS",
        dtype: Any = None,
        *,
        weight_init: _init.Initializer | None = None,
        bias_init: _init.Initializer | None = None,
        key: PRNGKeyArray,
        channels_last: bool = False,
    ) -> None:
        super().__init__(
            1,
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            output_padding,
            dilation,
            groups,
            use_bias,
            padding_mode,
            dtype,
            weight_init=weight_init,
            bias_init=bias_init,
            key=key,
            channels_last=channels_last,
        )

    def __call__(
        self, x: Inexact[Array, "*batch in_channels length"], *, key: PRNGKeyArray | None = None
    ) -> Inexact[Array, "*batch out_channels new_length"]:
        """Apply to `x` of shape `(*batch, in_channels, length)`.

        Arguments:
            x: the input, `(*batch, in_channels, length)`, or `(*batch, length, in_channels)` if
                `channels_last`; without `*batch` for one example.
            key: ignored (accepted so that containers can pass keys to every layer).

        Returns:
            `(*batch, out_channels, new_length)`, or `(*batch, new_length, out_channels)` if
            `channels_last`.
        """
        return super().__call__(x)


class ConvTranspose2d(ConvTranspose):
    """A 2-d transposed convolution over `(*batch, in_channels, height, width)`.

    See `ConvTranspose` for the arguments.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> up = nn.ConvTranspose2d(8, 3, kernel_size=4, stride=2, padding=1, key=jax.random.key(0))
        >>> up(jnp.ones((8, 7, 7))).shape
        (3, 14, 14)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: str | int | Sequence[int] | Sequence[tuple[int, int]] = 0,
        output_padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        use_bias: bool = True,
        padding_mode: str = "ZEROS",
        dtype: Any = None,
        *,
        weight_init: _init.Initializer | None = None,
        bias_init: _init.Initializer | None = None,
        key: PRNGKeyArray,
        channels_last: bool = False,
    ) -> None:
        super().__init__(
            2,
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            output_padding,
            dilation,
            groups,
            use_bias,
            padding_mode,
            dtype,
            weight_init=weight_init,
            bias_init=bias_init,
            key=key,
            channels_last=channels_last,
        )

    def __call__(
        self,
        x: Inexact[Array, "*batch in_channels height width"],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Inexact[Array, "*batch out_channels new_height new_width"]:
        """Apply to `x` of shape `(*batch, in_channels, height, width)`.

        Arguments:
            x: the input, `(*batch, in_channels, height, width)`, or `(*batch, height, width,
                in_channels)` if `channels_last`; without `*batch` for one example.
            key: ignored (accepted so that containers can pass keys to every layer).

        Returns:
            `(*batch, out_channels, new_height, new_width)`, or `(*batch, new_height, new_width,
            out_channels)` if `channels_last`.
        """
        return super().__call__(x)


class ConvTranspose3d(ConvTranspose):
    """A 3-d transposed convolution over `(*batch, in_channels, depth, height, width)`.

    See `ConvTranspose` for the arguments.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> up = nn.ConvTranspose3d(4, 2, kernel_size=2, stride=2, key=jax.random.key(0))
        >>> up(jnp.ones((4, 3, 5, 6))).shape
        (2, 6, 10, 12)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: str | int | Sequence[int] | Sequence[tuple[int, int]] = 0,
        output_padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        use_bias: bool = True,
        padding_mode: str = "ZEROS",
        dtype: Any = None,
        *,
        weight_init: _init.Initializer | None = None,
        bias_init: _init.Initializer | None = None,
        key: PRNGKeyArray,
        channels_last: bool = False,
    ) -> None:
        super().__init__(
            3,
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            output_padding,
            dilation,
            groups,
            use_bias,
            padding_mode,
            dtype,
            weight_init=weight_init,
            bias_init=bias_init,
            key=key,
            channels_last=channels_last,
        )

    def __call__(
        self,
        x: Inexact[Array, "*batch in_channels depth height width"],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Inexact[Array, "*batch out_channels new_depth new_height new_width"]:
        """Apply to `x` of shape `(*batch, in_channels, depth, height, width)`.

        Arguments:
            x: the input, `(*batch, in_channels, depth, height, width)`, or `(*batch, depth, height,
                width, in_channels)` if `channels_last`; without `*batch` for one example.
            key: ignored (accepted so that containers can pass keys to every layer).

        Returns:
            `(*batch, out_channels, new_depth, new_height, new_width)`, or `(*batch, new_depth,
            new_height, new_width, out_channels)` if `channels_last`.
        """
        return super().__call__(x)
