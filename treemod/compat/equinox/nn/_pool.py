"""Equinox's pools over treemod's: Equinox's `use_ceil` and averaging, and Equinox's adaptive
windows.

treemod's pools follow PyTorch where Equinox differs: `use_ceil` (Equinox pads the high end by
a whole stride and averages over the full kernel), and adaptive windows (Equinox splits a
length into `target` consecutive runs, the first `length % target` one longer; PyTorch's
windows may overlap). The reductions are treemod's; only the windows are Equinox's.
"""

from __future__ import annotations

import math
from typing import Any

from jaxtyping import Array

from treemod._compat_api import apply_image_layer, layer_name
from treemod.nn import AdaptiveAvgPool1d as _AdaptiveAvgPool1d
from treemod.nn import AdaptiveAvgPool2d as _AdaptiveAvgPool2d
from treemod.nn import AdaptiveAvgPool3d as _AdaptiveAvgPool3d
from treemod.nn import AdaptiveMaxPool1d as _AdaptiveMaxPool1d
from treemod.nn import AdaptiveMaxPool2d as _AdaptiveMaxPool2d
from treemod.nn import AdaptiveMaxPool3d as _AdaptiveMaxPool3d
from treemod.nn import AdaptivePool as _AdaptivePool
from treemod.nn import AvgPool1d as _AvgPool1d
from treemod.nn import AvgPool2d as _AvgPool2d
from treemod.nn import AvgPool3d as _AvgPool3d
from treemod.nn import MaxPool1d as _MaxPool1d
from treemod.nn import MaxPool2d as _MaxPool2d
from treemod.nn import MaxPool3d as _MaxPool3d
from treemod.nn import Pool as _Pool

__all__ = [
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "AdaptivePool",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "Pool",
]


class _EquinoxCeil:
    """Equinox's `use_ceil`: when the windows do not fit exactly, pad the high end by `stride`.
    Integer inputs are pooled as Equinox pools them (treemod's layers take floating input)."""

    num_spatial_dims: int
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    use_ceil: bool

    def __call__(self, x: Array, *, key: Any = None) -> Array:
        """Pool `x` of shape `(channels, *spatial)` (or a batch of them)."""
        flat = self._flat  # type: ignore[attr-defined]  # the treemod pool's, later in the MRO
        return apply_image_layer(self, flat, x, "channels", None, self.num_spatial_dims)

    def _pads(self, spatial: tuple[int, ...]) -> tuple[list[tuple[int, int]], list[int]]:
        pads, extra = _Pool._pads(self, spatial)  # type: ignore[arg-type]  # checks the sizes
        if not self.use_ceil:
            return pads, extra
        extra = []
        sizes = zip(spatial, self.kernel_size, self.stride, self.padding, strict=True)
        for size, k, s, (lo, hi) in sizes:
            more = 0 if (size + lo + hi - k) % s == 0 else s
            if max(lo, hi + more) > k:
                raise RuntimeError(
                    f"{layer_name(self)}: with use_ceil the padding becomes {(lo, hi + more)}, "
                    f"larger than the kernel size {k}; give a smaller padding or stride."
                )
            extra.append(more)
        return pads, extra


class _EquinoxAverage(_EquinoxCeil):
    """Equinox's average: the window's sum over the full kernel size, padding included."""

    def _flat(self, x: Array) -> Array:
        summed: Array = self._reduce(x)[0]  # type: ignore[attr-defined]  # the treemod pool's
        return summed / math.prod(self.kernel_size)


class Pool(_EquinoxCeil, _Pool, shapecheck=False):
    """Equinox's `nn.Pool`: treemod's `Pool` with Equinox's `use_ceil`.

    Example:
        >>> import jax.numpy as jnp
        >>> from jax import lax
        >>> import treemod.compat.equinox as eqx
        >>> pool = eqx.nn.Pool(-jnp.inf, lax.max, 1, 2, stride=2, use_ceil=True)
        >>> pool(jnp.array([[1.0, 2.0, 3.0]]))
        Array([[2., 3.]], dtype=float32)
    """


class MaxPool1d(_EquinoxCeil, _MaxPool1d, shapecheck=False):
    """Equinox's `nn.MaxPool1d` (`use_ceil` as Equinox's)."""


class MaxPool2d(_EquinoxCeil, _MaxPool2d, shapecheck=False):
    """Equinox's `nn.MaxPool2d` (`use_ceil` as Equinox's)."""


class MaxPool3d(_EquinoxCeil, _MaxPool3d, shapecheck=False):
    """Equinox's `nn.MaxPool3d` (`use_ceil` as Equinox's)."""


class AvgPool1d(_EquinoxAverage, _AvgPool1d, shapecheck=False):
    """Equinox's `nn.AvgPool1d`: sums divided by the kernel size, `use_ceil` as Equinox's.

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.nn.AvgPool1d(2, stride=2, use_ceil=True)(jnp.array([[2.0, 4.0, 6.0]]))
        Array([[3., 3.]], dtype=float32)
    """


class AvgPool2d(_EquinoxAverage, _AvgPool2d, shapecheck=False):
    """Equinox's `nn.AvgPool2d`: sums divided by the kernel size, `use_ceil` as Equinox's."""


class AvgPool3d(_EquinoxAverage, _AvgPool3d, shapecheck=False):
    """Equinox's `nn.AvgPool3d`: sums divided by the kernel size, `use_ceil` as Equinox's."""


def equinox_windows(owner: str, size: int, target: int) -> list[tuple[int, int]]:
    """Equinox's adaptive windows `(start, end)` for one axis: `target` consecutive runs, the
    first `size % target` of them one longer."""
    short, longer = divmod(size, target)
    if short == 0:
        raise ValueError(
            f"{owner}: cannot pool a length of {size} to {target} with Equinox's adaptive "
            "windows (each window needs an element); use treemod.nn's adaptive pools."
        )
    windows, start = [], 0
    for i in range(target):
        end = start + short + (i < longer)
        windows.append((start, end))
        start = end
    return windows


class _EquinoxWindows:
    """Adaptive pooling over Equinox's windows (treemod's reduction), of any input dtype."""

    target_shape: tuple[int, ...]

    def __call__(self, x: Array, *, key: Any = None) -> Array:
        """Pool `x` of shape `(channels, *spatial)` (or a batch of them) to the target shape."""
        return apply_image_layer(self, self._flat, x, "channels", None, len(self.target_shape))

    def _flat(self, x: Array) -> Array:
        name = layer_name(self)
        for i, target in enumerate(self.target_shape):
            axis = 2 + i
            windows = equinox_windows(name, x.shape[axis], target)
            x = self._pool_axis(x, axis, windows)  # type: ignore[attr-defined]  # the pool's
        return x


class AdaptivePool(_EquinoxWindows, _AdaptivePool, shapecheck=False):
    """Equinox's `nn.AdaptivePool`: any reduction over Equinox's adaptive windows.

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.nn.AdaptivePool(2, 1, jnp.max)(jnp.array([[1.0, 5.0, 2.0, 0.0, 3.0]]))
        Array([[5., 3.]], dtype=float32)
    """


class AdaptiveAvgPool1d(_EquinoxWindows, _AdaptiveAvgPool1d, shapecheck=False):
    """Equinox's `nn.AdaptiveAvgPool1d` (Equinox's windows)."""


class AdaptiveAvgPool2d(_EquinoxWindows, _AdaptiveAvgPool2d, shapecheck=False):
    """Equinox's `nn.AdaptiveAvgPool2d` (Equinox's windows)."""


class AdaptiveAvgPool3d(_EquinoxWindows, _AdaptiveAvgPool3d, shapecheck=False):
    """Equinox's `nn.AdaptiveAvgPool3d` (Equinox's windows)."""


class AdaptiveMaxPool1d(_EquinoxWindows, _AdaptiveMaxPool1d, shapecheck=False):
    """Equinox's `nn.AdaptiveMaxPool1d` (Equinox's windows)."""


class AdaptiveMaxPool2d(_EquinoxWindows, _AdaptiveMaxPool2d, shapecheck=False):
    """Equinox's `nn.AdaptiveMaxPool2d` (Equinox's windows)."""


class AdaptiveMaxPool3d(_EquinoxWindows, _AdaptiveMaxPool3d, shapecheck=False):
    """Equinox's `nn.AdaptiveMaxPool3d` (Equinox's windows)."""
