"""Equinox's `tree_equal` result types, for the compat namespace.

treemod's own `tree_equal` answers with a Python `bool` outside transforms; Equinox's answers
with a JAX boolean scalar whenever JAX arrays were compared. Programs written for Equinox may
rely on that (`isinstance(result, jax.Array)`, `result is True` only when static), so
`treemod.compat.equinox.tree_equal` gives Equinox's types; the comparison itself is treemod's.
"""

from __future__ import annotations

from typing import Any

from treemod._tree.tree_equal import compare_trees

__all__ = ["tree_equal"]


def tree_equal(*pytrees: Any, typematch: bool = False, rtol: Any = 0.0, atol: Any = 0.0) -> Any:
    """Whether all `pytrees` are equal, with Equinox's result types.

    Arguments:
        *pytrees: the trees to compare.
        typematch: also require leaves to have the same type.
        rtol: relative tolerance for array values.
        atol: absolute tolerance for array values.

    Returns:
        `False` when structures, types, shapes, dtypes or non-array leaves differ; a JAX
        boolean scalar when JAX arrays were compared; else a Python `bool`.

    Example:
        >>> import jax.numpy as jnp, numpy as np
        >>> import treemod.compat.equinox as eqx
        >>> eqx.tree_equal(jnp.ones(2), jnp.ones(2))
        Array(True, dtype=bool)
        >>> eqx.tree_equal(np.ones(2), np.ones(2)), eqx.tree_equal(jnp.ones(2), jnp.ones(3))
        (True, False)
    """
    return compare_trees(pytrees, typematch, rtol, atol, jax_scalars=True)
