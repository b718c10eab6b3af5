"""Automatic differentiation of functions of arbitrary pytrees.

`filter_grad` and `filter_value_and_grad` differentiate the parameters of the first argument:
it is split with `is_param` (floating-point arrays outside `State`), and the gradient has
exactly the structure of `treemod.filter(first_argument, treemod.is_param)`, with `None` for
every other leaf, so it can go straight to an optax optimiser. `filter_jacfwd`,
`filter_jacrev` and `filter_hessian` differentiate the same parameters. `filter_jvp` and
`filter_vjp`, which differentiate every argument, are in `jvp_vjp.py`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, overload

import jax
import jax.tree_util as jtu

from treemod._format.paths import function_name
from treemod._module.state import State, is_state
from treemod._transforms.leaves import Split, split_tree
from treemod._transforms.wrapper import P, TransformedFunction
from treemod._tree.filters import combine, is_inexact_traceable_array, partition

__all__ = [
    "filter_grad",
    "filter_hessian",
    "filter_jacfwd",
    "filter_jacrev",
    "filter_value_and_grad",
]


def _is_param(element: Any) -> bool:
    """`is_param` for the leaves a transform traces: a `jax.ShapeDtypeStruct` (which `is_param`
    counts, for filtering skeletons) stays static, as in Equinox, and gets no gradient."""
    return not isinstance(element, State) and is_inexact_traceable_array(element)


_is_param.is_leaf = is_state  # type: ignore[attr-defined]  # judge State nodes whole


class _GradWrapper(TransformedFunction[P, Any]):
    """`fun` differentiated with respect to the parameters (`is_param`) of its first argument:
    by `jax.value_and_grad`, or by `jacobian` (`jax.jacfwd` or `jax.jacrev`) when given. `name`
    is the public function that made it (for messages only); `with_value` returns the value
    beside the gradient (`filter_value_and_grad`)."""

    _tm_share_fields = ("_fun", ("_has_aux", "_name", "_jacobian", "_with_value"))

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
                f"Functions wrapped with {self._name} must be called with their first argument "
                "(the one being differentiated, usually the model) passed by position; "
                f"{self._name}({function_name(self._fun)}) was called with keyword arguments "
                f"only ({', '.join(map(str, kwargs))})."
            )
        x, rest = args[0], args[1:]
        diff, nondiff = partition(x, _is_param)
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
