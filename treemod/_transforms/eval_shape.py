"""`filter_eval_shape`: the output's shapes and dtypes, for any pytree, without computing it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from treemod._transforms.leaves import is_abstract_array, pack_output, split_tree

__all__ = ["filter_eval_shape"]


def filter_eval_shape(fun: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run `fun` abstractly: arrays in the output become `jax.ShapeDtypeStruct`s.

    Nothing is computed and no memory is allocated, so this is how to build an abstract model
    (for example to restore a checkpoint into, or to inspect parameter counts). Arrays in the
    arguments may themselves be `jax.ShapeDtypeStruct`s; non-array leaves are passed through
    and kept in the output.

    Arguments:
        fun: the function (or module) to evaluate.
        *args: its positional arguments.
        **kwargs: its keyword arguments.

    Returns:
        `fun`'s output with every array replaced by a `jax.ShapeDtypeStruct`.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> class Linear(tm.Module):
        ...     w: jax.Array
        ...     name: str
        >>> make = lambda key, n: Linear(jax.random.normal(key, (n, n)), "dense")
        >>> abstract = tm.filter_eval_shape(make, jax.random.key(0), 1000)
        >>> abstract.w, abstract.name
        (ShapeDtypeStruct(shape=(1000, 1000), dtype=float32), 'dense')
    """
    dynamic, split = split_tree((fun, args, kwargs), is_abstract_array)

    def inner(dyn: list[Any]) -> Any:
        f, a, k = split.rebuild(dyn)
        return pack_output(f(*a, **k))

    return jax.eval_shape(inner, dynamic)
