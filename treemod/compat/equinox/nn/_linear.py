"""Equinox's `Linear` and `Dropout` signatures: zero sizes, and `Dropout(deterministic=...)`."""

from __future__ import annotations

import math
import warnings
from typing import Any, Literal

import jax

from treemod._compat_api import default_dtype, require_key
from treemod.nn import Dropout as _Dropout
from treemod.nn import Linear as _Linear
from treemod.nn import init as _init

from ._alias import CompatLayerMeta

__all__ = ["Linear", "Dropout"]


class Linear(_Linear, metaclass=CompatLayerMeta):
    """`treemod.nn.Linear`, also with Equinox's zero sizes (`Linear(0, 4)` maps `(0,)` to `(4,)`).

    treemod's own `Linear` refuses a size of 0 as a likely mistake; Equinox accepts it, so the
    compat layer does too, initialising as Equinox does (bound 1 when `in_features` is 0).
    The layer built is a `treemod.nn.Linear`, the same type as the projections that
    `MultiheadAttention` and `MLP` hold, so the two can be compared, swapped and shared.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.nn.Linear(0, 4, key=jax.random.key(0))(jnp.zeros(0)).shape
        (4,)
        >>> import treemod
        >>> type(eqx.nn.Linear(2, 4, key=jax.random.key(0))) is treemod.nn.Linear
        True
    """

    _treemod_layer = _Linear
    _builds_treemod_layer = True  # only `__init__` differs: instances are `treemod.nn.Linear`s

    def __init__(
        self,
        in_features: int | Literal["scalar"],
        out_features: int | Literal["scalar"],
        use_bias: bool = True,
        dtype: Any = None,
        *,
        key: Any,
    ) -> None:
        if in_features != 0 and out_features != 0:
            super().__init__(in_features, out_features, use_bias, dtype, key=key)
            return
        require_key("Linear", key)
        dtype = default_dtype("Linear", dtype, complex_ok=True)
        n_in = 1 if in_features == "scalar" else int(in_features)
        n_out = 1 if out_features == "scalar" else int(out_features)
        lim = 1.0 if n_in == 0 else 1 / math.sqrt(n_in)
        wkey, bkey = jax.random.split(key, 2)
        self.weight = _init.uniform(-lim, lim)(wkey, (n_out, n_in), dtype)
        self.bias = _init.uniform(-lim, lim)(bkey, (n_out,), dtype) if use_bias else None
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = use_bias


class Dropout(_Dropout, metaclass=CompatLayerMeta):
    """`treemod.nn.Dropout`, also accepting Equinox's deprecated `deterministic=` argument.

    The layer built is a `treemod.nn.Dropout`, the same type as `MultiheadAttention.dropout`.

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.nn.Dropout(0.5, inference=True)(jnp.ones(2))
        Array([1., 1.], dtype=float32)
    """

    _treemod_layer = _Dropout
    _builds_treemod_layer = True  # only `__init__` differs: instances are `treemod.nn.Dropout`s

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
