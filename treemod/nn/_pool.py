"""Window pooling: the general `Pool`, the N-d `MaxPool`, `AvgPool` and their 1/2/3-d forms."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Self

import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float, PRNGKeyArray

from treemod._module.module import Module, field

from . import _equinox_layout as _eqx
from ._layout import apply_image_layer, layer_name, spatial_pads, spatial_shape
from ._utils import as_tuple, check_padding, check_size, with_spatial_dims

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


def _identity(init: Any, dtype: Any) -> np.ndarray:
    """`init` in `dtype`; an infinite `init` for integer or boolean input is the extreme value."""
    if np.isinf(init) and not jnp.issubdtype(dtype, jnp.inexact):
        if jnp.issubdtype(dtype, jnp.bool_):
            return np.asarray(init > 0)
        info = jnp.iinfo(dtype)
        return np.asarray(info.max if init > 0 else info.min, dtype)
    return np.asarray(init, dtype=dtype)


class Pool(Module):
    """N-d window pooling with any reduction (Equinox's `nn.Pool`).

    Each output cell folds `operation` over its window, starting from `init`; padding counts
    as `init`. `MaxPool` is `Pool(-inf, lax.max, ...)`; `AvgPool` divides a sum by the
    window size.

    Arguments:
        init: the reduction's starting value (its identity, such as `0` for `lax.add`).
        operation: a binary, associative JAX function, such as `lax.max`, `lax.min` or
            `lax.add`.
        num_spatial_dims: number of spatial dimensions.
        kernel_size: window size, an int or one per spatial dimension.
        stride: window step, an int or one per spatial dimension.
        padding: an int, or one int or `(low, high)` pair per spatial dimension (ints >= 0).
        use_ceil: round the output size up instead of down.
        dilation: spacing between the window's elements, an int or one per spatial dimension.
        channels_last: take and return `(*batch, *spatial, channels)` arrays.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> from jax import lax
        >>> pool = nn.Pool(jnp.inf, lax.min, 1, kernel_size=2, stride=2)
        >>> pool(jnp.array([[3.0, 1.0, 2.0, 0.0]]))
        Array([[1., 0.]], dtype=float32)
    """

    init: float = field(static=True)
    operation: Callable[[Array, Array], Array] = field(static=True)
    num_spatial_dims: int = field(static=True)
    kernel_size: tuple[int, ...] = field(static=True)
    stride: tuple[int, ...] = field(static=True)
    padding: tuple[tuple[int, int], ...] = field(static=True)
    use_ceil: bool = field(static=True)
    dilation: tuple[int, ...] = field(static=True)
    channels_last: bool = field(static=True)

    def __init__(
        self,
        init: float | Array,
        operation: Callable[[Array, Array], Array],
        num_spatial_dims: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] | Sequence[tuple[int, int]] = 0,
        use_ceil: bool = False,
        *,
        dilation: int | Sequence[int] = 1,
        channels_last: bool = False,
    ) -> None:
        name = type(self).__name__
        check_size(name, "num_spatial_dims", num_spatial_dims)
        if np.ndim(init) != 0 or not callable(operation):
            raise TypeError(
                f"{name}: `init` must be a number and `operation` a binary function such as "
                f"`lax.max`; got init={init!r}, operation={operation!r}."
            )
        n = num_spatial_dims
        self.init = np.asarray(init).item()  # a Python number: static, and hashable
        self.operation = operation
        self.num_spatial_dims = n
        self.channels_last = channels_last
        self.kernel_size = as_tuple(name, "kernel_size", kernel_size, n)
        self.stride = as_tuple(name, "stride", stride, n)
        self.dilation = as_tuple(name, "dilation", dilation, n)
        self.padding = check_padding(name, padding, n)  # type: ignore[assignment]
        self.use_ceil = use_ceil
        for k, (lo, hi) in zip(self.kernel_size, self.padding, strict=True):
            if max(lo, hi) * 2 > k:
                raise ValueError(
                    f"{name}: padding {self.padding} must be at most half the kernel size "
                    f"{self.kernel_size} (a window must never lie wholly in the padding)."
                )

    def __equinox_leaves__(self) -> dict[str, Any]:
        """Equinox's fields of this pool, for Equinox's checkpoint format."""
        return _eqx.pool_fields(self, self.init)

    def __from_equinox_leaves__(self, fields: dict[str, Any]) -> Self:
        """This pool (its `init` and `operation` are its configuration)."""
        return self

    def _pads(self, spatial: tuple[int, ...]) -> tuple[list[tuple[int, int]], list[int]]:
        """Explicit padding per spatial dim, and the extra high padding that ceil mode adds."""
        pads, extra = [], []
        windows = zip(self.kernel_size, self.dilation, strict=True)
        spans = [d * (k - 1) + 1 for k, d in windows]  # a dilated window's extent
        for size, k, s, (lo, hi) in zip(spatial, spans, self.stride, self.padding, strict=True):
            total = size + lo + hi
            if total < k:
                raise ValueError(
                    f"{layer_name(self)}: the padded input size {total} is smaller than the "
                    f"window, {k} wide (kernel size {self.kernel_size}, dilation "
                    f"{self.dilation})."
                )
            out = (total - k) // s + 1
            if self.use_ceil:
                out = -(-(total - k) // s) + 1
                if (out - 1) * s >= size + lo:  # the last window must start inside the input
                    out -= 1
            pads.append((lo, hi))
            extra.append(max(0, (out - 1) * s + k - total))
        return pads, extra

    def _window(self, sizes: tuple[int, ...]) -> tuple[int, ...]:
        """Per-axis window sizes (or strides) of a batched input, from the spatial ones."""
        return (1, *sizes, 1) if self.channels_last else (1, 1, *sizes)

    def _reduce(self, x: Array) -> tuple[Array, list[tuple[int, int]], list[int]]:
        last = self.channels_last
        pads, extra = self._pads(spatial_shape(x, self.num_spatial_dims, last))
        full = spatial_pads([(lo, hi + e) for (lo, hi), e in zip(pads, extra, strict=True)], last)
        y: Array = lax.reduce_window(
            x,
            _identity(self.init, x.dtype),  # concrete: JAX knows `lax.max`/`add` monoids
            self.operation,
            self._window(self.kernel_size),
            self._window(self.stride),
            full,
            window_dilation=self._window(self.dilation),
        )
        return y, pads, extra

    def __call__(
        self, x: Float[Array, "..."], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "..."]:
        """Pool `x` of shape `(*batch, channels, *spatial)`.

        Arguments:
            x: the input (`(*batch, *spatial, channels)` if `channels_last`).
            key: ignored.

        Returns:
            `(*batch, channels, *pooled_spatial)` (channels last if `channels_last`).
        """
        n = self.num_spatial_dims
        return apply_image_layer(self, self._flat, x, "channels", None, n)

    def _flat(self, x: Array) -> Array:
        return self._reduce(x)[0]


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

    def __equinox_leaves__(self) -> dict[str, Any]:
        """Equinox's fields of this pool: its `init` is the int `0`."""
        return _eqx.pool_fields(self, 0)

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

    __init__ = with_spatial_dims(MaxPool.__init__, 1)
    __call__ = _Pool1d.__call__


class MaxPool2d(MaxPool):
    """2-d max pooling over `(*batch, channels, height, width)`; see `MaxPool`.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.MaxPool2d(2, stride=2)(jnp.ones((8, 3, 28, 28))).shape
        (8, 3, 14, 14)
    """

    __init__ = with_spatial_dims(MaxPool.__init__, 2)
    __call__ = _Pool2d.__call__


class MaxPool3d(MaxPool):
    """3-d max pooling over `(*batch, channels, depth, height, width)`; see `MaxPool`.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.MaxPool3d(2, stride=2)(jnp.ones((2, 3, 8, 8, 8))).shape
        (2, 3, 4, 4, 4)
    """

    __init__ = with_spatial_dims(MaxPool.__init__, 3)
    __call__ = _Pool3d.__call__


class AvgPool1d(AvgPool):
    """1-d average pooling over `(*batch, channels, length)`; see `AvgPool`.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.AvgPool1d(2, stride=2)(jnp.ones((2, 8))).shape
        (2, 4)
    """

    __init__ = with_spatial_dims(AvgPool.__init__, 1)
    __call__ = _Pool1d.__call__


class AvgPool2d(AvgPool):
    """2-d average pooling over `(*batch, channels, height, width)`; see `AvgPool`.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.AvgPool2d(2, stride=2)(jnp.ones((3, 8, 8))).shape
        (3, 4, 4)
    """

    __init__ = with_spatial_dims(AvgPool.__init__, 2)
    __call__ = _Pool2d.__call__


class AvgPool3d(AvgPool):
    """3-d average pooling over `(*batch, channels, depth, height, width)`; see `AvgPool`.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.AvgPool3d(2, stride=2)(jnp.ones((2, 3, 8, 8, 8))).shape
        (2, 3, 4, 4, 4)
    """

    __init__ = with_spatial_dims(AvgPool.__init__, 3)
    __call__ = _Pool3d.__call__
