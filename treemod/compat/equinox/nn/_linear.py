"""Equinox's `Linear` and `Dropout`: Equinox's draws, zero sizes, `Dropout(deterministic=...)`."""

from __future__ import annotations

import math
import warnings
from typing import Any, Literal

import jax

from treemod._compat_api import default_dtype, require_key
from treemod.nn import Dropout as _Dropout
from treemod.nn import Linear as _Linear

from ._alias import CompatLayerMeta
from ._init import equinox_uniform

__all__ = ["Linear", "Dropout"]


class Linear(_Linear, metaclass=CompatLayerMeta, shapecheck=False):
    """`treemod.nn.Linear` with Equinox's initialisation, zero sizes and no shape checks.

    The parameters are Equinox's for the same key in every dtype: U(±1/sqrt(in_features))
    drawn in the parameter dtype (treemod's own layer draws in float32 and casts). treemod's
    own `Linear` refuses a size of 0 as a likely mistake; Equinox accepts it, so the compat
    layer does too (bound 1 when `in_features` is 0). As in Equinox, a `"scalar"` layer takes
    Python numbers, and the projections inside `MultiheadAttention` and `MLP` are this class,
    so they and a user's `Linear` can be compared, swapped and shared.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.nn.Linear(0, 4, key=jax.random.key(0))(jnp.zeros(0)).shape
        (4,)
        >>> eqx.nn.Linear("scalar", 2, key=jax.random.key(0))(0.5).shape
        (2,)
    """

    _treemod_layer = _Linear

    def __init__(
        self,
        in_features: int | Literal["scalar"],
        out_features: int | Literal["scalar"],
        use_bias: bool = True,
        dtype: Any = None,
        *,
        key: Any,
    ) -> None:
        n_in = 1 if in_features == "scalar" else in_features
        lim = 1.0 if n_in == 0 else 1 / math.sqrt(n_in)  # an invalid size: treemod's message
        init = equinox_uniform(lim)
        if in_features != 0 and out_features != 0:
            super().__init__(
                in_features,
                out_features,
                use_bias,
                dtype,
                weight_init=init,
                bias_init=init,
                key=key,
            )
            return
        require_key("Linear", key)
        dtype = default_dtype("Linear", dtype, complex_ok=True)
        n_out = 1 if out_features == "scalar" else int(out_features)
        wkey, bkey = jax.random.split(key, 2)
        self.weight = init(wkey, (n_out, int(n_in)), dtype)
        self.bias = init(bkey, (n_out,), dtype) if use_bias else None
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = use_bias


class Dropout(_Dropout, metaclass=CompatLayerMeta, shapecheck=False):
    """`treemod.nn.Dropout`, also accepting Equinox's deprecated `deterministic=` argument.

    `MultiheadAttention.dropout` is this class too.

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.nn.Dropout(0.5, inference=True)(jnp.ones(2))
        Array([1., 1.], dtype=float32)
    """

    _treemod_layer = _Dropout

    def __init__(
        self, p: float = 0.5, inference: bool = False, *, deterministic: bool | None = None
    ) -> None:
        if deterministic is not None:
            warnings.warn(
                "Dropout(deterministic=...) is deprecated; use Dropout(inference=...) instead.",
                DeprecationWarning,
                stacklevel=3,
            )
            inference = deterministic
        self.p = p
        self.inference = inference
