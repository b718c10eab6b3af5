"""Image layouts: where the channel axis sits, for the layers that take `channels_last`.

Channels-first is PyTorch's layout: input `(*batch, channels, *spatial)` and convolution
kernels `(out, in/groups, *kernel)`. Channels-last is TensorFlow's and Flax's: input
`(*batch, *spatial, channels)` and kernels `(*kernel, in/groups, out)`. The kernel layout is
what XLA's CPU and GPU convolutions compute in, so channels-last programs skip a transpose of
every kernel (and of its gradient) at every step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jax import Array, lax

from ._batching import Core, batch_apply

__all__ = [
    "apply_image_layer",
    "conv_dimension_numbers",
    "layer_name",
    "kernel_spatial_axes",
    "per_channel",
    "spatial_pads",
    "spatial_shape",
    "to_kernel_layout",
]

_SPATIAL_NAMES = {1: ("length",), 2: ("height", "width"), 3: ("depth", "height", "width")}


def apply_image_layer(
    layer: Any,
    method: Callable[[Array], Array],
    x: Any,
    channels_name: str,
    channels: int | None,
    n: int,
) -> Array:
    """`batch_apply` of an image layer's core `method` to `x`, whose one example has a channel
    axis (named `channels_name`, of size `channels`, `None` for any) and `n` spatial axes,
    channels first or last as `layer.channels_last` says."""
    names = _SPATIAL_NAMES.get(n, tuple(f"spatial{i}" for i in range(n)))
    spatial = tuple((name, None) for name in names)
    channel = ((channels_name, channels),)
    core = spatial + channel if layer.channels_last else channel + spatial
    return batch_apply(layer_name(layer), method, [Core("x", x, core)])


def layer_name(layer: Any) -> str:
    """The layer's class name for error messages, marked when it is channels-last."""
    name = type(layer).__name__
    return f"{name}(channels_last=True)" if layer.channels_last else name


def spatial_shape(x: Any, n: int, channels_last: bool) -> tuple[int, ...]:
    """The spatial sizes of a batched input `(N, C, *spatial)` or `(N, *spatial, C)`."""
    return tuple(x.shape[1 : n + 1] if channels_last else x.shape[2:])


def spatial_pads(pads: Any, channels_last: bool) -> list[tuple[int, int]]:
    """Per-axis `(low, high)` pads of a batched input, from the pads of its spatial axes."""
    pads = [tuple(p) for p in pads]
    return [(0, 0), *pads, (0, 0)] if channels_last else [(0, 0), (0, 0), *pads]


def per_channel(v: Any, n: int, channels_last: bool) -> Any:
    """A per-channel vector shaped to broadcast against a batched input with `n` spatial axes."""
    size = v.shape[0]
    shape = (1,) * (n + 1) + (size,) if channels_last else (1, size) + (1,) * n
    return lax.reshape(v, shape)


def conv_dimension_numbers(n: int, channels_last: bool) -> lax.ConvDimensionNumbers:
    """`lax.conv_general_dilated` dimension numbers for batched input and the stored kernel."""
    if not channels_last:
        spec = tuple(range(n + 2))
        return lax.ConvDimensionNumbers(spec, spec, spec)
    image = (0, n + 1, *range(1, n + 1))
    kernel = (n + 1, n, *range(n))
    return lax.ConvDimensionNumbers(image, kernel, image)


def kernel_spatial_axes(n: int, channels_last: bool) -> tuple[int, ...]:
    """The kernel axes that run over space."""
    return tuple(range(n)) if channels_last else tuple(range(2, n + 2))


def to_kernel_layout(weight: Any, channels_last: bool) -> Any:
    """A kernel made as `(out, in/groups, *kernel)`, in the layout the layer stores."""
    if not channels_last:
        return weight
    n = weight.ndim - 2
    return weight.transpose((*range(2, n + 2), 1, 0))
