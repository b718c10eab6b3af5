"""Forward and reverse mode for functions of arbitrary pytrees: `filter_jvp`, `filter_vjp`.

Equinox's API: unlike `filter_grad` (which differentiates the parameters of the first
argument, `derivatives.py`), these differentiate the floating-point arrays of every argument,
`None` standing for "no tangent" / "no cotangent".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from treemod._format.describe import describe_value
from treemod._format.paths import function_name
from treemod._private_apis import find_top_trace
from treemod._transforms.leaves import Split, merge_leaves, split_leaves, split_tree
from treemod._tree.filters import (
    IS_ARRAY_TYPE,
    is_inexact_traceable_array,
    is_inexact_traceable_array_like,
)

__all__ = ["filter_jvp", "filter_vjp"]


def _is_none(x: Any) -> bool:
    return x is None


def _leaves_against(tree: Any, like: Any, what: str, error: str) -> list[tuple[Any, Any]]:
    """`(path, leaf)` of `tree`, one per leaf of `like` (whose `None`s count as leaves).

    `tree` has the structure of `like`, except that a `None` in it may stand for a whole
    subtree of `like` (it then gives `None` at each of that subtree's leaves).
    """
    try:
        filled = jtu.tree_map(
            lambda t, x: jtu.tree_map(lambda _: None, x) if t is None else t,
            tree,
            like,
            is_leaf=_is_none,
        )
    except ValueError as e:
        raise ValueError(f"{error}: {what} does not have its structure ({e}).") from None
    paths, treedef = jtu.tree_flatten_with_path(filled, is_leaf=_is_none)
    if jtu.tree_structure(like, is_leaf=_is_none) != treedef:  # type: ignore[operator]
        raise ValueError(f"{error}: {what} does not have its structure ({treedef}).")
    return paths


def _trace_of(x: Any) -> Any:
    """The trace a tracer belongs to (`None` for a concrete value)."""
    return getattr(x, "_trace", None) if isinstance(x, jax.core.Tracer) else None


def filter_jvp(
    fn: Callable[..., Any], primals: Sequence[Any], tangents: Sequence[Any], **kwargs: Any
) -> tuple[Any, Any]:
    """Forward-mode differentiation (`jax.jvp`) of a function of arbitrary pytrees.

    Each leaf of `primals` with a tangent (not `None`) is differentiated; it must be a
    floating-point array or a Python `float`/`complex`, and its tangent an array of the same
    shape and dtype (or a Python number). Leaves whose tangent is `None` (non-array leaves must
    have `None`) are held constant. Keyword arguments are not differentiated.

    Arguments:
        fn: the function (or module) to differentiate.
        primals: the positional arguments, a tuple or list.
        tangents: their tangents, with the structure of `primals` and `None` wherever a leaf
            is not differentiated.
        **kwargs: keyword arguments of `fn`.

    Returns:
        `(out, tangent_out)`: `fn`'s output, and its tangent, with the structure of `out` and
        `None` at every leaf that is not a floating-point array or does not depend on a
        differentiated input (a symbolic zero).

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> def f(params, x, act):
        ...     return {"y": act(params["w"] * x), "label": "out"}
        >>> params = {"w": jnp.float32(2.0)}
        >>> out, tangent = tm.filter_jvp(
        ...     f, (params, jnp.float32(3.0), jnp.sin), ({"w": jnp.float32(1.0)}, None, None)
        ... )
        >>> tangent["y"], tangent["label"]  # d/dw sin(w * x) = x cos(w * x)
        (Array(2.8805108, dtype=float32), None)
    """
    name = function_name(fn)
    if not isinstance(primals, tuple | list) or not isinstance(tangents, tuple | list):
        raise TypeError(
            f"filter_jvp({name}): `primals` and `tangents` must be tuples (or lists) of the "
            f"positional arguments; got {type(primals).__name__} and {type(tangents).__name__}."
        )
    primals, tangents = tuple(primals), tuple(tangents)
    p_leaves, p_def = jtu.tree_flatten(primals, is_leaf=_is_none)
    t_paths = _leaves_against(
        tangents,
        primals,
        "`tangents`",
        f"filter_jvp({name}): `tangents` must have the structure of `primals`, with None where "
        "a leaf (or a whole subtree) is not differentiated",
    )
    diff_at: list[int] = []
    diff_tangents: list[Any] = []
    for i, (p, (path, t)) in enumerate(zip(p_leaves, t_paths, strict=True)):
        if t is None:
            continue
        where = "primals" + jtu.keystr(path)
        if not is_inexact_traceable_array_like(p):
            raise TypeError(
                f"filter_jvp({name}): {where} is {describe_value(p)}, which cannot be "
                "differentiated; give it the tangent None."
            )
        # Python floats and complex numbers are differentiated as the arrays JAX makes of them.
        p = p_leaves[i] = jnp.asarray(p)
        if isinstance(t, float | complex):
            t = jnp.asarray(t, p.dtype)
        if not IS_ARRAY_TYPE[type(t)] or jnp.shape(t) != p.shape or t.dtype != p.dtype:
            # As jax.jvp: a wrong type or dtype is a TypeError, a wrong shape a ValueError.
            wrong_type = not IS_ARRAY_TYPE[type(t)] or t.dtype != p.dtype
            raise (TypeError if wrong_type else ValueError)(
                f"filter_jvp({name}): the tangent of {where} must be an array of its shape and "
                f"dtype, {describe_value(p)}; got {describe_value(t)}."
            )
        diff_tangents.append(t)
        diff_at.append(i)
    out_split: list[Split] = []
    perturbed: list[list[bool]] = []

    def inner(*diff: Any) -> list[Any]:
        leaves = list(p_leaves)
        for i, d in zip(diff_at, diff, strict=True):
            leaves[i] = d
        arrays, split = split_tree(fn(*jtu.tree_unflatten(p_def, leaves), **kwargs))
        out_split.append(split)
        # An output carries a tangent only if it is a tracer of this jvp (it depends on a
        # differentiated input); the others, even tracers of an enclosing jvp, get None.
        trace = find_top_trace(diff) if diff else None
        perturbed.append(
            [
                trace is not None and is_inexact_traceable_array(a) and _trace_of(a) is trace
                for a in arrays
            ]
        )
        return arrays

    diff_primals = tuple(p_leaves[i] for i in diff_at)
    out, tangent_out = jax.jvp(inner, diff_primals, tuple(diff_tangents))
    split = out_split[-1]
    tangent_out = [t if d else None for d, t in zip(perturbed[-1], tangent_out, strict=True)]
    return split.rebuild(out), split.rebuild(tangent_out, static_as_none=True)


def filter_vjp(fn: Callable[..., Any], *primals: Any, has_aux: bool = False) -> tuple[Any, ...]:
    """Reverse-mode differentiation (`jax.vjp`) of a function of arbitrary pytrees.

    The floating-point arrays of `primals` are differentiated; every other leaf is held
    constant (non-array leaves such as activation functions are passed through as they are).

    Arguments:
        fn: the function (or module) to differentiate.
        *primals: its positional arguments.
        has_aux: whether `fn` returns `(out, aux)`; `aux` is returned, not differentiated.

    Returns:
        `(out, vjp_fn)`, or `(out, vjp_fn, aux)` with `has_aux`. `vjp_fn(cotangent)` takes a
        cotangent with the structure of `out` (`None` at leaves that are not floating-point
        arrays, or to mean zero) and returns a tuple with one cotangent per primal, each with
        the primal's structure and `None` at every leaf that is not a floating-point array.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> def f(params, x, act):
        ...     return act(params["w"] * x)
        >>> out, vjp_fn = tm.filter_vjp(f, {"w": jnp.float32(2.0)}, jnp.float32(3.0), jnp.sin)
        >>> ct_params, ct_x, ct_act = vjp_fn(jnp.float32(1.0))
        >>> ct_params["w"], ct_act  # d/dw sin(w * x) = x cos(w * x)
        (Array(2.8805108, dtype=float32), None)
    """
    name = function_name(fn)
    diff, primal_split = split_tree(primals, is_inexact_traceable_array)
    box: list[Any] = []

    def inner(*d: Any) -> tuple[list[Any], Any]:
        out = fn(*primal_split.rebuild(d))
        if has_aux:
            if not (isinstance(out, tuple) and len(out) == 2):
                raise TypeError(
                    f"filter_vjp({name}, has_aux=True): the function must return a pair "
                    f"(output, aux); got {type(out).__name__}."
                )
            out, aux = out
        else:
            aux = None
        arrays, out_split = split_tree(out)
        aux_arrays, aux_split = split_tree(aux)
        inexact = [is_inexact_traceable_array(a) for a in arrays]
        box[:] = [out_split, aux_split, inexact]
        # Only floating-point outputs have cotangents; the other arrays leave as auxiliary data.
        diff_out, other_out = split_leaves(arrays, inexact)
        return diff_out, (other_out, aux_arrays)

    diff_out, pullback, (other_out, aux_arrays) = jax.vjp(inner, *diff, has_aux=True)
    out_split, aux_split, inexact = box
    out = out_split.rebuild(merge_leaves(inexact, diff_out, other_out))
    aux = aux_split.rebuild(aux_arrays)

    def vjp_fn(cotangent: Any) -> tuple[Any, ...]:
        c_paths = _leaves_against(
            cotangent,
            out,
            "the cotangent",
            f"filter_vjp({name}): the cotangent must have the structure of the output, with "
            "None at leaves (or whole subtrees) without one",
        )
        o_leaves = jtu.tree_leaves(out, is_leaf=_is_none)
        cts = []
        for (path, c), o in zip(c_paths, o_leaves, strict=True):
            if not is_inexact_traceable_array(o):
                if c is not None:
                    raise TypeError(
                        f"filter_vjp({name}): the output{jtu.keystr(path)} is {describe_value(o)}, "
                        "which has no cotangent; pass None there."
                    )
                continue
            if c is None:
                cts.append(jnp.zeros_like(o))
            elif not IS_ARRAY_TYPE[type(c)] or jnp.shape(c) != o.shape or c.dtype != o.dtype:
                raise ValueError(
                    f"filter_vjp({name}): the cotangent of the output{jtu.keystr(path)} must be "
                    f"an array of its shape and dtype, {describe_value(o)}; "
                    f"got {describe_value(c)}."
                )
            else:
                cts.append(c)
        grads = pullback(cts)
        return tuple(primal_split.rebuild(grads, static_as_none=True))

    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)
