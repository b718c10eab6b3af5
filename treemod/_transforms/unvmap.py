"""`unvmap_any`: whether any element is true, across every `vmap` batch entry too.

`jnp.any(pred)` under `vmap` gives one answer per batch entry, so a `lax.cond` on it turns
into a `select` that runs both branches. This primitive's batching rule reduces over the batch
axis as well, so the result is never batched and the `cond` stays a real branch.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.interpreters import batching, mlir

from treemod._private_apis import Primitive

__all__ = ["unvmap_any"]

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
