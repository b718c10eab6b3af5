"""`filter_checkpoint`: rematerialisation (`jax.checkpoint`) for functions of arbitrary pytrees."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, overload

import jax

from treemod._transforms.leaves import pack_output, split_tree
from treemod._transforms.wrapper import P, R, TransformedFunction, split_fn

__all__ = ["filter_checkpoint"]


class _CheckpointWrapper(TransformedFunction[P, R]):
    def __init__(self, fun: Callable[P, R], prevent_cse: bool, policy: Any) -> None:
        self._fun: Callable[..., Any] = fun
        self._fn_tree, self._call = split_fn(fun)
        self._prevent_cse = prevent_cse
        self._policy = policy
        self._wraps(fun)

    def __call__(self, /, *args: P.args, **kwargs: P.kwargs) -> R:
        dynamic, split = split_tree((self._fn_tree, args, kwargs))
        fun, call = self._fun, self._call

        def inner(dyn: list[Any]) -> Any:
            fn_tree, a, k = split.rebuild(dyn)
            if call is not None:
                out = call(fn_tree, *a, **k)
            elif fn_tree is not None:
                out = fn_tree(*a, **k)
            else:
                out = fun(*a, **k)
            return pack_output(out)

        remat = jax.checkpoint(inner, prevent_cse=self._prevent_cse, policy=self._policy)
        return remat(dynamic)  # type: ignore[no-any-return]


@overload
def filter_checkpoint(
    fun: Callable[P, R], *, prevent_cse: bool = True, policy: Callable[..., bool] | None = None
) -> Callable[P, R]: ...


@overload
def filter_checkpoint(
    fun: None = None, *, prevent_cse: bool = True, policy: Callable[..., bool] | None = None
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def filter_checkpoint(
    fun: Callable[P, R] | None = None,
    *,
    prevent_cse: bool = True,
    policy: Callable[..., bool] | None = None,
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Recompute `fun`'s intermediate values in the backward pass instead of storing them.

    `jax.checkpoint` (rematerialisation) for functions of arbitrary pytrees: arrays are
    inputs of the checkpointed computation (gradients flow to them, including the arrays of a
    `Module` used as `fun`); other leaves are static.

    Arguments:
        fun: the function, module or bound method; omit it to use as a decorator with options.
        prevent_cse: as in `jax.checkpoint`.
        policy: as in `jax.checkpoint`, e.g. `jax.checkpoint_policies.dots_saveable`.

    Returns:
        The wrapped function, with the same outputs and gradients as `fun`.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> @tm.filter_checkpoint
        ... def block(params, x, act):
        ...     return act(params["w"] * x)
        >>> jax.grad(lambda p: block(p, 2.0, jnp.sin))({"w": jnp.array(0.0)})
        {'w': Array(2., dtype=float32, weak_type=True)}
    """
    if fun is None:
        return functools.partial(filter_checkpoint, prevent_cse=prevent_cse, policy=policy)
    if not callable(fun):
        raise TypeError(f"filter_checkpoint expects a callable; got {type(fun).__name__}.")
    return _CheckpointWrapper(fun, prevent_cse, policy)
