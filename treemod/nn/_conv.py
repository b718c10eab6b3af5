"""Convolutions: `Conv`, `Conv1d`, `Conv2d`, `Conv3d`, and helpers shared with `ConvTranspose`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Inexact, PRNGKeyArray

from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names

from . import init as _init
from ._layout import (
    apply_image_layer,
    conv_dimension_numbers,
    per_channel,
    spatial_pads,
    spatial_shape,
    to_kernel_layout,
)
from ._utils import (
    as_tuple,
    check_padding,
    check_size,
    default_dtype,
    require_key,
)

__all__ = [
    "Conv",
    "Conv1d",
    "Conv2d",
    "Conv3d",
]


def conv_axes(channels_last: bool, num_spatial_dims: int) -> dict[str, tuple[str | None, ...]]:
    """Axis names of a (transposed) convolution's kernel `(out, in/groups, *kernel)`, or
    `(*kernel, in/groups, out)` channels-last, and its bias."""
    weight: tuple[str | None, ...] = ("conv_out", "conv_in")
    if channels_last:
        weight = (None,) * num_spatial_dims + ("conv_in", "conv_out")
    return {"weight": weight, "bias": ("conv_out",)}


_PADDING_MODES = {"ZEROS": None, "REFLECT": "reflect", "REPLICATE": "edge", "CIRCULAR": "wrap"}


def _padding(owner: str, padding: Any, n: int) -> str | tuple[tuple[int, int], ...]:
    """A convolution's `padding`: ints >= 0 or (low, high) pairs, or 'SAME', 'SAME_LOWER',
    'VALID' in any case (PyTorch's 'same' and 'valid' included)."""
    return check_padding(owner, padding, n, ("SAME", "SAME_LOWER", "VALID"))


def _init_params(
    owner: str,
    weight_shape: tuple[int, ...],
    fan_in: int,
    use_bias: bool,
    dtype: Any,
    weight_init: Any,
    bias_init: Any,
    key: Any,
    channels_last: bool,
) -> tuple[Array, Array | None]:
    """A kernel of `weight_shape` `(out, in/groups, *kernel)` in the layer's layout, and a bias."""
    require_key(owner, key)
    dtype = default_dtype(owner, dtype, complex_ok=True)
    wkey, bkey = jax.random.split(key, 2)
    if weight_init is None:
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        weight_init = _init.uniform(-bound, bound)
    # Initialisers see PyTorch's layout (their fans assume it), so a channels-last layer holds
    # the transposed kernel of the channels-first layer built from the same key.
    weight = to_kernel_layout(weight_init(wkey, weight_shape, dtype), channels_last)
    bias = None
    if use_bias:
        if bias_init is None:
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            bias_init = _init.uniform(-bound, bound)
        bias = bias_init(bkey, weight_shape[:1], dtype)
    return weight, bias


@axis_names(lambda conv: conv_axes(conv.channels_last, conv.num_spatial_dims))
class Conv(Module):
    """An N-d convolution over `(*batch, in_channels, *spatial)`, or channels-last input.

    Matches PyTorch's `nn.ConvNd` (cross-correlation; weight `(out, in/groups, *kernel)`;
    default init U(±1/sqrt(fan_in)) for weight and bias). The key is split once into two
    (weight, bias). All leading batch dimensions go through one batched convolution.

    With `channels_last=True` the input is `(*batch, *spatial, in_channels)`, the output
    `(*batch, *new_spatial, out_channels)` and the weight `(*kernel, in/groups, out)`, the
    layout of TensorFlow and Flax. It is the layout XLA convolves in, so a training step skips
    a transpose of every kernel and of its gradient (see the "Image layouts" page).
    The same key gives the transposed weight of the channels-first layer.

    Arguments:
        num_spatial_dims: number of spatial dimensions.
        in_channels: input channels.
        out_channels: output channels.
        kernel_size: an int or one int per spatial dimension.
        stride: an int or one per spatial dimension.
        padding: an int, or one int or `(low, high)` pair per spatial dimension (ints >= 0),
            or `"SAME"`, `"SAME_LOWER"` or `"VALID"` in any case (PyTorch's `"same"`).
        dilation: an int or one per spatial dimension.
        groups: number of channel groups (divides both channel counts).
        use_bias: whether to add a bias.
        padding_mode: `"ZEROS"`, `"REFLECT"`, `"REPLICATE"` or `"CIRCULAR"`.
        dtype: parameter dtype (float32 by default; floating or complex).
        weight_init: weight initialiser (default PyTorch's).
        bias_init: bias initialiser (default PyTorch's).
        key: the PRNG key.
        channels_last: take and return channels-last arrays, with a channels-last kernel.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> conv = nn.Conv(1, 2, 4, kernel_size=3, padding="SAME", key=jax.random.key(0))
        >>> conv(jnp.ones((2, 16))).shape
        (4, 16)
        >>> conv = nn.Conv(2, 3, 8, 3, padding=1, channels_last=True, key=jax.random.key(0))
        >>> conv(jnp.ones((16, 28, 28, 3))).shape, conv.weight.shape
        ((16, 28, 28, 8), (3, 3, 3, 8))
    """

    weight: Inexact[Array, "..."]  # (out, in/groups, *kernel), or (*kernel, in/groups, out)
    bias: Inexact[Array, " out"] | None
    num_spatial_dims: int = field(static=True)
    in_channels: int = field(static=True)
    out_channels: int = field(static=True)
    kernel_size: tuple[int, ...] = field(static=True)
    stride: tuple[int, ...] = field(static=True)
    padding: str | tuple[tuple[int, int], ...] = field(static=True)
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
        if not isinstance(padding_mode, str) or padding_mode.upper() not in _PADDING_MODES:
            raise ValueError(
                f"{name}: `padding_mode` must be one of {sorted(_PADDING_MODES)}; got "
                f"{padding_mode!r}."
            )
        self.kernel_size = as_tuple(name, "kernel_size", kernel_size, n)
        self.stride = as_tuple(name, "stride", stride, n)
        self.dilation = as_tuple(name, "dilation", dilation, n)
        self.padding = _padding(name, padding, n)
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        fan_in = in_channels // groups * math.prod(self.kernel_size)
        self.weight, self.bias = _init_params(
            name, shape, fan_in, use_bias, dtype, weight_init, bias_init, key, channels_last
        )
        self.channels_last = channels_last
        self.num_spatial_dims = n
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.groups = groups
        self.use_bias = use_bias
        self.padding_mode = padding_mode.upper()

    def __call__(
        self, x: Inexact[Array, "..."], *, key: PRNGKeyArray | None = None
    ) -> Inexact[Array, "..."]:
        """Convolve `x` of shape `(*batch, in_channels, *spatial)`.

        Arguments:
            x: the input (`(*batch, *spatial, in_channels)` if `channels_last`).
            key: ignored.

        Returns:
            `(*batch, out_channels, *new_spatial)` (`(*batch, *new_spatial, out_channels)` if
            `channels_last`).
        """
        n = self.num_spatial_dims
        return apply_image_layer(self, self._flat, x, "in_channels", self.in_channels, n)

    def _flat(self, x: Array) -> Array:
        n, last = self.num_spatial_dims, self.channels_last
        padding: Any = self.padding
        if self.padding_mode != "ZEROS":
            if isinstance(padding, str):
                window = [
                    (k - 1) * d + 1 for k, d in zip(self.kernel_size, self.dilation, strict=True)
                ]
                padding = lax.padtype_to_pads(
                    spatial_shape(x, n, last), window, self.stride, padding
                )
            mode = _PADDING_MODES[self.padding_mode] or "constant"
            x = jnp.pad(x, spatial_pads(padding, last), mode=mode)
            padding = ((0, 0),) * n
        y = lax.conv_general_dilated(
            x,
            self.weight,
            window_strides=self.stride,
            padding=padding,
            rhs_dilation=self.dilation,
            feature_group_count=self.groups,
            dimension_numbers=conv_dimension_numbers(n, last),
        )
        if self.bias is not None:
            y = y + per_channel(self.bias, n, last)
        return y


class Conv1d(Conv):
    """A 1-d convolution over `(*batch, in_channels, length)`; see `Conv` for the arguments.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> conv = nn.Conv1d(3, 8, kernel_size=5, stride=2, key=jax.random.key(0))
        >>> conv(jnp.ones((4, 3, 32))).shape
        (4, 8, 14)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: str | int | Sequence[int] | Sequence[tuple[int, int]] = 0,
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
        """Convolve `x` of shape `(*batch, in_channels, length)`.

        Arguments:
            x: the input, `(*batch, in_channels, length)`, or `(*batch, length, in_channels)` if
                `channels_last`; without `*batch` for one example.
            key: ignored (accepted so that containers can pass keys to every layer).

        Returns:
            `(*batch, out_channels, new_length)`, or `(*batch, new_length, out_channels)` if
            `channels_last`.
        """
        return super().__call__(x)


class Conv2d(Conv):
    """A 2-d convolution over `(*batch, in_channels, height, width)`; see `Conv` for the arguments.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> conv = nn.Conv2d(3, 8, kernel_size=3, padding=1, key=jax.random.key(0))
        >>> conv(jnp.ones((3, 28, 28))).shape
        (8, 28, 28)
        >>> conv(jnp.ones((16, 3, 28, 28))).shape
        (16, 8, 28, 28)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: str | int | Sequence[int] | Sequence[tuple[int, int]] = 0,
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
        """Convolve `x` of shape `(*batch, in_channels, height, width)`.

        Arguments:
            x: the input, `(*batch, in_channels, height, width)`, or `(*batch, height, width,
                in_channels)` if `channels_last`; without `*batch` for one example.
            key: ignored (accepted so that containers can pass keys to every layer).

        Returns:
            `(*batch, out_channels, new_height, new_width)`, or `(*batch, new_height, new_width,
            out_channels)` if `channels_last`.
        """
        return super().__call__(x)


class Conv3d(Conv):
    """A 3-d convolution over `(*batch, in_channels, depth, height, width)`; see `Conv`.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> conv = nn.Conv3d(2, 4, kernel_size=3, key=jax.random.key(0))
        >>> conv(jnp.ones((2, 5, 6, 7))).shape
        (4, 3, 4, 5)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: str | int | Sequence[int] | Sequence[tuple[int, int]] = 0,
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
        """Convolve `x` of shape `(*batch, in_channels, depth, height, width)`.

        Arguments:
            x: the input, `(*batch, in_channels, depth, height, width)`, or `(*batch, depth, height,
                width, in_channels)` if `channels_last`; without `*batch` for one example.
            key: ignored (accepted so that containers can pass keys to every layer).

        Returns:
            `(*batch, out_channels, new_depth, new_height, new_width)`, or `(*batch, new_depth,
            new_height, new_width, out_channels)` if `channels_last`.
        """
        return super().__call__(x)
