"""Reductions across every `vmap` batch entry too: `unvmap_any`, `unvmap_first_true`.

`jnp.any(pred)` under `vmap` gives one answer per batch entry, so a `lax.cond` on it turns
into a `select` that runs both branches. These primitives' batching rules reduce over the batch
axis as well, so the result is never batched: the `cond` stays a real branch, and a
`jax.debug.callback` given the result runs once, not once per entry in an order XLA picks.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.interpreters import batching, mlir

from treemod._private_apis import Primitive

__all__ = ["unvmap_any", "unvmap_first_true"]

_unvmap_any_p = Primitive("treemod_unvmap_any")


def _impl(x: Any) -> Any:
    return jnp.any(x)


def _abstract_eval(x: Any) -> Any:
    return jax.core.ShapedArray((), jnp.bool_)


def _batch(args: tuple[Any, ...], dims: tuple[Any, ...]) -> tuple[Any, Any]:
    (x,) = args
    return _unvmap_any_p.bind(x), None  # the result is not batched


_unvmap_any_p.def_impl(_impl)
_unvmap_any_p.def_abstract_eval(_abstract_eval)
batching.primitive_batchers[_unvmap_any_p] = _batch
mlir.register_lowering(_unvmap_any_p, mlir.lower_fun(_impl, multiple_results=False))


def unvmap_any(pred: Any) -> Any:
    """Whether any element of the boolean array `pred` is true, in any `vmap` batch entry.

    Arguments:
        pred: a boolean array.

    Returns:
        A boolean scalar that is never batched.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod._transforms.unvmap import unvmap_any
        >>> jax.vmap(lambda x: unvmap_any(x > 2))(jnp.arange(4))
        Array([ True,  True,  True,  True], dtype=bool)
    """
    return _unvmap_any_p.bind(jnp.asarray(pred, dtype=jnp.bool_))


_first_true_p = Primitive("treemod_unvmap_first_true")
_first_true_p.multiple_results = True


def _first_true_impl(pred: Any, index: Any) -> list[Any]:
    pred, index = jnp.ravel(pred), jnp.ravel(index)
    return [jnp.any(pred), index[jnp.argmax(pred)]]


def _first_true_abstract_eval(pred: Any, index: Any) -> list[Any]:
    return [jax.core.ShapedArray((), jnp.bool_), jax.core.ShapedArray((), index.dtype)]


def _first_true_batch(args: tuple[Any, ...], dims: tuple[Any, ...]) -> tuple[Any, Any]:
    size = next(a.shape[d] for a, d in zip(args, dims, strict=True) if d is not None)
    # The batch axis first: in row-major order an earlier entry's elements come first, and an
    # enclosing vmap's axis goes in front of this one's when its rule runs.
    pred, index = (
        jnp.moveaxis(a, d, 0) if d is not None else jnp.broadcast_to(a, (size, *a.shape))
        for a, d in zip(args, dims, strict=True)
    )
    return _first_true_p.bind(pred, index), [None, None]  # the results are not batched


_first_true_p.def_impl(_first_true_impl)
_first_true_p.def_abstract_eval(_first_true_abstract_eval)
batching.primitive_batchers[_first_true_p] = _first_true_batch
mlir.register_lowering(_first_true_p, mlir.lower_fun(_first_true_impl, multiple_results=True))


def unvmap_first_true(pred: Any, index: Any) -> tuple[Any, Any]:
    """Whether any element of `pred` is true, and `index` at the first true one, in example order
    across every `vmap` batch entry.

    Arguments:
        pred: a boolean array.
        index: an integer array of `pred`'s shape.

    Returns:
        `(any_true, which)`: two scalars that are never batched (`which` is `index`'s first element
        when none is true).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod._transforms.unvmap import unvmap_first_true
        >>> pred = jnp.array([[False, False], [False, True], [True, False]])
        >>> index = jnp.array([[0, 1], [2, 3], [4, 5]])
        >>> jax.vmap(lambda p, i: unvmap_first_true(p, i)[1])(pred, index)
        Array([3, 3, 3], dtype=int32)
    """
    pred = jnp.asarray(pred, dtype=jnp.bool_)
    index = jnp.broadcast_to(jnp.asarray(index), pred.shape)
    any_true, which = _first_true_p.bind(pred, index)
    return any_true, which
