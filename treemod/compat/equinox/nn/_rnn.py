"""Equinox's `GRUCell` and `LSTMCell`: treemod's cells with Equinox's draws, unchecked."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from treemod.nn import GRUCell as _GRUCell
from treemod.nn import LSTMCell as _LSTMCell

from ._alias import CompatLayerMeta
from ._init import equinox_uniform, placeholder

__all__ = ["GRUCell", "LSTMCell"]


def _equinox_draws(cell: Any, dtype: Any, keys: Any, names: tuple[str, ...]) -> None:
    """Draw `cell`'s parameters `names` as Equinox does: U(±1/sqrt(hidden)) in `dtype`."""
    init = equinox_uniform(math.sqrt(1 / cell.hidden_size) if cell.hidden_size > 0 else 0.0)
    for name, k in zip(names, keys, strict=False):
        old = getattr(cell, name)
        if old is not None:
            object.__setattr__(cell, name, init(k, old.shape, dtype))


def _real(dtype: Any) -> Any:
    # treemod's cells take real dtypes; Equinox's draw complex ones too (real and imaginary
    # parts), so a complex cell is built real and drawn complex.
    if dtype is not None and jnp.issubdtype(dtype, jnp.complexfloating):
        return jnp.finfo(dtype).dtype
    return dtype


class GRUCell(_GRUCell, metaclass=CompatLayerMeta, shapecheck=False):
    """`treemod.nn.GRUCell` whose parameters are Equinox's for the same key, in every dtype.

    U(±1/sqrt(hidden_size)) drawn in the parameter dtype (treemod's draws in float32 and casts),
    complex dtypes included, as in Equinox.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> cell = eqx.nn.GRUCell(3, 4, dtype=jnp.bfloat16, key=jax.random.key(0))
        >>> cell(jnp.ones(3, jnp.bfloat16), jnp.zeros(4, jnp.bfloat16)).shape
        (4,)
    """

    _treemod_layer = _GRUCell

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        use_bias: bool = True,
        dtype: Any = None,
        *,
        key: Any,
    ) -> None:
        super().__init__(
            input_size,
            hidden_size,
            use_bias,
            _real(dtype),
            weight_init=placeholder,
            bias_init=placeholder,
            key=key,
        )
        names = ("weight_ih", "weight_hh", "bias", "bias_n")
        dtype = self.weight_ih.dtype if dtype is None else dtype
        _equinox_draws(self, dtype, jax.random.split(key, 4), names)


class LSTMCell(_LSTMCell, metaclass=CompatLayerMeta, shapecheck=False):
    """`treemod.nn.LSTMCell` whose parameters are Equinox's for the same key, in every dtype.

    U(±1/sqrt(hidden_size)) drawn in the parameter dtype, from Equinox's three keys
    (`weight_ih`, `weight_hh`, `bias`; treemod's own cell splits its key into four).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> cell = eqx.nn.LSTMCell(3, 4, key=jax.random.key(0))
        >>> h, c = cell(jnp.ones(3), (jnp.zeros(4), jnp.zeros(4)))
        >>> h.shape, c.shape
        ((4,), (4,))
    """

    _treemod_layer = _LSTMCell

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        use_bias: bool = True,
        dtype: Any = None,
        *,
        key: Any,
    ) -> None:
        super().__init__(
            input_size,
            hidden_size,
            use_bias,
            _real(dtype),
            weight_init=placeholder,
            bias_init=placeholder,
            key=key,
        )
        dtype = self.weight_ih.dtype if dtype is None else dtype
        _equinox_draws(self, dtype, jax.random.split(key, 3), ("weight_ih", "weight_hh", "bias"))
