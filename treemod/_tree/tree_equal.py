"""`tree_equal`: whether pytrees have the same structure and equal leaves."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from treemod._tree.filters import IS_ARRAY_TYPE

__all__ = ["compare_trees", "tree_equal"]

_NUMPY = (np.ndarray, np.generic)


def _leaves_equal(
    x: Any, y: Any, rtol: float, atol: float, typematch: bool, jax_scalars: bool
) -> Any:
    if typematch and type(x) is not type(y):
        return False
    # Concrete arrays only: `jax.ShapeDtypeStruct` leaves have no values and compare with `==`.
    x_array, y_array = IS_ARRAY_TYPE[type(x)], IS_ARRAY_TYPE[type(y)]
    if x_array != y_array:
        return False
    if not x_array:
        return x == y
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):  # keys: equal bits, no tolerance
        x, y, rtol, atol = jax.random.key_data(x), jax.random.key_data(y), 0.0, 0.0
    jax_side = not (isinstance(x, _NUMPY) and isinstance(y, _NUMPY))
    if (
        isinstance(x, jax.core.Tracer)
        or isinstance(y, jax.core.Tracer)
        or (jax_scalars and jax_side)
    ):
        if rtol == 0 and atol == 0:
            return jnp.all(x == y)
        return jnp.allclose(x, y, rtol=rtol, atol=atol)
    x, y = np.asarray(x), np.asarray(y)
    if rtol == 0 and atol == 0:
        return bool(np.array_equal(x, y))
    return bool(np.allclose(x, y, rtol=rtol, atol=atol))


def tree_equal(*pytrees: Any, typematch: bool = False, rtol: float = 0.0, atol: float = 0.0) -> Any:
    """Whether all `pytrees` have the same structure and equal leaves.

    Arrays must match in shape, dtype and values (within `rtol`/`atol` if given; typed PRNG
    keys by their bits, exactly); other leaves are compared with `==`.

    Arguments:
        *pytrees: the trees to compare.
        typematch: also require leaves to have the same type (`np.ndarray` and `jax.Array`
            leaves with equal values then differ).
        rtol: relative tolerance for array values.
        atol: absolute tolerance for array values.

    Returns:
        A Python `bool`, or a traced boolean scalar when called on tracers inside a transform.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> tm.tree_equal([jnp.ones(2), "a"], [jnp.ones(2), "a"])
        True
        >>> tm.tree_equal(jnp.ones(2), jnp.ones(2) + 1e-7, atol=1e-6)
        True
    """
    return compare_trees(pytrees, typematch, rtol, atol, jax_scalars=False)


def compare_trees(
    pytrees: tuple[Any, ...], typematch: bool, rtol: float, atol: float, *, jax_scalars: bool
) -> Any:
    """`tree_equal`'s work; `jax_scalars=True` gives Equinox's result types.

    With it, comparing JAX arrays gives a JAX boolean scalar even outside transforms (as
    `equinox.tree_equal` does); NumPy-only comparisons and mismatches stay Python bools.
    """
    if not pytrees:
        raise TypeError("tree_equal() needs at least one pytree to compare.")
    first, *rest = pytrees
    leaves0, treedef0 = jtu.tree_flatten(first)
    result: Any = True
    for other in rest:
        leaves, treedef = jtu.tree_flatten(other)
        if treedef != treedef0:  # type: ignore[operator]
            return False
        for x, y in zip(leaves0, leaves, strict=True):
            eq = _leaves_equal(x, y, rtol, atol, typematch, jax_scalars)
            if eq is False:
                return False
            if eq is not True:
                result = eq if result is True else result & eq
    return result
