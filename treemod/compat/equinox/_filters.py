"""Equinox's leaf predicates, for the compat namespace.

treemod's `is_array` family counts a `jax.ShapeDtypeStruct` as the array it stands for, so
filters work the same on a `jax.eval_shape` skeleton. Equinox's predicates count only real
arrays (JAX, NumPy, tracers), and code written for Equinox may rely on that (to tell an
abstract leaf from a concrete one), so the compat namespace's predicates are Equinox's.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from treemod._tree.filters import IS_ARRAY_TYPE

__all__ = ["is_array", "is_array_like", "is_inexact_array", "is_inexact_array_like"]


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
