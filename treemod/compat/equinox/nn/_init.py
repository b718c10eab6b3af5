"""Equinox's parameter draws: in the parameter's own dtype, so fixed seeds give its numbers.

treemod's initialisers draw in float32 and cast (PyTorch's numerics); Equinox draws in the
requested dtype, and a bfloat16 or float16 draw is not the float32 draw rounded. The compat
layers pass these initialisers to treemod's layers (their `weight_init=` / `bias_init=`), or
draw with them where a treemod layer takes none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array

__all__ = ["equinox_normal", "equinox_uniform", "placeholder"]

Initializer = Callable[[Any, tuple[int, ...], Any], Array]


def equinox_uniform(lim: float) -> Initializer:
    """Equinox's default initialiser: U(-lim, lim) drawn in `dtype`.

    A complex dtype draws the real and imaginary parts, in the real dtype of the same width,
    from the two halves of the key.

    Arguments:
        lim: the bound.

    Returns:
        An initialiser `(key, shape, dtype) -> array`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.compat.equinox.nn._init import equinox_uniform
        >>> w = equinox_uniform(0.5)(jax.random.key(0), (3,), jnp.bfloat16)
        >>> bool((w == jax.random.uniform(jax.random.key(0), (3,), jnp.bfloat16, -0.5, 0.5)).all())
        True
    """

    def init(key: Any, shape: tuple[int, ...], dtype: Any) -> Array:
        if jnp.issubdtype(dtype, jnp.complexfloating):
            real = jnp.finfo(dtype).dtype
            rkey, ikey = jax.random.split(key, 2)
            re = jax.random.uniform(rkey, shape, real, -lim, lim).astype(dtype)
            im = jax.random.uniform(ikey, shape, real, -lim, lim).astype(dtype)
            return re + 1j * im
        return jax.random.uniform(key, shape, dtype, -lim, lim)

    return init


def equinox_normal(key: Any, shape: tuple[int, ...], dtype: Any) -> Array:
    """Equinox's `Embedding` initialiser: N(0, 1) drawn in `dtype`.

    Arguments:
        key: the PRNG key.
        shape: the array's shape.
        dtype: the array's dtype (complex draws JAX's complex normal).

    Returns:
        The array.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.compat.equinox.nn._init import equinox_normal
        >>> equinox_normal(jax.random.key(0), (2, 3), jnp.float16).dtype
        dtype('float16')
    """
    return jax.random.normal(key, shape, dtype)


def placeholder(key: Any, shape: tuple[int, ...], dtype: Any) -> Array:
    """Zeros, for a treemod layer whose arrays a compat layer then draws itself.

    Arguments:
        key: unused (no random numbers are spent).
        shape: the array's shape.
        dtype: the array's dtype.

    Returns:
        Zeros.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.compat.equinox.nn._init import placeholder
        >>> placeholder(jax.random.key(0), (2,), jnp.float32)
        Array([0., 0.], dtype=float32)
    """
    del key
    return jnp.zeros(shape, dtype)
