"""`error_if`: raise at run time, from inside compiled code, when a condition holds."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from treemod._format.describe import describe_value
from treemod._private_apis import DEBUG_CALLBACK_LOGGER
from treemod._transforms.unvmap import unvmap_first_true

__all__ = ["RuntimeCheckError", "branched_error_if", "error_if", "set_default_on_error"]

T = TypeVar("T")
OnError = Literal["default", "raise", "breakpoint", "nan", "off"]
_ON_ERROR = ("raise", "breakpoint", "nan", "off")


class RuntimeCheckError(RuntimeError):
    """The error `error_if` raises (a `RuntimeError`).

    Raised directly when the predicate is known without running the program (eagerly, or a
    Python `bool`), and by `filter_jit` functions when a check inside them fails. Under plain
    `jax.jit` JAX reports it wrapped in `jax.errors.JaxRuntimeError` (also a `RuntimeError`)
    whose text holds the message.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> try:
        ...     tm.error_if(jnp.ones(2), jnp.ones(2) > 0, "positive")
        ... except tm.RuntimeCheckError as e:
        ...     print(e)
        positive
    """


class _QuietCheckFailures(logging.Filter):
    """Drops JAX's "jax.debug.callback failed" log record when the callback was a failing
    `error_if` check: that error is raised to the caller, it is not a crash to log as well."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, RuntimeCheckError)


# The logger of the module that runs `jax.debug.callback`'s callbacks.
logging.getLogger(DEBUG_CALLBACK_LOGGER).addFilter(_QuietCheckFailures())


def _checked_mode(value: str, source: str) -> str:
    if value not in _ON_ERROR:
        raise ValueError(f"{source} must be one of {_ON_ERROR}; got {value!r}.")
    return value


# What `on_error="default"` means: `TREEMOD_ON_ERROR`, read once at import; else "raise".
_USER_DEFAULT = os.environ.get("TREEMOD_ON_ERROR")
_DEFAULT_ON_ERROR = _checked_mode(_USER_DEFAULT or "raise", "TREEMOD_ON_ERROR")


def set_default_on_error(mode: str | None, source: str) -> None:
    """Set what `on_error="default"` means for the rest of the process, unless the user chose
    it with `TREEMOD_ON_ERROR` (which always wins, and then `mode` is not looked at).

    A compatibility namespace calls this once, at its import, with the value of its library's
    own environment variable, so code written for that library keeps the mode it asked for
    (the hook `treemod/_compat_api.py` documents). `None` (the variable unset) changes nothing.

    Arguments:
        mode: `"raise"`, `"breakpoint"`, `"nan"` or `"off"`, or `None`.
        source: where `mode` came from (an environment variable's name), for the error.

    Raises:
        ValueError: `mode` is none of the modes; the message names `source`.

    Example:
        >>> from treemod._transforms.error_if import set_default_on_error
        >>> set_default_on_error(None, "MY_LIBRARY_ON_ERROR")  # unset: nothing changes
        >>> set_default_on_error("explode", "MY_LIBRARY_ON_ERROR")
        Traceback (most recent call last):
        ValueError: MY_LIBRARY_ON_ERROR must be one of ('raise', ...); got 'explode'.
    """
    global _DEFAULT_ON_ERROR
    if mode is None or mode == "" or _USER_DEFAULT:
        return
    _DEFAULT_ON_ERROR = _checked_mode(mode, source)


# The message of the last error raised from inside a compiled program, for `filter_jit` to
# raise as a `RuntimeCheckError` in place of JAX's wrapper.
_LAST_MESSAGE: list[str | None] = [None]


def runtime_check_error(error: Exception) -> RuntimeCheckError | None:
    """The `RuntimeCheckError` that `error` (a `JaxRuntimeError`) carries, if it carries one."""
    message, _LAST_MESSAGE[0] = _LAST_MESSAGE[0], None
    if message is not None and "RuntimeCheckError" in str(error):
        return RuntimeCheckError(message)
    return None


def error_if(x: T, pred: Any, msg: str, *, on_error: OnError = "default") -> T:
    """Return `x`, raising `RuntimeError(msg)` when the run reaches here with `pred` true.

    `pred` is a boolean array (any shape; the error fires when any element is true), checked
    with the values the program computes: eagerly it raises at once; under
    `filter_jit`/`jax.jit` the compiled program reports the error when its result is awaited, as
    a `jax.errors.JaxRuntimeError` (a `RuntimeError`) whose text holds `msg`. It works under
    `vmap` (any example with `pred` true raises) and differentiation (the derivative passes
    through `x` unchanged). Only one boolean crosses to the host per call.

    A predicate known without running the program (a Python `bool`, or a concrete array
    outside any transform) is decided at once: `RuntimeCheckError(msg)` is raised there, or `x`
    returned with no check compiled in.

    Arguments:
        x: any pytree, returned unchanged.
        pred: a boolean array, or Python bool.
        msg: the error message.
        on_error: what a true `pred` does: `"raise"` an error, open a `"breakpoint"` (the
            debugger, with the message printed), return `x` with its arrays filled with
            `"nan"` (integers: their maximum, booleans: `True`), or nothing (`"off"`).
            `"default"` reads the environment variable `TREEMOD_ON_ERROR` once, at import;
            unset means `"raise"` (or the mode a compatibility namespace read from its
            library's own variable, such as `treemod.compat.equinox`).

    Returns:
        `x` (with `on_error="nan"`, its arrays replaced when `pred` holds).

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
    return _raise_if(x, pred, 0, (msg,), "error_if", on_error)


def branched_error_if(
    x: T, pred: Any, index: Any, msgs: Sequence[str], *, on_error: OnError = "default"
) -> T:
    """`error_if` with a choice of messages: raise `RuntimeError(msgs[index])`.

    `index` is an integer array broadcastable against `pred` (or a Python int); the message
    is that of the first element where `pred` is true. Only that element's index crosses to
    the host.

    Arguments:
        x: any pytree, returned unchanged.
        pred: a boolean array, or Python bool.
        index: which message, per element of `pred`.
        msgs: the messages.
        on_error: as for `error_if`.

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
    return _raise_if(x, pred, index, msgs, "branched_error_if", on_error)


def _nan_like(x: Any) -> Any:
    if not hasattr(x, "dtype"):
        return x
    dtype = jnp.result_type(x)
    if jnp.issubdtype(dtype, jnp.inexact):
        fill: Any = jnp.nan
    elif jnp.issubdtype(dtype, jnp.integer):
        fill = jnp.iinfo(dtype).max
    elif dtype == jnp.bool_:
        fill = True
    else:
        return x
    return jnp.full(jnp.shape(x), fill, dtype)


def _known(value: Any) -> bool:
    """Whether `value` is known without running the program (not traced)."""
    return not any(isinstance(v, jax.core.Tracer) for v in jtu.tree_leaves(value))


def _raise_if(x: T, pred: Any, index: Any, msgs: Sequence[str], name: str, on_error: str) -> T:
    if on_error == "default":
        on_error = _DEFAULT_ON_ERROR
    elif on_error not in _ON_ERROR:
        raise ValueError(
            f"{name}: on_error must be one of {('default', *_ON_ERROR)}; got {on_error!r}."
        )
    if not isinstance(pred, bool) and jnp.result_type(pred) != jnp.bool_:
        raise TypeError(
            f"{name}: `pred` must be a boolean array (such as `x < 0`); got "
            f"{describe_value(pred)}. Compare it with something to make one."
        )
    if not isinstance(index, int) and not jnp.issubdtype(jnp.result_type(index), jnp.integer):
        raise TypeError(f"{name}: `index` must be an integer array; got {describe_value(index)}.")
    msgs = tuple(msgs)
    if on_error == "off":
        return x
    if _known(pred) and _known(index):
        holds = np.asarray(pred)
        if not holds.any():
            return x
        which = int(np.broadcast_to(np.asarray(index), holds.shape).ravel()[np.argmax(holds)])
        if on_error == "raise":
            raise RuntimeCheckError(msgs[which])
        if on_error == "nan":
            return jtu.tree_map(_nan_like, x)  # type: ignore[no-any-return]
        print(f"{name}: {msgs[which]}")
        breakpoint()  # noqa: T100 - on_error="breakpoint" asks for exactly this
        return x
    pred, index = jnp.broadcast_arrays(pred, index)
    if on_error == "nan":
        nan_or_x = jax.lax.cond(jnp.any(pred), lambda t: jtu.tree_map(_nan_like, t), lambda t: t, x)
        return nan_or_x  # type: ignore[no-any-return]
    if on_error == "breakpoint":

        def stop(which: Any) -> None:
            print(f"{name}: {msgs[int(which)]}")

        def open_debugger(which: Any) -> None:
            jax.debug.callback(stop, which)
            jax.debug.breakpoint()

        any_true, which = unvmap_first_true(pred, index)
        jax.lax.cond(any_true, open_debugger, lambda which: None, which)
        return x

    def check(any_true: Any, which: Any) -> None:
        if any_true:
            _LAST_MESSAGE[0] = message = msgs[int(which)]
            raise RuntimeCheckError(message)

    # One callback with the first true element across every vmap batch entry: a callback under
    # vmap runs once per entry, in an order XLA picks (not the entries' order on JAX 0.12).
    jax.debug.callback(check, *unvmap_first_true(pred, index))
    return x
