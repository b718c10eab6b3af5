"""Equinox's layout of the layers that hold their parameters differently from Equinox's.

The layers' `__equinox_leaves__`/`__from_equinox_leaves__` methods (the protocol of
`treemod/_saving/equinox_format.py`) call these: each returns Equinox's fields of the layer in
Equinox's field order, or rebuilds the layer from them. Every function accepts
`jax.ShapeDtypeStruct` leaves (abstract models) through `map_array`.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import jax.numpy as jnp
import numpy as np

from treemod._module.module import Module
from treemod._module.state import State
from treemod._saving.equinox_format import map_array
from treemod._tree.tree_at import tree_at

from ._layout import kernel_spatial_axes, to_kernel_layout

__all__ = [
    "batch_norm_fields",
    "batch_norm_from_fields",
    "conv_fields",
    "conv_from_fields",
    "pool_fields",
    "prelu_fields",
    "prelu_from_fields",
    "spectral_norm_fields",
    "spectral_norm_from_fields",
]

# The rebuilders return a copy of the layer they are given, of its type.
_M = TypeVar("_M", bound=Module)


class _ConvLayout(Protocol):
    """What `conv_from_fields` reads of a `Conv`/`ConvTranspose`."""

    @property
    def num_spatial_dims(self) -> int: ...

    @property
    def channels_last(self) -> bool: ...


_C = TypeVar("_C", bound=_ConvLayout)


def _is_none(x: Any) -> bool:
    return x is None


def _channels_first(weight: Any, n: int) -> Any:
    """A channels-last kernel `(*kernel, in/groups, out)` as `(out, in/groups, *kernel)`."""
    return weight.transpose((n + 1, n, *range(n)))


def conv_fields(layer: Any, flip: bool) -> dict[str, Any]:
    """`Conv`/`ConvTranspose`: Equinox's bias is `(out, 1, ..., 1)`, its kernel channels-first,
    and (`flip`, transposed convolutions) Equinox's transposed kernel is treemod's flipped."""
    n, last = layer.num_spatial_dims, layer.channels_last

    def weight(w: Any) -> Any:
        w = _channels_first(w, n) if last else w
        return jnp.flip(w, kernel_spatial_axes(n, False)) if flip else w

    return {
        "weight": map_array(layer.weight, weight),
        "bias": map_array(layer.bias, lambda b: b.reshape(b.shape + (1,) * n)),
    }


def conv_from_fields(layer: _C, fields: dict[str, Any], flip: bool) -> _C:
    """The layer with Equinox's `weight` and `bias` in treemod's layout."""
    n, last = layer.num_spatial_dims, layer.channels_last

    def weight(w: Any) -> Any:
        w = jnp.flip(w, kernel_spatial_axes(n, False)) if flip else w
        return to_kernel_layout(w, last)

    new = (
        map_array(fields["weight"], weight),
        map_array(fields["bias"], lambda b: b.reshape(b.shape[:1])),
    )
    rebuilt: _C = tree_at(lambda m: (m.weight, m.bias), layer, new, is_leaf=_is_none)
    return rebuilt


def prelu_fields(layer: Any) -> dict[str, Any]:
    """`PReLU`: Equinox keeps a single slope as a scalar (treemod as shape `(1,)`)."""
    slope = layer.negative_slope
    return {"negative_slope": map_array(slope, lambda s: s.reshape(()) if s.shape == (1,) else s)}


def prelu_from_fields(layer: _M, fields: dict[str, Any]) -> _M:
    slope = map_array(fields["negative_slope"], lambda s: s.reshape(1) if s.ndim == 0 else s)
    rebuilt: _M = tree_at(lambda m: m.negative_slope, layer, slope)
    return rebuilt


def pool_fields(layer: Any, init: Any) -> dict[str, Any]:
    """`Pool`s: Equinox keeps the reduction's `init` (and `operation`) as leaves; `init` as
    given (`0`, an int, for Equinox's average pools)."""
    return {"init": init, "operation": layer.operation}


def batch_norm_fields(layer: Any) -> dict[str, Any]:
    """`BatchNorm`, as Equinox's `mode="ema"`: the statistics are its `ema_state_index` state,
    with `ema_first_time_index` False (they are in use), and `inference` a leaf."""
    stats = (layer.running_mean.value, layer.running_var.value)
    return {
        "weight": layer.weight,
        "bias": layer.bias,
        "ema_first_time_index": State(jnp.array(False)),
        "ema_state_index": State(stats),
        "batch_counter": None,
        "batch_state_index": None,
        "inference": layer.inference,
    }


def batch_norm_from_fields(layer: _M, fields: dict[str, Any]) -> _M:
    """The layer with Equinox's statistics; before Equinox's first training call (first-time
    flag still set, buffers uninitialised) treemod's initial statistics (zeros, ones)."""
    mean, var = fields["ema_state_index"].value
    first = fields["ema_first_time_index"].value
    if not isinstance(first, jnp.ndarray | np.ndarray) or bool(first):
        mean = map_array(mean, jnp.zeros_like)
        var = map_array(var, jnp.ones_like)
    rebuilt: _M = tree_at(
        lambda m: (m.weight, m.bias, m.running_mean, m.running_var),
        layer,
        (fields["weight"], fields["bias"], State(mean), State(var)),
        is_leaf=_is_none,
    )
    return rebuilt


def spectral_norm_fields(layer: Any) -> dict[str, Any]:
    """`SpectralNorm`: the singular-vector estimates are Equinox's `uv_index` state."""
    return {
        "layer": layer.layer,
        "uv_index": State((layer.u.value, layer.v.value)),
        "inference": layer.inference,
    }


def spectral_norm_from_fields(layer: _M, fields: dict[str, Any]) -> _M:
    u, v = fields["uv_index"].value
    new = (fields["layer"], State(u), State(v))
    rebuilt: _M = tree_at(lambda m: (m.layer, m.u, m.v), layer, new)
    return rebuilt
