"""`filter_checkpoint`: rematerialisation (`jax.checkpoint`) for functions of arbitrary pytrees."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, overload

import jax

from treemod._transforms.leaves import pack_output, split_tree
from treemod._transforms.wrapper import P, R, TransformedFunction, split_fn

__all__ = ["RematPolicy", "checkpoint_policy", "filter_checkpoint"]

# What to keep for the backward pass: a `jax.checkpoint` policy, or a name for a common one.
RematPolicy = str | Sequence[str] | Callable[..., bool] | None
POLICIES: dict[str, Callable[..., bool]] = {
    "nothing": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "everything": jax.checkpoint_policies.everything_saveable,
}


def checkpoint_policy(policy: Any, owner: str = "filter_checkpoint") -> Callable[..., bool] | None:
    """`jax.checkpoint`'s policy for a `RematPolicy`: `None` (save nothing but the inputs, JAX's
    default), `"nothing"`, `"dots"` (the results of matmuls without batch dimensions),
    `"everything"`, a list of names (the values tagged with `jax.ad_checkpoint.checkpoint_name`
    under those names: `save_only_these_names`) or a policy function, returned as it is.

    Arguments:
        policy: the policy or its name.
        owner: what to name in the error.

    Returns:
        The policy function, or `None`.

    Example:
        >>> from treemod._transforms.remat import checkpoint_policy
        >>> import jax
        >>> checkpoint_policy("dots") is jax.checkpoint_policies.dots_with_no_batch_dims_saveable
        True
    """
    if policy is None or callable(policy):
        chosen: Callable[..., bool] | None = policy
        return chosen
    if isinstance(policy, str):
        if policy not in POLICIES:
            raise ValueError(
                f"{owner}: the remat policy {policy!r} is not one of {sorted(POLICIES)}; pass "
                "one of those, a list of checkpoint names, or a jax.checkpoint_policies function."
            )
        return POLICIES[policy]
    if isinstance(policy, Sequence) and all(isinstance(n, str) for n in policy):
        named: Callable[..., bool] = jax.checkpoint_policies.save_only_these_names(*policy)
        return named
    raise ValueError(
        f"{owner}: a remat policy is a name ({sorted(POLICIES)}), a list of checkpoint names "
        f"or a jax.checkpoint_policies function; got {policy!r}."
    )


class _CheckpointWrapper(TransformedFunction[P, R]):
    def __init__(self, fun: Callable[P, R], prevent_cse: bool, policy: Any) -> None:
        self._fun: Callable[..., Any] = fun
        self._fn_tree, self._call = split_fn(fun)
        self._prevent_cse = prevent_cse
        self._policy = checkpoint_policy(policy)
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
    fun: Callable[P, R], *, prevent_cse: bool = True, policy: RematPolicy = None
) -> Callable[P, R]: ...


@overload
def filter_checkpoint(
    fun: None = None, *, prevent_cse: bool = True, policy: RematPolicy = None
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def filter_checkpoint(
    fun: Callable[P, R] | None = None,
    *,
    prevent_cse: bool = True,
    policy: RematPolicy = None,
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Recompute `fun`'s intermediate values in the backward pass instead of storing them.

    `jax.checkpoint` (rematerialisation) for functions of arbitrary pytrees: arrays are
    inputs of the checkpointed computation (gradients flow to them, including the arrays of a
    `Module` used as `fun`); other leaves are static.

    Arguments:
        fun: the function, module or bound method; omit it to use as a decorator with options.
        prevent_cse: as in `jax.checkpoint`.
        policy: what to save for the backward pass: a `jax.checkpoint` policy (e.g.
            `jax.checkpoint_policies.dots_saveable`), `"nothing"`, `"dots"`, `"everything"`,
            or a list of names given with `jax.ad_checkpoint.checkpoint_name` (only those are
            saved). `None`: JAX's default, only the inputs.

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
