"""Debugging helpers for compiled code: count traces and fail on unexpected retracing.

Equinox-compatible: `treemod.debug.assert_max_traces` and `treemod.debug.get_num_traces`
behave like their `equinox.debug` namesakes, and also accept `filter_jit` functions directly.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

from treemod._transforms.jit import _JitWrapper

__all__ = ["assert_max_traces", "get_num_traces"]


class _Counter:
    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


def assert_max_traces(fn: Callable[..., Any] | None = None, *, max_traces: int | None) -> Any:
    """Fail when a function is traced more than `max_traces` times.

    Put it under `filter_jit` (it then runs once per trace), or apply it to a `filter_jit`
    function. Exceeding the limit raises `RuntimeError` at the offending call; turn on
    `TREEMOD_EXPLAIN_RETRACES=1` to see which argument changed.

    Arguments:
        fn: the function; omit it to use `assert_max_traces(max_traces=...)` as a decorator.
        max_traces: the most traces allowed; `None` only counts them.

    Returns:
        The wrapped function (a fresh copy with its own trace count, for a `filter_jit`
        function).

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> @tm.filter_jit
        ... @tm.debug.assert_max_traces(max_traces=1)
        ... def double(x):
        ...     return 2 * x
        >>> _ = double(jnp.ones(2))
        >>> double(jnp.zeros(2))
        Array([0., 0.], dtype=float32)
        >>> double(jnp.ones(3))
        Traceback (most recent call last):
        RuntimeError: double can only be traced 1 times, but it has now been traced 2 times. ...
    """
    if fn is None:
        return functools.partial(assert_max_traces, max_traces=max_traces)
    if max_traces is not None and (not isinstance(max_traces, int) or max_traces < 0):
        raise ValueError(f"assert_max_traces: max_traces must be an int >= 0; got {max_traces!r}")
    if isinstance(fn, _JitWrapper):
        return fn.with_max_traces(max_traces)
    counter = _Counter()
    name = getattr(fn, "__qualname__", type(fn).__qualname__).rsplit("<locals>.", 1)[-1]

    @functools.wraps(fn)
    def counted(*args: Any, **kwargs: Any) -> Any:
        counter.count += 1
        if max_traces is not None and counter.count > max_traces:
            raise RuntimeError(
                f"{name} can only be traced {max_traces} times, but it has now been traced "
                f"{counter.count} times. Set TREEMOD_EXPLAIN_RETRACES=1 (or "
                "filter_jit(..., explain_retraces=True)) to log which argument changed."
            )
        return fn(*args, **kwargs)

    counted.__treemod_trace_counter__ = counter  # type: ignore[attr-defined]
    return counted


def get_num_traces(fn: Any) -> int:
    """How many times a `filter_jit` or `assert_max_traces` function has been traced.

    Arguments:
        fn: a function returned by `filter_jit` or `assert_max_traces` (or a method of a class
            decorated with one).

    Returns:
        The number of traces so far.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> f = tm.filter_jit(lambda x, n: x * n)
        >>> _ = f(jnp.ones(2), 2); _ = f(jnp.ones(2), 2); _ = f(jnp.ones(2), 3)
        >>> tm.debug.get_num_traces(f)
        2
    """
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    if isinstance(fn, _JitWrapper):
        return fn.num_traces
    counter = getattr(fn, "__treemod_trace_counter__", None)
    if isinstance(counter, _Counter):
        return counter.count
    raise TypeError(
        f"get_num_traces: {fn!r} is neither a filter_jit function nor wrapped by "
        "treemod.debug.assert_max_traces, so its traces are not counted."
    )
