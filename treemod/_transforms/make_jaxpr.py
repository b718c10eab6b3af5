"""`filter_make_jaxpr`: the jaxpr of a function of arbitrary pytrees, for reading or debugging."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from treemod._transforms.leaves import Split, is_abstract_array, split_tree
from treemod._transforms.wrapper import P

__all__ = ["filter_make_jaxpr"]


def filter_make_jaxpr(fun: Callable[P, Any]) -> Callable[P, tuple[Any, Any, Any]]:
    """Like `jax.make_jaxpr`, for functions of arbitrary pytrees (Equinox's API).

    Arrays in the arguments (and `jax.ShapeDtypeStruct`s, which stand for arrays) are the
    jaxpr's inputs; every other leaf is static, fixed in the jaxpr. This is the program
    `filter_jit` would hand to XLA, before lowering: use it to count operations or to see what
    a model traces to.

    Arguments:
        fun: the function (or module) to trace.

    Returns:
        A function taking `fun`'s arguments and returning `(jaxpr, out_struct, out_static)`:
        the `ClosedJaxpr`; the output with every array replaced by a `jax.ShapeDtypeStruct`
        and every other leaf by `None`; and the output with every array replaced by `None`
        (a `jax.ShapeDtypeStruct` that `fun` returns is such a static leaf).
        `treemod.combine(out_struct, out_static)` is the output's full description.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> def f(x, act):
        ...     return {"y": act(x) * 2, "act": act}
        >>> jaxpr, out_struct, out_static = tm.filter_make_jaxpr(f)(jnp.ones(3), jnp.sin)
        >>> " ".join(eqn.primitive.name for eqn in jaxpr.eqns)
        'sin mul'
        >>> out_struct["y"], out_static["act"] is jnp.sin
        (ShapeDtypeStruct(shape=(3,), dtype=float32), True)
    """

    @functools.wraps(fun)
    def make_jaxpr(*args: P.args, **kwargs: P.kwargs) -> tuple[Any, Any, Any]:
        dynamic, split = split_tree((args, kwargs), is_abstract_array)
        out_split: list[Split] = []

        def inner(dyn: list[Any]) -> list[Any]:
            a, k = split.rebuild(dyn)
            # In the output only arrays are traced: a ShapeDtypeStruct returned is static.
            arrays, out = split_tree(fun(*a, **k))
            out_split.append(out)
            return arrays

        jaxpr, shapes = jax.make_jaxpr(inner, return_shape=True)(dynamic)
        out = out_split[-1]
        out_struct = out.rebuild(shapes, static_as_none=True)
        return jaxpr, out_struct, out.rebuild([None] * len(shapes))

    return make_jaxpr
