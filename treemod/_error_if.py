"""`error_if`: raise at run time, from inside compiled code, when a condition holds."""

from __future__ import annotations

from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from ._describe import describe_value

__all__ = ["error_if"]

T = TypeVar("T")


def error_if(x: T, pred: Any, msg: str) -> T:
    """Return `x`, raising `RuntimeError(msg)` when the run reaches here with `pred` true.

    Equinox's `error_if`. `pred` is a boolean array (any shape; the error fires when any
    element is true), checked with the values the program computes: eagerly it raises at once;
    under `filter_jit`/`jax.jit` the compiled program reports the error when its result is
    awaited, as a `jax.errors.JaxRuntimeError` (a `RuntimeError`) whose text holds `msg`. It
    works under `vmap` (any example with `pred` true raises) and differentiation (the
    derivative passes through `x` unchanged). Only one boolean crosses to the host per call.

    Arguments:
        x: any pytree, returned unchanged.
        pred: a boolean array, or Python bool.
        msg: the error message.

    Returns:
        `x`.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> @tm.filter_jit
        ... def safe_log(x):
        ...     x = tm.error_if(x, x <= 0, "safe_log: x must be positive")
        ...     return jnp.log(x)
        >>> safe_log(jnp.array([1.0, 2.0]))
        Array([0.       , 0.6931472], dtype=float32)
        >>> try:
        ...     safe_log(jnp.array([1.0, -2.0])).block_until_ready()
        ... except RuntimeError as e:
        ...     print("x must be positive" in str(e))
        True
    """
    if not isinstance(pred, bool) and jnp.result_type(pred) != jnp.bool_:
        raise TypeError(
            f"error_if: `pred` must be a boolean array (such as `x < 0`); got "
            f"{describe_value(pred)}. Compare it with something to make one."
        )

    def check(any_true: Any) -> None:
        if np.any(any_true):
            raise RuntimeError(msg)

    jax.debug.callback(check, jnp.any(pred))
    return x
