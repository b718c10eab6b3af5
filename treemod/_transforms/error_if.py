"""`error_if`: raise at run time, from inside compiled code, when a condition holds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from treemod._format.describe import describe_value

__all__ = ["branched_error_if", "error_if"]

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
    return _raise_if(x, pred, 0, (msg,), "error_if")


def branched_error_if(x: T, pred: Any, index: Any, msgs: Sequence[str]) -> T:
    """`error_if` with a choice of messages: raise `RuntimeError(msgs[index])`.

    Equinox's `branched_error_if`. `index` is an integer array broadcastable against `pred`
    (or a Python int); the message is that of the first element where `pred` is true. Only
    that element's index crosses to the host.

    Arguments:
        x: any pytree, returned unchanged.
        pred: a boolean array, or Python bool.
        index: which message, per element of `pred`.
        msgs: the messages.

    Returns:
        `x`.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> x = jnp.array([1.0, jnp.inf])
        >>> try:
        ...     tm.branched_error_if(x, ~jnp.isfinite(x), jnp.isnan(x).astype(int), ["inf", "nan"])
        ... except RuntimeError as e:
        ...     print(e)
        inf
    """
    return _raise_if(x, pred, index, msgs, "branched_error_if")


def _raise_if(x: T, pred: Any, index: Any, msgs: Sequence[str], name: str) -> T:
    if not isinstance(pred, bool) and jnp.result_type(pred) != jnp.bool_:
        raise TypeError(
            f"{name}: `pred` must be a boolean array (such as `x < 0`); got "
            f"{describe_value(pred)}. Compare it with something to make one."
        )
    if not isinstance(index, int) and not jnp.issubdtype(jnp.result_type(index), jnp.integer):
        raise TypeError(f"{name}: `index` must be an integer array; got {describe_value(index)}.")
    msgs = tuple(msgs)
    pred, index = jnp.broadcast_arrays(pred, index)
    first = jnp.argmax(pred.ravel())  # the first true element (0 if none is)

    def check(any_true: Any, which: Any) -> None:
        any_true, which = np.ravel(any_true), np.ravel(which)
        if any_true.any():  # under vmap: one entry per example
            raise RuntimeError(msgs[int(which[np.argmax(any_true)])])

    jax.debug.callback(check, jnp.any(pred), index.ravel()[first])
    return x
