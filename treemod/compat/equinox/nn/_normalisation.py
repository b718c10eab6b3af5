"""Equinox's `LayerNorm`, `GroupNorm`, `RMSNorm`: treemod's layers, also callable with a `State`.

Equinox's normalisation layers accept an optional state and hand it back unchanged
(`y, state = norm(x, state)`), so they can stand where a stateful layer could. Parameters,
initialisation and numerics are treemod's, which already match Equinox's.
"""

from __future__ import annotations

from typing import Any

from treemod.nn import GroupNorm as _GroupNorm
from treemod.nn import LayerNorm as _LayerNorm
from treemod.nn import RMSNorm as _RMSNorm

from ._alias import CompatLayerMeta

__all__ = ["LayerNorm", "GroupNorm", "RMSNorm"]

_NO_STATE: Any = object()


class LayerNorm(_LayerNorm, metaclass=CompatLayerMeta, shapecheck=False):
    """`treemod.nn.LayerNorm`, also callable as `y, state = ln(x, state)` (state unchanged).

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.nn.LayerNorm(2)(jnp.array([1.0, 3.0]))
        Array([-0.99999..., 0.99999...], dtype=float32)
    """

    _treemod_layer = _LayerNorm

    def __call__(self, x: Any, state: Any = _NO_STATE, *, key: Any = None) -> Any:
        """Normalise `x`; with a `state`, return `(y, state)`."""
        y = super().__call__(x)
        return y if state is _NO_STATE else (y, state)


class RMSNorm(_RMSNorm, metaclass=CompatLayerMeta, shapecheck=False):
    """`treemod.nn.RMSNorm`, also callable as `y, state = norm(x, state)` (state unchanged).

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.nn.RMSNorm(2)(jnp.array([3.0, 4.0])).shape
        (2,)
    """

    _treemod_layer = _RMSNorm

    def __call__(self, x: Any, state: Any = _NO_STATE, *, key: Any = None) -> Any:
        """Normalise `x`; with a `state`, return `(y, state)`."""
        y = super().__call__(x)
        return y if state is _NO_STATE else (y, state)


class GroupNorm(_GroupNorm, metaclass=CompatLayerMeta, shapecheck=False):
    """`treemod.nn.GroupNorm` on one example `(C, *spatial)`, also callable with a `State`.

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.nn.GroupNorm(2, 4)(jnp.ones((4, 5))).shape
        (4, 5)
    """

    _treemod_layer = _GroupNorm

    def __call__(self, x: Any, state: Any = _NO_STATE, *, key: Any = None) -> Any:
        """Normalise `x`; with a `state`, return `(y, state)`."""
        y = super().__call__(x)
        return y if state is _NO_STATE else (y, state)
