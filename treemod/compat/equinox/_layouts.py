"""Equinox's layout of the layers whose parameters treemod holds differently, for Equinox's format.

`equinox_fields(layer)` gives Equinox's fields of a layer, in Equinox's field order, each
holding what Equinox's layer holds there (arrays in Equinox's shapes and orientation, Python
scalars, nested modules, `None`; a value wrapped in `treemod.State` is Equinox state, which
Equinox keeps in its separate `State`). `from_equinox_fields(layer, fields)` rebuilds the layer
from such a dict with the loaded values, `layer` giving the static configuration. Both dispatch
on the layer's type (`functools.singledispatch`): treemod's layers (`Conv`, `ConvTranspose`,
`PReLU`, the pools, `BatchNorm`, `SpectralNorm`) and this namespace's are registered below;
modules of other types are saved as their own leaves.

A user's own `Module` class may define the conversion as two methods, which take precedence:
`__equinox_leaves__(self) -> dict[str, Any]` and `__from_equinox_leaves__(self, fields) -> Self`.

Every conversion accepts `jax.ShapeDtypeStruct` leaves (abstract models, from
`filter_eval_shape`) through `map_array`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from treemod import State, tree_at
from treemod import nn as tmnn
from treemod._compat_api import kernel_spatial_axes, to_kernel_layout

from . import nn as eqxnn

__all__ = ["equinox_fields", "from_equinox_fields", "has_layout", "map_array"]


def map_array(x: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply `fn` to an array, or to the shape and dtype of a `jax.ShapeDtypeStruct`.

    Arguments:
        x: an array, a `jax.ShapeDtypeStruct` or `None` (returned as it is).
        fn: a function of one array (a reshape, a flip, a transpose).

    Returns:
        `fn(x)`, or its `jax.ShapeDtypeStruct` if `x` is one.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.compat.equinox._layouts import map_array
        >>> map_array(jax.ShapeDtypeStruct((3,), jnp.float32), lambda b: b.reshape(3, 1)).shape
        (3, 1)
    """
    if x is None:
        return None
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.eval_shape(fn, x)
    return fn(x)


@functools.singledispatch
def _fields(layer: Any) -> dict[str, Any] | None:
    """A layer's Equinox fields; `None` (the default): the module is saved as its own leaves."""
    return None


@functools.singledispatch
def _from_fields(layer: Any, fields: dict[str, Any]) -> Any:
    raise TypeError(f"{type(layer).__qualname__} has no Equinox layout")  # has_layout guards


_NO_LAYOUT = _fields.dispatch(object)


def has_layout(node: Any) -> bool:
    """Whether `node` is saved in a layout of its own (its fields from `equinox_fields`)."""
    kind = type(node)
    return hasattr(kind, "__equinox_leaves__") or _fields.dispatch(kind) is not _NO_LAYOUT


def equinox_fields(layer: Any) -> dict[str, Any]:
    """Equinox's fields of `layer` (which `has_layout`), in Equinox's field order.

    Example:
        >>> import jax, treemod as tm
        >>> from treemod.compat.equinox._layouts import equinox_fields
        >>> fields = equinox_fields(tm.nn.Conv2d(1, 2, 3, key=jax.random.key(0)))
        >>> fields["bias"].shape
        (2, 1, 1)
    """
    own = getattr(type(layer), "__equinox_leaves__", None)
    found = own(layer) if own is not None else _fields(layer)
    assert found is not None, type(layer)
    return found


def from_equinox_fields(layer: Any, fields: dict[str, Any]) -> Any:
    """`layer` rebuilt from Equinox's fields (loaded values), `layer` giving its configuration."""
    own = getattr(type(layer), "__from_equinox_leaves__", None)
    return own(layer, fields) if own is not None else _from_fields(layer, fields)


def _is_none(x: Any) -> bool:
    return x is None


# treemod's layers.


def _channels_first(weight: Any, n: int) -> Any:
    """A channels-last kernel `(*kernel, in/groups, out)` as `(out, in/groups, *kernel)`."""
    return weight.transpose((n + 1, n, *range(n)))


def _conv_fields(layer: Any, flip: bool) -> dict[str, Any]:
    """Equinox's bias is `(out, 1, ..., 1)`, its kernel channels-first, and (`flip`, transposed
    convolutions) Equinox's transposed kernel is treemod's flipped."""
    n, last = layer.num_spatial_dims, layer.channels_last

    def weight(w: Any) -> Any:
        w = _channels_first(w, n) if last else w
        return jnp.flip(w, kernel_spatial_axes(n, False)) if flip else w

    return {
        "weight": map_array(layer.weight, weight),
        "bias": map_array(layer.bias, lambda b: b.reshape(b.shape + (1,) * n)),
    }


def _conv_from_fields(layer: Any, fields: dict[str, Any], flip: bool) -> Any:
    n, last = layer.num_spatial_dims, layer.channels_last

    def weight(w: Any) -> Any:
        w = jnp.flip(w, kernel_spatial_axes(n, False)) if flip else w
        return to_kernel_layout(w, last)

    new = (
        map_array(fields["weight"], weight),
        map_array(fields["bias"], lambda b: b.reshape(b.shape[:1])),
    )
    return tree_at(lambda m: (m.weight, m.bias), layer, new, is_leaf=_is_none)


@_fields.register
def _(layer: tmnn.Conv) -> dict[str, Any]:
    return _conv_fields(layer, flip=False)


@_from_fields.register
def _(layer: tmnn.Conv, fields: dict[str, Any]) -> Any:
    return _conv_from_fields(layer, fields, flip=False)


@_fields.register
def _(layer: tmnn.ConvTranspose) -> dict[str, Any]:
    return _conv_fields(layer, flip=True)


@_from_fields.register
def _(layer: tmnn.ConvTranspose, fields: dict[str, Any]) -> Any:
    return _conv_from_fields(layer, fields, flip=True)


@_fields.register
def _(layer: tmnn.PReLU) -> dict[str, Any]:
    # Equinox keeps a single slope as a scalar (treemod as shape `(1,)`).
    slope = layer.negative_slope
    return {"negative_slope": map_array(slope, lambda s: s.reshape(()) if s.shape == (1,) else s)}


@_from_fields.register
def _(layer: tmnn.PReLU, fields: dict[str, Any]) -> Any:
    slope = map_array(fields["negative_slope"], lambda s: s.reshape(1) if s.ndim == 0 else s)
    return tree_at(lambda m: m.negative_slope, layer, slope)


@_fields.register
def _(layer: tmnn.Pool) -> dict[str, Any]:
    # Equinox keeps the reduction's `init` and `operation` as leaves (treemod: configuration).
    return {"init": layer.init, "operation": layer.operation}


@_fields.register
def _(layer: tmnn.AvgPool) -> dict[str, Any]:
    return {"init": 0, "operation": layer.operation}  # Equinox's average pools: the int 0


@_from_fields.register
def _(layer: tmnn.Pool, fields: dict[str, Any]) -> Any:
    return layer  # its `init` and `operation` are its configuration


@_fields.register
def _(layer: tmnn.BatchNorm) -> dict[str, Any]:
    # As Equinox's `mode="ema"`: the statistics are its `ema_state_index` state, with
    # `ema_first_time_index` False (they are in use), and `inference` a leaf.
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


@_from_fields.register
def _(layer: tmnn.BatchNorm, fields: dict[str, Any]) -> Any:
    # Before Equinox's first training call (first-time flag still set, buffers uninitialised):
    # treemod's initial statistics (zeros, ones).
    mean, var = fields["ema_state_index"].value
    first = fields["ema_first_time_index"].value
    if not isinstance(first, jnp.ndarray | np.ndarray) or bool(first):
        mean = map_array(mean, jnp.zeros_like)
        var = map_array(var, jnp.ones_like)
    return tree_at(
        lambda m: (m.weight, m.bias, m.running_mean, m.running_var),
        layer,
        (fields["weight"], fields["bias"], State(mean), State(var)),
        is_leaf=_is_none,
    )


@_fields.register(tmnn.SpectralNorm)
def _(layer: tmnn.SpectralNorm[Any]) -> dict[str, Any]:
    # The singular-vector estimates are Equinox's `uv_index` state.
    return {
        "layer": layer.layer,
        "uv_index": State((layer.u.value, layer.v.value)),
        "inference": layer.inference,
    }


@_from_fields.register(tmnn.SpectralNorm)
def _(layer: tmnn.SpectralNorm[Any], fields: dict[str, Any]) -> Any:
    u, v = fields["uv_index"].value
    return tree_at(lambda m: (m.layer, m.u, m.v), layer, (fields["layer"], State(u), State(v)))


# This namespace's layers hold their parameters as Equinox's do: Equinox's layout is their own
# (registered so that the treemod layers they subclass do not convert them).


def _weight_and_bias(layer: Any) -> dict[str, Any]:
    return {"weight": layer.weight, "bias": layer.bias}


def _with_weight_and_bias(layer: Any, fields: dict[str, Any]) -> Any:
    new = (fields["weight"], fields["bias"])
    return tree_at(lambda m: (m.weight, m.bias), layer, new, is_leaf=_is_none)


for _kind in (eqxnn.Conv, eqxnn.ConvTranspose):
    _fields.register(_kind, _weight_and_bias)
    _from_fields.register(_kind, _with_weight_and_bias)


@_fields.register
def _(layer: eqxnn.PReLU) -> dict[str, Any]:
    return {"negative_slope": layer.negative_slope}


@_from_fields.register
def _(layer: eqxnn.PReLU, fields: dict[str, Any]) -> Any:
    return tree_at(lambda m: m.negative_slope, layer, fields["negative_slope"])
