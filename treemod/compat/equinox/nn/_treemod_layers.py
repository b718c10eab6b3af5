"""treemod's layers that the namespace offers unchanged, as compat classes: not shape-checked.

Equinox checks no annotations, so neither these nor a user's subclasses of them are checked
(the class option `shapecheck=False`, which subclasses inherit); instances of the treemod
layers still count as instances (`CompatLayerMeta`). `Identity`, `Shared` and `WeightNorm`
are Equinox's too; the N-d pools and `Stack` are treemod's additions.
"""

from __future__ import annotations

from treemod.nn import AdaptiveAvgPool as _AdaptiveAvgPool
from treemod.nn import AdaptiveMaxPool as _AdaptiveMaxPool
from treemod.nn import AvgPool as _AvgPool
from treemod.nn import Identity as _Identity
from treemod.nn import MaxPool as _MaxPool
from treemod.nn import Shared as _Shared
from treemod.nn import Stack as _Stack
from treemod.nn import WeightNorm as _WeightNorm

from ._alias import CompatLayerMeta

__all__ = [
    "AdaptiveAvgPool",
    "AdaptiveMaxPool",
    "AvgPool",
    "Identity",
    "MaxPool",
    "Shared",
    "Stack",
    "WeightNorm",
]


class Identity(_Identity, metaclass=CompatLayerMeta, shapecheck=False):
    """`treemod.nn.Identity`: returns its input (Python numbers too), as Equinox's.

    Example:
        >>> import treemod.compat.equinox as eqx
        >>> eqx.nn.Identity()(0.5)
        0.5
    """

    _treemod_layer = _Identity


class Shared(_Shared, metaclass=CompatLayerMeta, shapecheck=False):
    """`treemod.nn.Shared`: one stored copy of nodes tied together, as Equinox's.

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> shared = eqx.nn.Shared((jnp.ones(2), jnp.zeros(2)), lambda p: p[1], lambda p: p[0])
        >>> shared()[1]
        Array([1., 1.], dtype=float32)
    """

    _treemod_layer = _Shared


class WeightNorm(_WeightNorm, metaclass=CompatLayerMeta, shapecheck=False):  # type: ignore[type-arg]
    """`treemod.nn.WeightNorm`: a layer's weight as direction times norm, as Equinox's.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> wn = eqx.nn.WeightNorm(eqx.nn.Linear(3, 2, key=jax.random.key(0)))
        >>> wn(jnp.ones(3)).shape
        (2,)
    """

    _treemod_layer = _WeightNorm


class Stack(_Stack, metaclass=CompatLayerMeta, shapecheck=False):
    """`treemod.nn.Stack` (treemod's): identical layers stacked and run with `lax.scan`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> make = lambda k: eqx.nn.Linear(2, 2, key=k)
        >>> eqx.nn.Stack(make, 3, key=jax.random.key(0))(jnp.ones(2)).shape
        (2,)
    """

    _treemod_layer = _Stack


class AvgPool(_AvgPool, metaclass=CompatLayerMeta, shapecheck=False):
    """`treemod.nn.AvgPool` (treemod's N-d pool; Equinox's are `AvgPool1d` to `AvgPool3d`).

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.nn.AvgPool(1, 2, 2)(jnp.ones((1, 4))).shape
        (1, 2)
    """

    _treemod_layer = _AvgPool


class MaxPool(_MaxPool, metaclass=CompatLayerMeta, shapecheck=False):
    """`treemod.nn.MaxPool` (treemod's N-d pool; Equinox's are `MaxPool1d` to `MaxPool3d`).

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.nn.MaxPool(1, 2, 2)(jnp.ones((1, 4))).shape
        (1, 2)
    """

    _treemod_layer = _MaxPool


class AdaptiveAvgPool(_AdaptiveAvgPool, metaclass=CompatLayerMeta, shapecheck=False):
    """`treemod.nn.AdaptiveAvgPool` (treemod's N-d pool).

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.nn.AdaptiveAvgPool(2, 1)(jnp.ones((1, 6))).shape
        (1, 2)
    """

    _treemod_layer = _AdaptiveAvgPool


class AdaptiveMaxPool(_AdaptiveMaxPool, metaclass=CompatLayerMeta, shapecheck=False):
    """`treemod.nn.AdaptiveMaxPool` (treemod's N-d pool).

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.nn.AdaptiveMaxPool(2, 1)(jnp.ones((1, 6))).shape
        (1, 2)
    """

    _treemod_layer = _AdaptiveMaxPool
