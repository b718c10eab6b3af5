"""Adaptive pooling: `AdaptiveAvgPool1d/2d/3d` and `AdaptiveMaxPool1d/2d/3d`.

The output has a fixed spatial size whatever the input size; output cell `i` of an axis of
length `size` pools the input window `[floor(i * size / target), ceil((i + 1) * size / target))`,
as in PyTorch. Both reductions are separable, so each spatial axis is pooled in turn.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .._module import Module, field
from ._batching import Core, batch_apply
from ._utils import as_tuple

__all__ = [
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
]


def _windows(size: int, target: int) -> list[tuple[int, int]]:
    """PyTorch's adaptive windows `(start, end)` for one axis."""
    return [((i * size) // target, -(-((i + 1) * size) // target)) for i in range(target)]


class _AdaptivePool(Module):
    target_shape: tuple[int, ...] = field(static=True)
    _spatial_dims = 1  # set by each public class

    def __init__(self, target_shape: int | Sequence[int]) -> None:
        name = type(self).__name__
        self.target_shape = as_tuple(name, "target_shape", target_shape, self._spatial_dims)
        if any(t < 1 for t in self.target_shape):
            raise ValueError(f"{name}: `target_shape` must be positive; got {self.target_shape}.")

    def _apply(self, x: Array) -> Array:
        n = len(self.target_shape)
        core = (("channels", None),) + tuple((f"spatial{i}", None) for i in range(n))
        return batch_apply(type(self).__name__, self._flat, [Core("x", x, core)])

    def _flat(self, x: Array) -> Array:
        for i, target in enumerate(self.target_shape):
            x = self._pool_axis(x, 2 + i, _windows(x.shape[2 + i], target))
        return x

    def _pool_axis(self, x: Array, axis: int, windows: list[tuple[int, int]]) -> Array:
        raise NotImplementedError


class _AdaptiveAvgPool(_AdaptivePool):
    def _pool_axis(self, x: Array, axis: int, windows: list[tuple[int, int]]) -> Array:
        # One matmul per axis with a (target, size) averaging matrix.
        m = np.zeros((len(windows), x.shape[axis]))
        for i, (start, end) in enumerate(windows):
            m[i, start:end] = 1.0 / (end - start)
        y = jnp.tensordot(x, jnp.asarray(m, x.dtype), axes=((axis,), (1,)))
        return jnp.moveaxis(y, -1, axis)


class _AdaptiveMaxPool(_AdaptivePool):
    def _pool_axis(self, x: Array, axis: int, windows: list[tuple[int, int]]) -> Array:
        # Gather every window padded to the longest by repeating its last index (which leaves
        # the maximum unchanged), then reduce.
        width = max(end - start for start, end in windows)
        index = np.array([[min(s + j, e - 1) for j in range(width)] for s, e in windows])
        gathered = jnp.take(x, jnp.asarray(index), axis=axis)  # (..., target, width, ...)
        return gathered.max(axis=axis + 1)


class AdaptiveAvgPool1d(_AdaptiveAvgPool):
    """Average pooling to a fixed output length, with PyTorch's adaptive windows.

    Arguments:
        target_shape: the output length (an int or a 1-tuple).

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.AdaptiveAvgPool1d(2)(jnp.arange(6.0).reshape(1, 6))
        Array([[1., 4.]], dtype=float32)
    """

    def __call__(
        self, x: Float[Array, "*batch channels length"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "*batch channels target"]:
        """Pool `x` of shape `(*batch, channels, length)` to `(*batch, channels, target)`."""
        return self._apply(x)


class AdaptiveAvgPool2d(_AdaptiveAvgPool):
    """Average pooling to a fixed output size `(height, width)`, with PyTorch's adaptive windows.

    Arguments:
        target_shape: the output `(height, width)` (an int for a square).

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.AdaptiveAvgPool2d((1, 1))(jnp.ones((8, 64, 7, 7))).shape
        (8, 64, 1, 1)
    """

    _spatial_dims = 2

    def __call__(
        self,
        x: Float[Array, "*batch channels height width"],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "*batch channels target_height target_width"]:
        """Pool `x` of shape `(*batch, channels, height, width)`."""
        return self._apply(x)


class AdaptiveAvgPool3d(_AdaptiveAvgPool):
    """Average pooling to a fixed `(depth, height, width)`, with PyTorch's adaptive windows.

    Arguments:
        target_shape: the output `(depth, height, width)` (an int for a cube).

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.AdaptiveAvgPool3d(2)(jnp.ones((4, 5, 6, 7))).shape
        (4, 2, 2, 2)
    """

    _spatial_dims = 3

    def __call__(
        self,
        x: Float[Array, "*batch channels depth height width"],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "*batch channels target_depth target_height target_width"]:
        """Pool `x` of shape `(*batch, channels, depth, height, width)`."""
        return self._apply(x)


class AdaptiveMaxPool1d(_AdaptiveMaxPool):
    """Max pooling to a fixed output length, with PyTorch's adaptive windows.

    Arguments:
        target_shape: the output length (an int or a 1-tuple).

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.AdaptiveMaxPool1d(2)(jnp.array([[3.0, 1.0, 2.0, 0.0, 5.0]]))
        Array([[3., 5.]], dtype=float32)
    """

    def __call__(
        self, x: Float[Array, "*batch channels length"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "*batch channels target"]:
        """Pool `x` of shape `(*batch, channels, length)` to `(*batch, channels, target)`."""
        return self._apply(x)


class AdaptiveMaxPool2d(_AdaptiveMaxPool):
    """Max pooling to a fixed output size `(height, width)`, with PyTorch's adaptive windows.

    Arguments:
        target_shape: the output `(height, width)` (an int for a square).

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.AdaptiveMaxPool2d((2, 3))(jnp.ones((8, 16, 7, 9))).shape
        (8, 16, 2, 3)
    """

    _spatial_dims = 2

    def __call__(
        self,
        x: Float[Array, "*batch channels height width"],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "*batch channels target_height target_width"]:
        """Pool `x` of shape `(*batch, channels, height, width)`."""
        return self._apply(x)


class AdaptiveMaxPool3d(_AdaptiveMaxPool):
    """Max pooling to a fixed `(depth, height, width)`, with PyTorch's adaptive windows.

    Arguments:
        target_shape: the output `(depth, height, width)` (an int for a cube).

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.AdaptiveMaxPool3d(1)(jnp.ones((4, 5, 6, 7))).shape
        (4, 1, 1, 1)
    """

    _spatial_dims = 3

    def __call__(
        self,
        x: Float[Array, "*batch channels depth height width"],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "*batch channels target_depth target_height target_width"]:
        """Pool `x` of shape `(*batch, channels, depth, height, width)`."""
        return self._apply(x)
