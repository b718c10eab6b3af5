"""`filter_grad` and `filter_value_and_grad`: differentiate the parameters of the first argument.

The first argument is split with `is_param` (floating-point arrays outside `State`); the
gradient has exactly the structure of `treemod.filter(first_argument, treemod.is_param)`, with
`None` for every other leaf, so it can go straight to an optax optimiser.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import jax

from ._filters import combine, partition
from ._state import is_param

__all__ = ["filter_grad", "filter_value_and_grad"]


class _GradWrapper:
    def __init__(self, fun: Callable[..., Any], has_aux: bool, value: bool) -> None:
        self._fun = fun
        self._has_aux = has_aux
        self._value = value
        if isinstance(fun, types.FunctionType | types.MethodType | functools.partial):
            functools.update_wrapper(self, fun, updated=())
        else:
            self.__wrapped__ = fun

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        if not args:
            name = "filter_value_and_grad" if self._value else "filter_grad"
            raise TypeError(
                f"{name}: the function must be called with its first argument (the one being "
                "differentiated, usually the model) passed positionally."
            )
        x, rest = args[0], args[1:]
        diff, nondiff = partition(x, is_param)
        fun = self._fun

        def with_params(diff_x: Any) -> Any:
            return fun(combine(diff_x, nondiff), *rest, **kwargs)

        value_and_grad = jax.value_and_grad(with_params, has_aux=self._has_aux)
        value, grads = value_and_grad(diff)
        if self._value:
            return value, grads
        if self._has_aux:
            return grads, value[1]
        return grads

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return types.MethodType(self, instance)


def filter_value_and_grad(fun: Callable[..., Any] | None = None, *, has_aux: bool = False) -> Any:
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
    return _GradWrapper(fun, has_aux, value=True)


def filter_grad(fun: Callable[..., Any] | None = None, *, has_aux: bool = False) -> Any:
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
    return _GradWrapper(fun, has_aux, value=False)
