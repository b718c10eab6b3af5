"""`apply_updates`: add an optimiser's updates to a model's arrays, keeping their dtypes."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu


def apply_updates(model: Any, updates: Any) -> Any:
    """Add `updates` (e.g. from an optax optimiser) to the arrays of `model`.

    Leaves whose update is `None` (non-differentiated parts, state, static values) are kept.
    Each sum is taken in the wider of the two dtypes and returned in the parameter's dtype, as
    `optax.apply_updates` does: a bfloat16 model stays bfloat16 under float32 updates.

    Arguments:
        model: the model (any pytree).
        updates: a tree with the structure of `model`, `None` where there is nothing to add.

    Returns:
        The updated model.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> tm.apply_updates({"w": jnp.ones(2), "act": "relu"}, {"w": jnp.ones(2), "act": None})
        {'act': 'relu', 'w': Array([2., 2.], dtype=float32)}
    """
    return jtu.tree_map(_add, updates, model, is_leaf=lambda x: x is None)


def _add(update: Any, param: Any) -> Any:
    if update is None:
        return param
    # Same dtypes (NumPy's included: float64 stays float64 and NumPy), a Python number, or a
    # parameter without a dtype: plain `+`.
    if not hasattr(param, "dtype") or getattr(update, "dtype", param.dtype) == param.dtype:
        return param + update
    with jax.numpy_dtype_promotion("standard"):  # mixing dtypes here is the point
        wide = jnp.promote_types(param.dtype, jnp.result_type(update))
    return (param.astype(wide) + jnp.asarray(update).astype(wide)).astype(param.dtype)
