"""Window pooling with any reduction: `Pool` (Equinox's `nn.Pool`), the base of `MaxPool` and
`AvgPool` (`_pool.py`), with the window arithmetic they share (padding, `use_ceil`, dilation)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float, PRNGKeyArray

from treemod._module.module import Module, field

from ._layout import apply_image_layer, layer_name, spatial_pads, spatial_shape
from ._utils import as_tuple, check_padding, check_size

__all__ = ["Pool"]


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
        # Channels first, the batch and channel axes are pooled as one, so the window is
        # `(1, *kernel)`: ONNX exporters (jax2onnx) pool every axis of the window, and
        # onnxruntime's `MaxPool` takes at most three (`(1, 1, 3, 3)` is four).
        skip = 0 if last else 1
        operand = x if last else lax.reshape(x, (x.shape[0] * x.shape[1], *x.shape[2:]))
        y: Array = lax.reduce_window(
            operand,
            _identity(self.init, x.dtype),  # concrete: JAX knows `lax.max`/`add` monoids
            self.operation,
            self._window(self.kernel_size)[skip:],
            self._window(self.stride)[skip:],
            full[skip:],
            window_dilation=self._window(self.dilation)[skip:],
        )
        if not last:
            y = lax.reshape(y, (x.shape[0], x.shape[1], *y.shape[1:]))
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
