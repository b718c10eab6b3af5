"""Equinox's `PReLU` over treemod's: the slope kept as given (a scalar by default)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jaxtyping import Array

from treemod.nn import PReLU as _PReLU

__all__ = ["PReLU"]


class PReLU(_PReLU, shapecheck=False):
    """Equinox's `nn.PReLU`: `negative_slope` is `jnp.asarray(init_alpha)`, a scalar for a number.

    treemod's `PReLU` stores one slope as shape `(1,)`; this one stores what Equinox stores, so
    its tree and checkpoint are Equinox's. The arithmetic is treemod's.

    Arguments:
        init_alpha: the initial slope: a number, or an array broadcastable against the input.

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> act = eqx.nn.PReLU()
        >>> act.negative_slope.shape, act(jnp.array([-2.0, 3.0]))
        ((), Array([-0.5,  3. ], dtype=float32))
    """

    negative_slope: Array

    def __init__(self, init_alpha: Any = 0.25) -> None:
        super().__init__(init_alpha)
        self.negative_slope = jnp.asarray(init_alpha)

    def __call__(self, x: Array, *, key: Any = None) -> Array:
        """Apply to `x` (Python numbers too); integers are promoted to the slope's dtype."""
        x = jnp.asarray(x)
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            slope = self.negative_slope.dtype
            x = x.astype(slope if jnp.issubdtype(slope, jnp.inexact) else jnp.float32)
        return super().__call__(x)
