"""Equinox's leaf predicates, and `filter`/`partition` with Equinox's error type.

treemod's `is_array` family counts a `jax.ShapeDtypeStruct` as the array it stands for, so
filters work the same on a `jax.eval_shape` skeleton. Equinox's predicates count only real
arrays (JAX, NumPy, tracers), and code written for Equinox may rely on that (to tell an
abstract leaf from a concrete one), so the compat namespace's predicates are Equinox's.
`filter` and `partition` are treemod's; a `filter_spec` leaf that is neither a bool nor a
predicate raises an error that is also Equinox's `ValueError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

import treemod
from treemod._compat_api import IS_ARRAY_TYPE, FilterSpecError

from ._errors import EquinoxFilterSpecError

__all__ = [
    "filter",
    "is_array",
    "is_array_like",
    "is_inexact_array",
    "is_inexact_array_like",
    "partition",
]


def filter(  # noqa: A001 (Equinox's name)
    pytree: Any,
    filter_spec: Any,
    inverse: bool = False,
    replace: Any = None,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """`treemod.filter`, with Equinox's error type for a bad `filter_spec`.

    Arguments:
        pytree: any pytree.
        filter_spec: a predicate, a bool, or a prefix of `pytree` with them at its leaves.
        inverse: keep the leaves that are *not* selected instead.
        replace: what unselected leaves become.
        is_leaf: as in `jax.tree_util`.

    Returns:
        A pytree of the same structure as `pytree`.

    Raises:
        ValueError: a `filter_spec` leaf is neither a bool nor a predicate (as Equinox raises;
            the error is also treemod's `TypeError`).

    Example:
        >>> import treemod.compat.equinox as eqx
        >>> try:
        ...     eqx.filter([1, 2], "a")
        ... except ValueError as e:
        ...     print(str(e)[:47])
        filter_spec leaves must be bools or predicates;
    """
    try:
        return treemod.filter(pytree, filter_spec, inverse, replace, is_leaf)
    except FilterSpecError as e:
        raise EquinoxFilterSpecError(*e.args).with_traceback(e.__traceback__) from None


def partition(
    pytree: Any,
    filter_spec: Any,
    replace: Any = None,
    is_leaf: Callable[[Any], bool] | None = None,
) -> tuple[Any, Any]:
    """`treemod.partition`, with Equinox's error type for a bad `filter_spec` (see `filter`).

    Arguments:
        pytree: any pytree.
        filter_spec: as in `filter`.
        replace: the placeholder left in each half.
        is_leaf: as in `jax.tree_util`.

    Returns:
        `(selected, rest)`.

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.partition([jnp.ones(2), "relu"], eqx.is_array)[1]
        [None, 'relu']
    """
    try:
        return treemod.partition(pytree, filter_spec, replace, is_leaf)
    except FilterSpecError as e:
        raise EquinoxFilterSpecError(*e.args).with_traceback(e.__traceback__) from None


def is_array(element: Any) -> bool:
    """Whether `element` is a JAX array (a tracer included) or a NumPy array or scalar.

    Arguments:
        element: any Python object.

    Returns:
        `True` for arrays; `False` for everything else, `jax.ShapeDtypeStruct` included.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.is_array(jnp.zeros(2)), eqx.is_array(jax.ShapeDtypeStruct((2,), jnp.float32))
        (True, False)
    """
    return IS_ARRAY_TYPE[type(element)]


def is_inexact_array(element: Any) -> bool:
    """Whether `element` is an array (as `is_array` says) of a floating-point or complex dtype.

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.is_inexact_array(jnp.zeros(2)), eqx.is_inexact_array(jnp.arange(2))
        (True, False)
    """
    return IS_ARRAY_TYPE[type(element)] and bool(jnp.issubdtype(element.dtype, jnp.inexact))


def is_array_like(element: Any) -> bool:
    """Whether `element` is an array, a Python `bool`/`int`/`float`/`complex`, or an object
    with a `__jax_array__` method.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.is_array_like(1), eqx.is_array_like(jax.ShapeDtypeStruct((), jnp.float32))
        (True, False)
    """
    return (
        IS_ARRAY_TYPE[type(element)]
        or isinstance(element, bool | int | float | complex)
        or hasattr(element, "__jax_array__")
    )


def is_inexact_array_like(element: Any) -> bool:
    """Whether `element` is an inexact array or a Python `float`/`complex` (an object with a
    `__jax_array__` method is judged by the array it converts to).

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.is_inexact_array_like(1.0), eqx.is_inexact_array_like(jnp.arange(2))
        (True, False)
    """
    if not IS_ARRAY_TYPE[type(element)] and callable(getattr(element, "__jax_array__", None)):
        element = element.__jax_array__()  # (a tracer's `__jax_array__` is None)
    return is_inexact_array(element) or isinstance(element, float | complex)
