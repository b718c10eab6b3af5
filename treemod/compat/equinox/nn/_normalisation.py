"""Equinox's `LayerNorm`, `GroupNorm`, `RMSNorm`: treemod's layers computing Equinox's formulas.

Parameters and initialisation are treemod's, which match Equinox's. The arithmetic is Equinox's
own, so that gradients round as Equinox's do, not only outputs: Equinox takes the variance
with `jnp.var` (which computes the mean again, a second path for the gradient) clipped at 0,
where treemod's layers take PyTorch's `mean((x - mean)**2)` of the one mean; and it computes on
the one example it is given, where treemod's core runs on a batch of one (an extra axis that
older XLA versions reduce in another order). A training run through these layers gives
Equinox's losses bit for bit (`tests/compat/test_equinox_programs.py`).

Leading batch axes (which treemod accepts and Equinox does not) are `jax.vmap`ped over the
one-example formula, as a user vmaps Equinox's layer. Inputs the formula does not fit
(a wrong shape, channels-last input) go to treemod's layer, for its errors and its layouts.
Each layer also accepts an optional state and hands it back unchanged (`y, state = norm(x,
state)`), so it can stand where a stateful layer could.
"""

from __future__ import annotations

import functools as ft
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from treemod._compat_api import promote_input
from treemod.nn import GroupNorm as _GroupNorm
from treemod.nn import LayerNorm as _LayerNorm
from treemod.nn import RMSNorm as _RMSNorm

from ._alias import CompatLayerMeta

__all__ = ["LayerNorm", "GroupNorm", "RMSNorm"]

_NO_STATE: Any = object()


def _float_dtype(x: Any) -> Any:
    with jax.numpy_dtype_promotion("standard"):
        return jnp.result_type(x.dtype, jnp.float32)


def _layer_norm(x: Any, weight: Any, bias: Any, eps: float) -> Any:
    """Equinox's `LayerNorm` on one example."""
    dtype = _float_dtype(x)
    xf = x.astype(dtype)
    mean = jnp.mean(xf, keepdims=True)
    variance = jnp.maximum(0.0, jnp.var(xf, keepdims=True))
    out = (xf - mean) * lax.rsqrt(variance + eps)
    if weight is not None:
        out = weight.astype(dtype) * out
    if bias is not None:
        out = out + bias.astype(dtype)
    return out.astype(x.dtype)


def _rms_norm(x: Any, weight: Any, bias: Any, eps: float) -> Any:
    """Equinox's `RMSNorm` on one example."""
    dtype = _float_dtype(x)
    xf = x.astype(dtype)
    out = lax.rsqrt(jnp.mean(xf**2) + eps) * xf
    if weight is not None:
        out = weight.astype(dtype) * out
    if bias is not None:
        out = out + bias.astype(dtype)
    return out.astype(x.dtype)


def _left_broadcast(v: Any, shape: tuple[int, ...]) -> Any:
    return jnp.broadcast_to(v.reshape(v.shape + (1,) * (len(shape) - v.ndim)), shape)


def _group_norm(x: Any, weight: Any, bias: Any, eps: float, groups: int) -> Any:
    """Equinox's `GroupNorm` on one example `(channels, *spatial)`."""
    dtype = _float_dtype(x)
    xf = x.astype(dtype)
    y = xf.reshape(groups, xf.shape[0] // groups, *xf.shape[1:])
    mean = jax.vmap(ft.partial(jnp.mean, keepdims=True))(y)
    variance = jnp.maximum(0.0, jax.vmap(ft.partial(jnp.var, keepdims=True))(y))
    out = ((y - mean) * lax.rsqrt(variance + eps)).reshape(xf.shape)
    if weight is not None and bias is not None:
        out = _left_broadcast(weight, out.shape).astype(dtype) * out + _left_broadcast(
            bias, out.shape
        ).astype(dtype)
    return out.astype(x.dtype)


def _over_batch(formula: Callable[[Any], Any], x: Any, batch_ndim: int) -> Any:
    """`formula` of one example applied to `x` with `batch_ndim` leading batch axes."""
    for _ in range(batch_ndim):
        formula = jax.vmap(formula)
    return formula(x)


def _over_trailing_shape(
    layer: Any, formula: Callable[..., Any], x: Any, treemod_call: Callable[[Any], Any]
) -> Any:
    """`formula` (Equinox's, for one example) over `x`'s leading axes when `x` ends in the
    layer's `shape`; any other input goes to treemod's layer, whose error names it."""
    x = promote_input(x, None if layer.weight is None else layer.weight.dtype)
    k = len(layer.shape)
    if x.ndim >= k and tuple(x.shape[x.ndim - k :]) == layer.shape:
        one = ft.partial(formula, weight=layer.weight, bias=layer.bias, eps=layer.eps)
        return _over_batch(one, x, x.ndim - k)
    return treemod_call(x)


class LayerNorm(_LayerNorm, metaclass=CompatLayerMeta, shapecheck=False):
    """`treemod.nn.LayerNorm` with Equinox's arithmetic, also callable with a `State`.

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.nn.LayerNorm(2)(jnp.array([1.0, 3.0]))
        Array([-0.99999..., 0.99999...], dtype=float32)
    """

    _treemod_layer = _LayerNorm

    def __call__(self, x: Any, state: Any = _NO_STATE, *, key: Any = None) -> Any:
        """Normalise `x` (`shape`, or `(*batch, *shape)`); with a `state`, return `(y, state)`."""
        y = _over_trailing_shape(self, _layer_norm, x, super().__call__)
        return y if state is _NO_STATE else (y, state)


class RMSNorm(_RMSNorm, metaclass=CompatLayerMeta, shapecheck=False):
    """`treemod.nn.RMSNorm` with Equinox's arithmetic, also callable with a `State`.

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.nn.RMSNorm(2)(jnp.array([3.0, 4.0])).shape
        (2,)
    """

    _treemod_layer = _RMSNorm

    def __call__(self, x: Any, state: Any = _NO_STATE, *, key: Any = None) -> Any:
        """Normalise `x` (`shape`, or `(*batch, *shape)`); with a `state`, return `(y, state)`."""
        y = _over_trailing_shape(self, _rms_norm, x, super().__call__)
        return y if state is _NO_STATE else (y, state)


class GroupNorm(_GroupNorm, metaclass=CompatLayerMeta, shapecheck=False):
    """`treemod.nn.GroupNorm` with Equinox's arithmetic on `(C, *spatial)`, also with a `State`.

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.nn.GroupNorm(2, 4)(jnp.ones((4, 5))).shape
        (4, 5)
    """

    _treemod_layer = _GroupNorm

    def __call__(self, x: Any, state: Any = _NO_STATE, *, key: Any = None) -> Any:
        """Normalise `x` of shape `(channels, *spatial)`, or `(*batch, channels, *spatial)`
        with `spatial_ndim`; with a `state`, return `(y, state)`."""
        x = promote_input(x, None if self.weight is None else self.weight.dtype)
        nb = 0 if self.spatial_ndim is None else x.ndim - 1 - self.spatial_ndim
        c = x.shape[nb] if 0 <= nb < x.ndim else None
        fits = c is not None and c % self.groups == 0 and self.channels in (None, c)
        if fits and not self.channels_last:
            formula = ft.partial(
                _group_norm, weight=self.weight, bias=self.bias, eps=self.eps, groups=self.groups
            )
            y = _over_batch(formula, x, nb)
        else:
            y = super().__call__(x)  # channels last, or treemod's error
        return y if state is _NO_STATE else (y, state)
