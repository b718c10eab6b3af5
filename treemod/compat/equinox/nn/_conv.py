"""Equinox's `Conv*` and `ConvTranspose*` over treemod's: Equinox's initialisation, bias shape
`(out, 1, ..., 1)`, transposed-convolution kernel orientation and one-example calls.

The arithmetic is treemod's layers'; these classes only hold the parameters as Equinox's layers
do, so Equinox's weights (and files, read by `tree_deserialise_leaves`) give Equinox's outputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from treemod._compat_api import with_spatial_dims
from treemod.nn import Conv as _Conv
from treemod.nn import ConvTranspose as _ConvTranspose

from ._init import equinox_uniform

__all__ = [
    "Conv",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
]

Size = int | Sequence[int]


def _default_dtype(dtype: Any) -> Any:
    if dtype is not None:
        return dtype
    return jnp.float64 if jax.config.read("jax_enable_x64") else jnp.float32


def _lim(in_channels: int, groups: int, kernel_size: Size, n: int) -> float:
    sizes = (kernel_size,) * n if isinstance(kernel_size, int) else tuple(kernel_size)
    fan_in = in_channels // groups * math.prod(sizes)
    return 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0


def _check_rank(layer: Any, x: Any) -> None:
    rank = layer.num_spatial_dims + 1
    if jnp.ndim(x) != rank:
        raise ValueError(
            f"Input to `{type(layer).__name__}` needs to have rank {rank} "
            f"(in_channels, *spatial), but input has shape {jnp.shape(x)}. Map over a batch "
            "with jax.vmap, or call treemod.nn's layer, which takes batches."
        )


def _same_with_output_padding(
    n: int, kernel_size: Size, stride: Size, padding: Any, output_padding: Size, dilation: Size
) -> tuple[Any, Size]:
    """Equinox's `"SAME"` padding with an `output_padding`, as explicit padding.

    Equinox adds `output_padding` to the padding that `"SAME"` splits between the two ends
    (treemod takes `output_padding` with explicit padding only); other cases pass through.
    """
    if not isinstance(padding, str) or padding.upper() not in ("SAME", "SAME_LOWER"):
        return padding, output_padding
    per_dim = [(v,) * n if isinstance(v, int) else tuple(v) for v in (kernel_size, stride)]
    extra, dil = [(v,) * n if isinstance(v, int) else tuple(v) for v in (output_padding, dilation)]
    if not any(extra):
        return padding, output_padding
    lower = padding.upper() == "SAME_LOWER"
    pads, extras = [], []
    for k, s, a, d in zip(*per_dim, extra, dil, strict=True):
        total = d * (k - 1) - s + a + 1
        pads.append(((max(total, 0) + lower) // 2, max(total, 0) - (max(total, 0) + lower) // 2))
        extras.append(max(-total, 0))
    return tuple(pads), tuple(extras)


class Conv(_Conv, shapecheck=False):
    """Equinox's `nn.Conv`: treemod's `Conv` with Equinox's init and a bias `(out, 1, ..., 1)`.

    Called on one example `(in_channels, *spatial)` as Equinox's layer is (`jax.vmap` for a
    batch); the initialisation draws Equinox's numbers for the same key.

    Arguments:
        num_spatial_dims: number of spatial dimensions.
        in_channels: input channels.
        out_channels: output channels.
        kernel_size: an int or one per spatial dimension.
        stride: an int or one per spatial dimension.
        padding: an int, one int or `(low, high)` pair per spatial dim, `"SAME"`,
            `"SAME_LOWER"` or `"VALID"`.
        dilation: an int or one per spatial dimension.
        groups: number of channel groups.
        use_bias: whether to add a bias.
        padding_mode: `"ZEROS"`, `"REFLECT"`, `"REPLICATE"` or `"CIRCULAR"`.
        dtype: parameter dtype (float32, or float64 with x64 on).
        key: the PRNG key.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> conv = eqx.nn.Conv2d(3, 8, 3, key=jax.random.PRNGKey(0))
        >>> conv.bias.shape, conv(jnp.ones((3, 10, 10))).shape
        ((8, 1, 1), (8, 8, 8))
    """

    weight: Array
    bias: Array | None

    def __init__(
        self,
        num_spatial_dims: int,
        in_channels: int,
        out_channels: int,
        kernel_size: Size,
        stride: Size = 1,
        padding: Any = 0,
        dilation: Size = 1,
        groups: int = 1,
        use_bias: bool = True,
        padding_mode: str = "ZEROS",
        dtype: Any = None,
        *,
        key: PRNGKeyArray,
    ) -> None:
        init = equinox_uniform(_lim(in_channels, groups, kernel_size, num_spatial_dims))
        super().__init__(
            num_spatial_dims,
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            use_bias,
            padding_mode,
            _default_dtype(dtype),
            weight_init=init,
            bias_init=init,
            key=key,
        )
        if self.bias is not None:
            self.bias = self.bias.reshape(self.bias.shape + (1,) * num_spatial_dims)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Convolve one example `(in_channels, *spatial)` into `(out_channels, *new_spatial)`."""
        _check_rank(self, x)
        return _Conv.__call__(self, x)


class ConvTranspose(_ConvTranspose, shapecheck=False):
    """Equinox's `nn.ConvTranspose`: treemod's `ConvTranspose` holding Equinox's kernel.

    Equinox runs its weight `(out, in/groups, *kernel)` unflipped as the convolution of the
    dilated input, and initialises it with Equinox's fan-in (`in/groups * prod(kernel)`); the
    bias is `(out, 1, ..., 1)`. Called on one example `(in_channels, *spatial)`.

    Arguments:
        num_spatial_dims: number of spatial dimensions.
        in_channels: input channels.
        out_channels: output channels.
        kernel_size: an int or one per spatial dimension.
        stride: an int or one per spatial dimension.
        padding: an int, one int or `(low, high)` pair per spatial dim, `"SAME"`,
            `"SAME_LOWER"` or `"VALID"`.
        output_padding: extra size on the high side of each output dim (< stride).
        dilation: an int or one per spatial dimension.
        groups: number of channel groups.
        use_bias: whether to add a bias.
        padding_mode: `"ZEROS"` or `"CIRCULAR"`.
        dtype: parameter dtype (float32, or float64 with x64 on).
        key: the PRNG key.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> up = eqx.nn.ConvTranspose1d(4, 2, 2, stride=2, key=jax.random.PRNGKey(0))
        >>> up.weight.shape, up(jnp.ones((4, 8))).shape
        ((2, 4, 2), (2, 16))
    """

    weight: Array
    bias: Array | None

    def __init__(
        self,
        num_spatial_dims: int,
        in_channels: int,
        out_channels: int,
        kernel_size: Size,
        stride: Size = 1,
        padding: Any = 0,
        output_padding: Size = 0,
        dilation: Size = 1,
        groups: int = 1,
        use_bias: bool = True,
        padding_mode: str = "ZEROS",
        dtype: Any = None,
        *,
        key: PRNGKeyArray,
    ) -> None:
        init = equinox_uniform(_lim(in_channels, groups, kernel_size, num_spatial_dims))
        padding, output_padding = _same_with_output_padding(
            num_spatial_dims, kernel_size, stride, padding, output_padding, dilation
        )
        super().__init__(
            num_spatial_dims,
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
            _default_dtype(dtype),
            weight_init=init,
            bias_init=init,
            key=key,
        )
        if self.bias is not None:
            self.bias = self.bias.reshape(self.bias.shape + (1,) * num_spatial_dims)

    def _kernel(self) -> Array:
        return self.weight  # Equinox's kernel is the one it convolves with

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Apply to one example `(in_channels, *spatial)`, giving `(out_channels, *new_spatial)`."""
        _check_rank(self, x)
        return _ConvTranspose.__call__(self, x)


# Equinox's per-dimension classes: `Conv`/`ConvTranspose` with `num_spatial_dims` bound.


class Conv1d(Conv):
    """As `Conv` with `num_spatial_dims=1` (Equinox's `nn.Conv1d`)."""

    __init__ = with_spatial_dims(Conv.__init__, 1)


class Conv2d(Conv):
    """As `Conv` with `num_spatial_dims=2` (Equinox's `nn.Conv2d`)."""

    __init__ = with_spatial_dims(Conv.__init__, 2)


class Conv3d(Conv):
    """As `Conv` with `num_spatial_dims=3` (Equinox's `nn.Conv3d`)."""

    __init__ = with_spatial_dims(Conv.__init__, 3)


class ConvTranspose1d(ConvTranspose):
    """As `ConvTranspose` with `num_spatial_dims=1` (Equinox's `nn.ConvTranspose1d`)."""

    __init__ = with_spatial_dims(ConvTranspose.__init__, 1)


class ConvTranspose2d(ConvTranspose):
    """As `ConvTranspose` with `num_spatial_dims=2` (Equinox's `nn.ConvTranspose2d`)."""

    __init__ = with_spatial_dims(ConvTranspose.__init__, 2)


class ConvTranspose3d(ConvTranspose):
    """As `ConvTranspose` with `num_spatial_dims=3` (Equinox's `nn.ConvTranspose3d`)."""

    __init__ = with_spatial_dims(ConvTranspose.__init__, 3)
