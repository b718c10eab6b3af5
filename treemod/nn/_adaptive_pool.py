"""Adaptive pooling: `AdaptivePool`, `AdaptiveAvgPool`, `AdaptiveMaxPool` and their 1/2/3-d forms.

The output has a fixed spatial size whatever the input size; output cell `i` of an axis of
length `size` pools the input window `[floor(i * size / target), ceil((i + 1) * size / target))`,
as in PyTorch. Every reduction here is separable, so each spatial axis is pooled in turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from treemod._module.module import Module, field

from ._layout import apply_image_layer, layer_name
from ._utils import as_tuple, check_size

__all__ = [
    "AdaptiveAvgPool",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "AdaptivePool",
]


def _windows(size: int, target: int) -> list[tuple[int, int]]:
    """PyTorch's adaptive windows `(start, end)` for one axis."""
    return [((i * size) // target, -(-((i + 1) * size) // target)) for i in range(target)]


class AdaptivePool(Module):
    """N-d pooling to a fixed spatial size with any reduction (Equinox's `nn.AdaptivePool`).

    Each output cell reduces its input window, with PyTorch's adaptive windows, one spatial
    axis at a time, so `operation` must be separable (a mean, maximum, minimum or sum is).
    `AdaptiveAvgPool` and `AdaptiveMaxPool` are faster forms for the mean and the maximum.

    Arguments:
        target_shape: the output's spatial shape, an int or one per spatial dimension.
        num_spatial_dims: number of spatial dimensions.
        operation: reduces a 1-d window to a scalar, such as `jnp.mean` or `jnp.min`.
        channels_last: take and return `(*batch, *spatial, channels)` arrays.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> pool = nn.AdaptivePool(2, num_spatial_dims=1, operation=jnp.min)
        >>> pool(jnp.array([[3.0, 1.0, 2.0, 0.0, 5.0]]))
        Array([[1., 0.]], dtype=float32)
    """

    target_shape: tuple[int, ...] = field(static=True)
    operation: Callable[[Array], Array] = field(static=True)
    channels_last: bool = field(static=True)

    def __init__(
        self,
        target_shape: int | Sequence[int],
        num_spatial_dims: int,
        operation: Callable[[Array], Array],
        *,
        channels_last: bool = False,
    ) -> None:
        name = type(self).__name__
        check_size(name, "num_spatial_dims", num_spatial_dims)
        self.target_shape = as_tuple(name, "target_shape", target_shape, num_spatial_dims)
        if not callable(operation):
            raise TypeError(
                f"{name}: `operation` must be a function reducing a 1-d window to a scalar, "
                f"such as `jnp.mean`; got {operation!r}."
            )
        self.operation = operation
        self.channels_last = channels_last

    def __call__(
        self, x: Float[Array, "..."], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "..."]:
        """Pool `x` of shape `(*batch, channels, *spatial)`.

        Arguments:
            x: the input (`(*batch, *spatial, channels)` if `channels_last`).
            key: ignored.

        Returns:
            `(*batch, channels, *target_shape)` (channels last if `channels_last`).
        """
        return apply_image_layer(self, self._flat, x, "channels", None, len(self.target_shape))

    def _flat(self, x: Array) -> Array:
        first = 1 if self.channels_last else 2
        for i, target in enumerate(self.target_shape):
            axis = first + i
            x = self._pool_axis(x, axis, _windows(x.shape[axis], target))
        return x

    def _pool_axis(self, x: Array, axis: int, windows: list[tuple[int, int]]) -> Array:
        # Windows of one length are gathered and reduced together; the groups are put back
        # in window order at the end.
        lengths = sorted({end - start for start, end in windows})
        parts, order = [], []
        for length in lengths:
            cells = [i for i, (start, end) in enumerate(windows) if end - start == length]
            index = np.array([[windows[i][0] + j for j in range(length)] for i in cells])
            gathered = jnp.moveaxis(jnp.take(x, jnp.asarray(index), axis=axis), axis + 1, -1)
            reduced = jax.vmap(self.operation)(gathered.reshape(-1, length))
            if reduced.shape != (gathered.size // length,):
                raise ValueError(
                    f"{layer_name(self)}: `operation` must reduce a 1-d window to a scalar; "
                    f"on a window of shape ({length},) it returned shape {reduced.shape[1:]}."
                )
            parts.append(reduced.reshape(gathered.shape[:-1]))
            order += cells
        y = jnp.concatenate(parts, axis=axis)
        return y if len(parts) == 1 else jnp.take(y, jnp.asarray(np.argsort(order)), axis=axis)


class AdaptiveAvgPool(AdaptivePool):
    """N-d average pooling to a fixed spatial size, with PyTorch's adaptive windows.

    Arguments:
        target_shape: the output's spatial shape, an int or one per spatial dimension.
        num_spatial_dims: number of spatial dimensions.
        channels_last: take and return `(*batch, *spatial, channels)` arrays.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> pool = nn.AdaptiveAvgPool(1, num_spatial_dims=2, channels_last=True)
        >>> pool(jnp.ones((8, 7, 7, 64))).shape
        (8, 1, 1, 64)
    """

    def __init__(
        self,
        target_shape: int | Sequence[int],
        num_spatial_dims: int,
        *,
        channels_last: bool = False,
    ) -> None:
        super().__init__(target_shape, num_spatial_dims, jnp.mean, channels_last=channels_last)

    def _pool_axis(self, x: Array, axis: int, windows: list[tuple[int, int]]) -> Array:
        # One matmul per axis with a (target, size) averaging matrix. HIGHEST precision: on GPUs
        # the default lets float32 matmuls round their inputs to TF32 (10-bit mantissa), which
        # would turn an average into an approximation.
        m = np.zeros((len(windows), x.shape[axis]))
        for i, (start, end) in enumerate(windows):
            m[i, start:end] = 1.0 / (end - start)
        y = jnp.tensordot(
            x, jnp.asarray(m, x.dtype), axes=((axis,), (1,)), precision=jax.lax.Precision.HIGHEST
        )
        return jnp.moveaxis(y, -1, axis)


class AdaptiveMaxPool(AdaptivePool):
    """N-d max pooling to a fixed spatial size, with PyTorch's adaptive windows.

    Arguments:
        target_shape: the output's spatial shape, an int or one per spatial dimension.
        num_spatial_dims: number of spatial dimensions.
        channels_last: take and return `(*batch, *spatial, channels)` arrays.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> pool = nn.AdaptiveMaxPool((2, 3), num_spatial_dims=2, channels_last=True)
        >>> pool(jnp.ones((8, 7, 9, 16))).shape
        (8, 2, 3, 16)
    """

    def __init__(
        self,
        target_shape: int | Sequence[int],
        num_spatial_dims: int,
        *,
        channels_last: bool = False,
    ) -> None:
        super().__init__(target_shape, num_spatial_dims, jnp.max, channels_last=channels_last)

    def _pool_axis(self, x: Array, axis: int, windows: list[tuple[int, int]]) -> Array:
        # Gather every window padded to the longest by repeating its last index (which leaves
        # the maximum unchanged), then reduce.
        width = max(end - start for start, end in windows)
        index = np.array([[min(s + j, e - 1) for j in range(width)] for s, e in windows])
        gathered = jnp.take(x, jnp.asarray(index), axis=axis)  # (..., target, width, ...)
        return gathered.max(axis=axis + 1)


class _Adaptive1d(AdaptivePool):
    """Holds the annotated call that `AdaptiveAvgPool1d` and `AdaptiveMaxPool1d` take as theirs.

    Never instantiated nor subclassed: each per-dimension adaptive pool sets
    `__call__ = _Adaptive1d.__call__` in its body, so the call is its own member (the API
    reference shows it) and the class's bases stay the public ones.
    The output's channels are named apart from the input's: with `channels_last` the names
    bind other dimensions (the annotations are channels-first).
    """

    def __call__(
        self: AdaptivePool,
        x: Float[Array, "*batch channels length"],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "*batch out_channels target"]:
        """Pool `x` of shape `(*batch, channels, length)` to `(*batch, channels, target)`.

        Arguments:
            x: the input, `(*batch, channels, length)`, or `(*batch, length, channels)` if
                `channels_last`; without `*batch` for one example.
            key: ignored (accepted so that containers can pass keys to every layer).

        Returns:
            `(*batch, channels, target)`, or `(*batch, target, channels)` if `channels_last`.
        """
        return AdaptivePool.__call__(self, x)


class _Adaptive2d(AdaptivePool):
    """Holds the annotated call of `AdaptiveAvgPool2d`, `AdaptiveMaxPool2d`; see `_Adaptive1d`."""

    def __call__(
        self: AdaptivePool,
        x: Float[Array, "*batch channels height width"],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "*batch out_channels target_height target_width"]:
        """Pool `x` of shape `(*batch, channels, height, width)`.

        Arguments:
            x: the input, `(*batch, channels, height, width)`, or `(*batch, height, width,
                channels)` if `channels_last`; without `*batch` for one example.
            key: ignored (accepted so that containers can pass keys to every layer).

        Returns:
            `(*batch, channels, target_height, target_width)`, or `(*batch, target_height,
            target_width, channels)` if `channels_last`.
        """
        return AdaptivePool.__call__(self, x)


class _Adaptive3d(AdaptivePool):
    """Holds the annotated call of `AdaptiveAvgPool3d`, `AdaptiveMaxPool3d`; see `_Adaptive1d`."""

    def __call__(
        self: AdaptivePool,
        x: Float[Array, "*batch channels depth height width"],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "*batch out_channels target_depth target_height target_width"]:
        """Pool `x` of shape `(*batch, channels, depth, height, width)`.

        Arguments:
            x: the input, `(*batch, channels, depth, height, width)`, or `(*batch, depth, height,
                width, channels)` if `channels_last`; without `*batch` for one example.
            key: ignored (accepted so that containers can pass keys to every layer).

        Returns:
            `(*batch, channels, target_depth, target_height, target_width)`, or `(*batch,
            target_depth, target_height, target_width, channels)` if `channels_last`.
        """
        return AdaptivePool.__call__(self, x)


class AdaptiveAvgPool1d(AdaptiveAvgPool):
    """Average pooling to a fixed output length, with PyTorch's adaptive windows.

    Arguments:
        target_shape: the output length (an int or a 1-tuple).
        channels_last: take and return `(*batch, *spatial, channels)` arrays.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.AdaptiveAvgPool1d(2)(jnp.arange(6.0).reshape(1, 6))
        Array([[1., 4.]], dtype=float32)
    """

    def __init__(self, target_shape: int | Sequence[int], *, channels_last: bool = False) -> None:
        super().__init__(target_shape, 1, channels_last=channels_last)

    __call__ = _Adaptive1d.__call__


class AdaptiveAvgPool2d(AdaptiveAvgPool):
    """Average pooling to a fixed output size `(height, width)`, with PyTorch's adaptive windows.

    Arguments:
        target_shape: the output `(height, width)` (an int for a square).
        channels_last: take and return `(*batch, *spatial, channels)` arrays.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.AdaptiveAvgPool2d((1, 1))(jnp.ones((8, 64, 7, 7))).shape
        (8, 64, 1, 1)
    """

    def __init__(self, target_shape: int | Sequence[int], *, channels_last: bool = False) -> None:
        super().__init__(target_shape, 2, channels_last=channels_last)

    __call__ = _Adaptive2d.__call__


class AdaptiveAvgPool3d(AdaptiveAvgPool):
    """Average pooling to a fixed `(depth, height, width)`, with PyTorch's adaptive windows.

    Arguments:
        target_shape: the output `(depth, height, width)` (an int for a cube).
        channels_last: take and return `(*batch, *spatial, channels)` arrays.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.AdaptiveAvgPool3d(2)(jnp.ones((4, 5, 6, 7))).shape
        (4, 2, 2, 2)
    """

    def __init__(self, target_shape: int | Sequence[int], *, channels_last: bool = False) -> None:
        super().__init__(target_shape, 3, channels_last=channels_last)

    __call__ = _Adaptive3d.__call__


class AdaptiveMaxPool1d(AdaptiveMaxPool):
    """Max pooling to a fixed output length, with PyTorch's adaptive windows.

    Arguments:
        target_shape: the output length (an int or a 1-tuple).
        channels_last: take and return `(*batch, *spatial, channels)` arrays.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.AdaptiveMaxPool1d(2)(jnp.array([[3.0, 1.0, 2.0, 0.0, 5.0]]))
        Array([[3., 5.]], dtype=float32)
    """

    def __init__(self, target_shape: int | Sequence[int], *, channels_last: bool = False) -> None:
        super().__init__(target_shape, 1, channels_last=channels_last)

    __call__ = _Adaptive1d.__call__


class AdaptiveMaxPool2d(AdaptiveMaxPool):
    """Max pooling to a fixed output size `(height, width)`, with PyTorch's adaptive windows.

    Arguments:
        target_shape: the output `(height, width)` (an int for a square).
        channels_last: take and return `(*batch, *spatial, channels)` arrays.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.AdaptiveMaxPool2d((2, 3))(jnp.ones((8, 16, 7, 9))).shape
        (8, 16, 2, 3)
    """

    def __init__(self, target_shape: int | Sequence[int], *, channels_last: bool = False) -> None:
        super().__init__(target_shape, 2, channels_last=channels_last)

    __call__ = _Adaptive2d.__call__


class AdaptiveMaxPool3d(AdaptiveMaxPool):
    """Max pooling to a fixed `(depth, height, width)`, with PyTorch's adaptive windows.

    Arguments:
        target_shape: the output `(depth, height, width)` (an int for a cube).
        channels_last: take and return `(*batch, *spatial, channels)` arrays.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.AdaptiveMaxPool3d(1)(jnp.ones((4, 5, 6, 7))).shape
        (4, 1, 1, 1)
    """

    def __init__(self, target_shape: int | Sequence[int], *, channels_last: bool = False) -> None:
        super().__init__(target_shape, 3, channels_last=channels_last)

    __call__ = _Adaptive3d.__call__
