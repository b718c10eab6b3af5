"""Automatic differentiation of functions of arbitrary pytrees.

`filter_grad` and `filter_value_and_grad` differentiate the parameters of the first argument:
it is split with `is_param` (floating-point arrays outside `State`), and the gradient has
exactly the structure of `treemod.filter(first_argument, treemod.is_param)`, with `None` for
every other leaf, so it can go straight to an optax optimiser. `filter_jvp` (forward mode) and
`filter_vjp` (reverse mode, the pullback itself) are Equinox's: they differentiate the
floating-point arrays of every argument, `None` standing for "no tangent" / "no cotangent".
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, overload

import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from treemod._format.describe import describe_value
from treemod._format.paths import function_name
from treemod._module.state import is_param
from treemod._transforms.leaves import Split, merge_leaves, split_leaves, split_tree
from treemod._transforms.wrapper import P, TransformedFunction
from treemod._tree.filters import IS_ARRAY_TYPE, combine, is_inexact_array, partition

__all__ = [
    "filter_grad",
    "filter_hessian",
    "filter_jacfwd",
    "filter_jacrev",
    "filter_jvp",
    "filter_value_and_grad",
    "filter_vjp",
]


class _GradWrapper(TransformedFunction[P, Any]):
    """`fun` differentiated with respect to the parameters (`is_param`) of its first argument:
    by `jax.value_and_grad`, or by `jacobian` (`jax.jacfwd` or `jax.jacrev`) when given. `name`
    is the public function that made it (for messages only); `with_value` returns the value
    beside the gradient (`filter_value_and_grad`)."""

    def __init__(
        self,
        fun: Callable[P, Any],
        has_aux: bool,
        name: str,
        jacobian: Any = None,
        with_value: bool = False,
    ) -> None:
        self._fun: Callable[..., Any] = fun
        self._has_aux = has_aux
        self._name = name
        self._jacobian = jacobian
        self._with_value = with_value
        self._wraps(fun)

    def __call__(self, /, *args: P.args, **kwargs: P.kwargs) -> Any:
        if not args:
            raise TypeError(
                f"{self._name}: the function must be called with its first argument (the one "
                "being differentiated, usually the model) passed positionally."
            )
        x, rest = args[0], args[1:]
        diff, nondiff = partition(x, is_param)
        fun = self._fun

        def with_params(diff_x: Any) -> Any:
            return fun(combine(diff_x, nondiff), *rest, **kwargs)

        if self._jacobian is not None:
            if self._has_aux:  # JAX maps the aux too: its non-array leaves ride in the structure

                def with_split_aux(diff_x: Any) -> Any:
                    out, aux = with_params(diff_x)
                    return out, _SplitAux(*split_tree(aux))

                jac, aux = self._jacobian(with_split_aux, has_aux=True)(diff)
                return jac, aux.split.rebuild(aux.arrays)
            return self._jacobian(with_params)(diff)
        value, grads = jax.value_and_grad(with_params, has_aux=self._has_aux)(diff)
        if self._with_value:
            return value, grads
        if self._has_aux:
            return grads, value[1]
        return grads


@overload
def filter_value_and_grad(fun: Callable[P, Any], *, has_aux: bool = False) -> Callable[P, Any]: ...


@overload
def filter_value_and_grad(
    fun: None = None, *, has_aux: bool = False
) -> Callable[[Callable[P, Any]], Callable[P, Any]]: ...


def filter_value_and_grad(
    fun: Callable[P, Any] | None = None, *, has_aux: bool = False
) -> Callable[P, Any] | Callable[[Callable[P, Any]], Callable[P, Any]]:
    """Like `jax.value_and_grad`, differentiating the parameters of the first argument.

    Floating-point arrays of the first argument that are not inside a `State` are
    differentiated (`treemod.is_param`); the other arguments and leaves are not.

    Arguments:
        fun: a function whose first argument is the model (or any pytree) and which returns a
            scalar (or `(scalar, aux)` with `has_aux=True`). Omit it to use as a decorator
            with options.
        has_aux: whether `fun` returns `(value, aux)`.

    Returns:
        A function returning `(value, grads)` (`((value, aux), grads)` with `has_aux`), where
        `grads` has the structure of `treemod.filter(x, treemod.is_param)`.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> @tm.filter_value_and_grad
        ... def loss(params, x):
        ...     return jnp.sum(params["w"] * x) + params["n"]
        >>> value, grads = loss({"w": jnp.array([1.0, 2.0]), "n": 1}, jnp.array([3.0, 4.0]))
        >>> value
        Array(12., dtype=float32)
        >>> grads
        {'n': None, 'w': Array([3., 4.], dtype=float32)}
    """
    if fun is None:
        return functools.partial(filter_value_and_grad, has_aux=has_aux)
    return _GradWrapper(fun, has_aux, "filter_value_and_grad", with_value=True)


@overload
def filter_grad(fun: Callable[P, Any], *, has_aux: bool = False) -> Callable[P, Any]: ...


@overload
def filter_grad(
    fun: None = None, *, has_aux: bool = False
) -> Callable[[Callable[P, Any]], Callable[P, Any]]: ...


def filter_grad(
    fun: Callable[P, Any] | None = None, *, has_aux: bool = False
) -> Callable[P, Any] | Callable[[Callable[P, Any]], Callable[P, Any]]:
    """Like `jax.grad`, differentiating the parameters of the first argument.

    Floating-point arrays of the first argument outside any `State` are differentiated;
    every other leaf of it gets `None` in the gradient, so the gradient has exactly the
    structure of `treemod.filter(model, treemod.is_param)`: pass it to an optax optimiser
    together with those parameters.

    Arguments:
        fun: a function whose first argument is the model and which returns a scalar (or
            `(scalar, aux)` with `has_aux=True`). Omit it to use as a decorator with options.
        has_aux: whether `fun` returns `(value, aux)`; the wrapper then returns `(grads, aux)`.

    Returns:
        A function returning the gradient with respect to the first argument.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> class Scale(tm.Module):
        ...     w: jnp.ndarray
        ...     calls: tm.State
        ...     def __call__(self, x):
        ...         return self.w * x
        >>> model = Scale(jnp.array(2.0), tm.State(jnp.array(0.0)))
        >>> grads = tm.filter_grad(lambda m, x: m(x))(model, jnp.array(3.0))
        >>> grads.w, grads.calls
        (Array(3., dtype=float32, weak_type=True), None)
    """
    if fun is None:
        return functools.partial(filter_grad, has_aux=has_aux)
    return _GradWrapper(fun, has_aux, "filter_grad")


class _SplitAux:
    """An aux output as a pytree of its arrays alone, through any number of JAX's flattens."""

    def __init__(self, arrays: list[Any], split: Split) -> None:
        self.arrays = arrays
        self.split = split


jtu.register_pytree_node(_SplitAux, lambda a: (a.arrays, a.split), lambda s, c: _SplitAux(c, s))


@overload
def filter_jacfwd(fun: Callable[P, Any], *, has_aux: bool = False) -> Callable[P, Any]: ...


@overload
def filter_jacfwd(
    fun: None = None, *, has_aux: bool = False
) -> Callable[[Callable[P, Any]], Callable[P, Any]]: ...


def filter_jacfwd(
    fun: Callable[P, Any] | None = None, *, has_aux: bool = False
) -> Callable[P, Any] | Callable[[Callable[P, Any]], Callable[P, Any]]:
    """Like `jax.jacfwd` (forward mode), with respect to the parameters of the first argument.

    The parameters are those `filter_grad` differentiates (`treemod.is_param`); the other
    leaves of the first argument, and the other arguments, are held fixed. Forward mode costs
    one pass per parameter element: use it when there are fewer inputs than outputs.

    Arguments:
        fun: a function whose first argument is the model (or any pytree) and which returns
            an array or a pytree of arrays (or `(output, aux)` with `has_aux=True`). Omit it to
            use as a decorator with options.
        has_aux: whether `fun` returns `(output, aux)`; the wrapper then returns `(jac, aux)`.

    Returns:
        A function returning the Jacobian: the structure of the output, with each of its
        arrays replaced by a tree with the structure of `treemod.filter(x, treemod.is_param)`
        whose arrays have the output array's shape followed by the parameter's.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> f = lambda p, x: p["w"] * x + p["n"]
        >>> jac = tm.filter_jacfwd(f)({"w": jnp.array([1.0, 2.0]), "n": 1}, jnp.array([3.0, 4.0]))
        >>> jac["w"]
        Array([[3., 0.],
               [0., 4.]], dtype=float32)
        >>> jac["n"] is None
        True
    """
    if fun is None:
        return functools.partial(filter_jacfwd, has_aux=has_aux)
    return _GradWrapper(fun, has_aux, "filter_jacfwd", jax.jacfwd)


@overload
def filter_jacrev(fun: Callable[P, Any], *, has_aux: bool = False) -> Callable[P, Any]: ...


@overload
def filter_jacrev(
    fun: None = None, *, has_aux: bool = False
) -> Callable[[Callable[P, Any]], Callable[P, Any]]: ...


def filter_jacrev(
    fun: Callable[P, Any] | None = None, *, has_aux: bool = False
) -> Callable[P, Any] | Callable[[Callable[P, Any]], Callable[P, Any]]:
    """Like `jax.jacrev` (reverse mode), with respect to the parameters of the first argument.

    As `filter_jacfwd`, computed in reverse mode: one pass per output element, so use it when
    there are fewer outputs than inputs. The result has the same structure.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> f = lambda p: jnp.stack([p["w"].sum(), (p["w"] ** 2).sum()])
        >>> tm.filter_jacrev(f)({"w": jnp.array([1.0, 2.0]), "act": "relu"})["w"]
        Array([[1., 1.],
               [2., 4.]], dtype=float32)
    """
    if fun is None:
        return functools.partial(filter_jacrev, has_aux=has_aux)
    return _GradWrapper(fun, has_aux, "filter_jacrev", jax.jacrev)


@overload
def filter_hessian(fun: Callable[P, Any], *, has_aux: bool = False) -> Callable[P, Any]: ...


@overload
def filter_hessian(
    fun: None = None, *, has_aux: bool = False
) -> Callable[[Callable[P, Any]], Callable[P, Any]]: ...


def filter_hessian(
    fun: Callable[P, Any] | None = None, *, has_aux: bool = False
) -> Callable[P, Any] | Callable[[Callable[P, Any]], Callable[P, Any]]:
    """Like `jax.hessian`: `filter_jacfwd(filter_jacrev(fun))`, over the parameters of the
    first argument.

    Arguments:
        fun: a function whose first argument is the model and which returns a scalar (or
            `(scalar, aux)` with `has_aux=True`).
        has_aux: whether `fun` returns `(value, aux)`; the wrapper then returns
            `(hessian, aux)`.

    Returns:
        A function returning the Hessian, a tree of trees: `hessian[a][b]` (for parameter
        paths `a` and `b`) has the shape of parameter `a` followed by that of `b`.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> f = lambda p: (p["w"] ** 3).sum()
        >>> hessian = tm.filter_hessian(f)({"w": jnp.array([1.0, 2.0])})
        >>> d_w = hessian["w"]  # the derivatives of the gradient of w, a tree like the input
        >>> d_w["w"]
        Array([[ 6.,  0.],
               [ 0., 12.]], dtype=float32)
    """
    if fun is None:
        return functools.partial(filter_hessian, has_aux=has_aux)
    # The forward-mode Jacobian of the reverse-mode one, as `jax.hessian`.
    inner = filter_jacrev(fun, has_aux=has_aux)
    return _GradWrapper(inner, has_aux, "filter_hessian", jax.jacfwd)


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


def filter_jvp(
    fn: Callable[..., Any], primals: Sequence[Any], tangents: Sequence[Any], **kwargs: Any
) -> tuple[Any, Any]:
    """Forward-mode differentiation (`jax.jvp`) of a function of arbitrary pytrees.

    Each leaf of `primals` with a tangent (not `None`) is differentiated; it must be a
    floating-point array, and its tangent an array of the same shape and dtype. Leaves whose
    tangent is `None` (non-array leaves must have `None`) are held constant. Keyword arguments
    are not differentiated.

    Arguments:
        fn: the function (or module) to differentiate.
        primals: the positional arguments, a tuple or list.
        tangents: their tangents, with the structure of `primals` and `None` wherever a leaf
            is not differentiated.
        **kwargs: keyword arguments of `fn`.

    Returns:
        `(out, tangent_out)`: `fn`'s output, and its tangent, with the structure of `out` and
        `None` at every leaf that is not a floating-point array.

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
    for i, (p, (path, t)) in enumerate(zip(p_leaves, t_paths, strict=True)):
        if t is None:
            continue
        where = "primals" + jtu.keystr(path)
        if not is_inexact_array(p):
            raise TypeError(
                f"filter_jvp({name}): {where} is {describe_value(p)}, which cannot be "
                "differentiated; give it the tangent None."
            )
        if not IS_ARRAY_TYPE[type(t)] or jnp.shape(t) != p.shape or t.dtype != p.dtype:
            raise ValueError(
                f"filter_jvp({name}): the tangent of {where} must be an array of its shape and "
                f"dtype, {describe_value(p)}; got {describe_value(t)}."
            )
        diff_at.append(i)
    out_split: list[Split] = []

    def inner(*diff: Any) -> list[Any]:
        leaves = list(p_leaves)
        for i, d in zip(diff_at, diff, strict=True):
            leaves[i] = d
        arrays, split = split_tree(fn(*jtu.tree_unflatten(p_def, leaves), **kwargs))
        out_split.append(split)
        return arrays

    diff_primals = tuple(p_leaves[i] for i in diff_at)
    diff_tangents = tuple(t_paths[i][1] for i in diff_at)
    out, tangent_out = jax.jvp(inner, diff_primals, diff_tangents)
    split = out_split[-1]
    tangent_out = [
        t if is_inexact_array(o) else None for o, t in zip(out, tangent_out, strict=True)
    ]
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
    diff, primal_split = split_tree(primals, is_inexact_array)
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
        inexact = [is_inexact_array(a) for a in arrays]
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
            if not is_inexact_array(o):
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
