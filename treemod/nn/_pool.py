"""Max and average pooling: the N-d `MaxPool` and `AvgPool` and their 1/2/3-d forms.

`Pool`, their base, is in `_pool_base.py`; it is re-exported here because
`treemod.compat.equinox` imports it from this file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float, PRNGKeyArray

from ._layout import spatial_shape
from ._pool_base import Pool

__all__ = [
    "AvgPool",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "MaxPool",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "Pool",
]


class MaxPool(Pool):
    """N-d max pooling over `(*batch, channels, *spatial)` (Equinox's `nn.MaxPool`).

    As in Equinox, `stride` defaults to 1 (PyTorch defaults it to the kernel size). Padding
    counts as minus infinity. `use_ceil=True` is PyTorch's `ceil_mode=True`.

    Arguments:
        num_spatial_dims: number of spatial dimensions.
        kernel_size: window size, an int or one per spatial dimension.
        stride: window step, an int or one per spatial dimension.
        padding: an int, or one int or `(low, high)` pair per spatial dimension (ints >= 0).
        use_ceil: round the output size up instead of down.
        dilation: spacing between the window's elements (PyTorch's `dilation`).
        channels_last: take and return `(*batch, *spatial, channels)` arrays.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.MaxPool(1, kernel_size=2, stride=2)(jnp.arange(8.0).reshape(1, 8))
        Array([[1., 3., 5., 7.]], dtype=float32)
        >>> pool = nn.MaxPool(2, kernel_size=2, stride=2, channels_last=True)
        >>> pool(jnp.ones((16, 28, 28, 3))).shape
        (16, 14, 14, 3)
    """

    def __init__(
        self,
        num_spatial_dims: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] | Sequence[tuple[int, int]] = 0,
        use_ceil: bool = False,
        *,
        dilation: int | Sequence[int] = 1,
        channels_last: bool = False,
    ) -> None:
        super().__init__(
            -jnp.inf,
            lax.max,
            num_spatial_dims,
            kernel_size,
            stride,
            padding,
            use_ceil,
            dilation=dilation,
            channels_last=channels_last,
        )


class AvgPool(Pool):
    """N-d average pooling over `(*batch, channels, *spatial)` (Equinox's `nn.AvgPool`).

    `stride` defaults to 1 as in Equinox. Zero padding is counted in the average (PyTorch's
    `count_include_pad=True`); with `use_ceil=True`, windows running past the padded input
    are averaged over their valid part, as in PyTorch.

    Arguments:
        num_spatial_dims: number of spatial dimensions.
        kernel_size: window size, an int or one per spatial dimension.
        stride: window step, an int or one per spatial dimension.
        padding: an int, or one int or `(low, high)` pair per spatial dimension (ints >= 0).
        use_ceil: round the output size up instead of down.
        channels_last: take and return `(*batch, *spatial, channels)` arrays.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.AvgPool(1, kernel_size=2, stride=2)(jnp.arange(8.0).reshape(1, 8))
        Array([[0.5, 2.5, 4.5, 6.5]], dtype=float32)
    """

    def __init__(
        self,
        num_spatial_dims: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] | Sequence[tuple[int, int]] = 0,
        use_ceil: bool = False,
        *,
        channels_last: bool = False,
    ) -> None:
        super().__init__(
            0.0,
            lax.add,
            num_spatial_dims,
            kernel_size,
            stride,
            padding,
            use_ceil,
            channels_last=channels_last,
        )

    def _flat(self, x: Array) -> Array:
        y, pads, extra = self._reduce(x)
        if not any(extra):
            return y / math.prod(self.kernel_size)
        spatial = spatial_shape(x, self.num_spatial_dims, self.channels_last)
        ones = np.ones(tuple(s + lo + hi for s, (lo, hi) in zip(spatial, pads, strict=True)))
        ones = np.pad(ones, [(0, e) for e in extra])
        count: Array = lax.reduce_window(
            jnp.asarray(ones.reshape(self._window(ones.shape)), x.dtype),
            jnp.array(0, x.dtype),
            lax.add,
            self._window(self.kernel_size),
            self._window(self.stride),
            "VALID",
        )
        return y / count


class _Pool1d(Pool):
    """Holds the annotated call that `MaxPool1d` and `AvgPool1d` both take as their own.

    Never instantiated nor subclassed: each per-dimension pool sets `__call__ = _Pool1d.__call__`
    in its body, so the call is its own member (the API reference shows it) and the class's
    bases stay the public ones.
    The output's channels are named apart from the input's: with `channels_last` the names
    bind other dimensions (the annotations are channels-first).
    """

    def __call__(
        self: Pool, x: Float[Array, "*batch channels length"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "*batch out_channels new_length"]:
        """Pool `x` of shape `(*batch, channels, length)`.

        Arguments:
            x: the input, `(*batch, channels, length)`, or `(*batch, length, channels)` if
                `channels_last`; without `*batch` for one example.
            key: ignored (accepted so that containers can pass keys to every layer).

        Returns:
            `(*batch, channels, new_length)`, or `(*batch, new_length, channels)` if
            `channels_last`.
        """
        return Pool.__call__(self, x)


class _Pool2d(Pool):
    """Holds the annotated call of `MaxPool2d` and `AvgPool2d`; see `_Pool1d`."""

    def __call__(
        self: Pool,
        x: Float[Array, "*batch channels height width"],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "*batch out_channels new_height new_width"]:
        """Pool `x` of shape `(*batch, channels, height, width)`.

        Arguments:
            x: the input, `(*batch, channels, height, width)`, or `(*batch, height, width,
                channels)` if `channels_last`; without `*batch` for one example.
            key: ignored (accepted so that containers can pass keys to every layer).

        Returns:
            `(*batch, channels, new_height, new_width)`, or `(*batch, new_height, new_width,
            channels)` if `channels_last`.
        """
        return Pool.__call__(self, x)


class _Pool3d(Pool):
    """Holds the annotated call of `MaxPool3d` and `AvgPool3d`; see `_Pool1d`."""

    def __call__(
        self: Pool,
        x: Float[Array, "*batch channels depth height width"],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "*batch out_channels new_depth new_height new_width"]:
        """Pool `x` of shape `(*batch, channels, depth, height, width)`.

        Arguments:
            x: the input, `(*batch, channels, depth, height, width)`, or `(*batch, depth, height,
                width, channels)` if `channels_last`; without `*batch` for one example.
            key: ignored (accepted so that containers can pass keys to every layer).

        Returns:
            `(*batch, channels, new_depth, new_height, new_width)`, or `(*batch, new_depth,
            new_height, new_width, channels)` if `channels_last`.
        """
        return Pool.__call__(self, x)


class MaxPool1d(MaxPool):
    """1-d max pooling over `(*batch, channels, length)`; see `MaxPool`.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.MaxPool1d(3, stride=2)(jnp.ones((4, 2, 9))).shape
        (4, 2, 4)
    """

    def __init__(
        self,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] | Sequence[tuple[int, int]] = 0,
        use_ceil: bool = False,
        *,
        dilation: int | Sequence[int] = 1,
        channels_last: bool = False,
    ) -> None:
        super().__init__(
            1,
            kernel_size,
            stride,
            padding,
            use_ceil,
            dilation=dilation,
            channels_last=channels_last,
        )

    __call__ = _Pool1d.__call__


class MaxPool2d(MaxPool):
    """2-d max pooling over `(*batch, channels, height, width)`; see `MaxPool`.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.MaxPool2d(2, stride=2)(jnp.ones((8, 3, 28, 28))).shape
        (8, 3, 14, 14)
    """

    def __init__(
        self,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] | Sequence[tuple[int, int]] = 0,
        use_ceil: bool = False,
        *,
        dilation: int | Sequence[int] = 1,
        channels_last: bool = False,
    ) -> None:
        super().__init__(
            2,
            kernel_size,
            stride,
            padding,
            use_ceil,
            dilation=dilation,
            channels_last=channels_last,
        )

    __call__ = _Pool2d.__call__


class MaxPool3d(MaxPool):
    """3-d max pooling over `(*batch, channels, depth, height, width)`; see `MaxPool`.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.MaxPool3d(2, stride=2)(jnp.ones((2, 3, 8, 8, 8))).shape
        (2, 3, 4, 4, 4)
    """

    def __init__(
        self,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] | Sequence[tuple[int, int]] = 0,
        use_ceil: bool = False,
        *,
        dilation: int | Sequence[int] = 1,
        channels_last: bool = False,
    ) -> None:
        super().__init__(
            3,
            kernel_size,
            stride,
            padding,
            use_ceil,
            dilation=dilation,
            channels_last=channels_last,
        )

    __call__ = _Pool3d.__call__


class AvgPool1d(AvgPool):
    """1-d average pooling over `(*batch, channels, length)`; see `AvgPool`.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.AvgPool1d(2, stride=2)(jnp.ones((2, 8))).shape
        (2, 4)
    """

    def __init__(
        self,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] | Sequence[tuple[int, int]] = 0,
        use_ceil: bool = False,
        *,
        channels_last: bool = False,
    ) -> None:
        super().__init__(1, kernel_size, stride, padding, use_ceil, channels_last=channels_last)

    __call__ = _Pool1d.__call__


class AvgPool2d(AvgPool):
    """2-d average pooling over `(*batch, channels, height, width)`; see `AvgPool`.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.AvgPool2d(2, stride=2)(jnp.ones((3, 8, 8))).shape
        (3, 4, 4)
    """

    def __init__(
        self,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] | Sequence[tuple[int, int]] = 0,
        use_ceil: bool = False,
        *,
        channels_last: bool = False,
    ) -> None:
        super().__init__(2, kernel_size, stride, padding, use_ceil, channels_last=channels_last)

    __call__ = _Pool2d.__call__


class AvgPool3d(AvgPool):
    """3-d average pooling over `(*batch, channels, depth, height, width)`; see `AvgPool`.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.AvgPool3d(2, stride=2)(jnp.ones((2, 3, 8, 8, 8))).shape
        (2, 3, 4, 4, 4)
    """

    def __init__(
        self,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] | Sequence[tuple[int, int]] = 0,
        use_ceil: bool = False,
        *,
        channels_last: bool = False,
    ) -> None:
        super().__init__(3, kernel_size, stride, padding, use_ceil, channels_last=channels_last)

    __call__ = _Pool3d.__call__
