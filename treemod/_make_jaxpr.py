"""`filter_make_jaxpr`: the jaxpr of a function of arbitrary pytrees, for reading or debugging."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu

from ._callable import is_abstract_array, merge_leaves

__all__ = ["filter_make_jaxpr"]


def filter_make_jaxpr(fun: Callable[..., Any]) -> Callable[..., tuple[Any, Any, Any]]:
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
        and every other leaf by `None`; and the output with every array replaced by `None`.
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
    def make_jaxpr(*args: Any, **kwargs: Any) -> tuple[Any, Any, Any]:
        leaves, treedef = jtu.tree_flatten((args, kwargs))
        mask = tuple(is_abstract_array(x) for x in leaves)
        dynamic = [x for x, m in zip(leaves, mask, strict=True) if m]
        static = [x for x, m in zip(leaves, mask, strict=True) if not m]
        out_box: list[tuple[Any, list[bool], list[Any]]] = []

        def inner(dyn: list) -> list[Any]:
            a, k = jtu.tree_unflatten(treedef, merge_leaves(mask, dyn, static))
            out_leaves, out_def = jtu.tree_flatten(fun(*a, **k))
            out_mask = [is_abstract_array(x) for x in out_leaves]
            out_box.append((out_def, out_mask, out_leaves))
            return [x for x, m in zip(out_leaves, out_mask, strict=True) if m]

        jaxpr, shapes = jax.make_jaxpr(inner, return_shape=True)(dynamic)
        out_def, out_mask, out_leaves = out_box[-1]
        out_static = [x for x, m in zip(out_leaves, out_mask, strict=True) if not m]
        nones = [None] * len(out_static)
        out_struct = jtu.tree_unflatten(out_def, merge_leaves(out_mask, shapes, nones))
        out_rest = jtu.tree_unflatten(
            out_def, merge_leaves(out_mask, [None] * len(shapes), out_static)
        )
        return jaxpr, out_struct, out_rest

    return make_jaxpr
