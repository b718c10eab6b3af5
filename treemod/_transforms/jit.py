"""`filter_jit`: `jax.jit` where arrays are traced and every other leaf is static.

Per call the wrapper does as little Python as possible: one C++ flatten of
`(fn_tree, args, kwargs)`, a cached classification of the leaf types, two `compress` passes and
one dict lookup keyed by `(treedef, static leaf types, static leaves)`. Each key owns a `jax.jit`
of a function that rebuilds the arguments. An output with non-array leaves comes back as a
`HeldPacked` with only arrays as leaves, which keeps JAX's C++ dispatch path, and is rebuilt
after the call; nothing blocks.
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Callable
from itertools import compress
from typing import Any, Literal

import jax
import jax.tree_util as jtu

from treemod._format.paths import function_name
from treemod._format.retrace import aval_of, explain, logger
from treemod._transforms.leaves import KINDS, merge_leaves, pack_output, unpack_output
from treemod._transforms.unhashable import unhashable_error
from treemod._transforms.wrapper import TransformedFunction, split_fn

__all__ = ["filter_jit"]

Donate = Literal["all", "all-except-first", "warn", "warn-except-first", "none"]
_DONATE_MODES = ("all", "all-except-first", "warn", "warn-except-first", "none")
_UNUSED_DONATION = "Some donated buffers were not usable"
_flatten = jtu.tree_flatten


def _env_explain() -> bool:
    return os.environ.get("TREEMOD_EXPLAIN_RETRACES", "").lower() in ("1", "true", "yes", "on")


class _TraceCount:
    """How often a function was traced, its limit, and the retrace explainer's memory.

    The traced function refers to this object only, never to the wrapper or its cache, so a
    wrapper that goes out of scope is freed at once, with its compiled executables.
    """

    __slots__ = ("num_traces", "max_traces", "last_signature", "log")

    def __init__(self, max_traces: int | None = None) -> None:
        self.num_traces = 0
        self.max_traces = max_traces
        self.last_signature: tuple | None = None
        self.log: list[str] = []

    def record(self, name: str, explain_flag: bool | None, signature: Callable[[], tuple]) -> None:
        """Count one trace of `name`; raise past `max_traces`; log what changed if explaining."""
        self.num_traces += 1
        if self.max_traces is not None and self.num_traces > self.max_traces:
            raise RuntimeError(
                f"{name} can only be traced {self.max_traces} times, but it has now been "
                f"traced {self.num_traces} times. Set TREEMOD_EXPLAIN_RETRACES=1 (or "
                "filter_jit(..., explain_retraces=True)) to log which argument changed."
            )
        explaining = explain_flag if explain_flag is not None else _env_explain()
        if not explaining:
            return
        new = signature()
        if self.last_signature is not None:
            for line in explain(self.last_signature, new):
                message = f"retrace of {name}: {line}"
                self.log.append(message)
                logger.warning(message)
        self.last_signature = new


class _Traces:
    """Compiled versions and trace bookkeeping, shared by wrappers of the same method."""

    __slots__ = ("cache", "lowerable", "count")

    def __init__(self, max_traces: int | None = None) -> None:
        self.cache: dict[tuple, Callable[[list], Any]] = {}
        self.lowerable: dict[tuple, tuple[Any, int | None]] = {}
        self.count = _TraceCount(max_traces)


# Module methods share their compiled versions across wrappers, so `filter_jit(model.step)`
# written inside a loop does not recompile for every new model.
_SHARED: weakref.WeakKeyDictionary[Any, dict[tuple, _Traces]] = weakref.WeakKeyDictionary()


def _traces_for(target: Any, donate: str, explain_retraces: bool | None) -> _Traces:
    if target is None:
        return _Traces()
    try:
        per_target = _SHARED.setdefault(target, {})
    except TypeError:
        return _Traces()
    return per_target.setdefault((donate, explain_retraces), _Traces())


def _named(fn: Callable, name: str) -> Callable:
    """`fn`, renamed: JAX names the program (and nested calls in it) after the function."""
    fn.__name__ = fn.__qualname__ = name
    return fn


class _JitWrapper(TransformedFunction):
    """The callable returned by `filter_jit`."""

    def __init__(self, fn: Any, donate: str, explain_retraces: bool | None) -> None:
        self._fn = fn
        self._fn_tree, self._call_fn = split_fn(fn)
        self._donate = donate
        self._explain_flag = explain_retraces
        self._name = function_name(fn)
        if self._call_fn is not None:
            target: Any = self._call_fn
        elif self._fn_tree is not None:
            target = type(self._fn_tree)
        else:
            target = None
        self._traces = _traces_for(target, donate, explain_retraces)
        self._cache = self._traces.cache
        self._wraps(fn)

    # The hot path: keep it short.
    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        leaves, treedef = _flatten((self._fn_tree, args, kwargs))
        sig_id, mask, neg = KINDS[tuple(map(type, leaves))]
        static = tuple(compress(leaves, neg))
        try:
            entry = self._cache[(treedef, sig_id, static)]
        except KeyError:
            entry = self._new_entry(treedef, sig_id, mask, static)
        except TypeError:
            self._raise_unhashable(args, kwargs)
            raise
        return unpack_output(entry(list(compress(leaves, mask))))

    def __repr__(self) -> str:
        return f"filter_jit({self._name})"

    @property
    def num_traces(self) -> int:
        """How many times the function has been traced (compiled versions made)."""
        return self._traces.count.num_traces

    @property
    def retrace_explanations(self) -> list[str]:
        """The lines the retrace explainer has logged so far."""
        return self._traces.count.log

    def with_max_traces(self, max_traces: int | None) -> _JitWrapper:
        """A copy with its own compiled versions and trace count, failing past `max_traces`."""
        new = _JitWrapper(self._fn, self._donate, self._explain_flag)
        new._traces = _Traces(max_traces)
        new._cache = new._traces.cache
        return new

    def _raise_unhashable(self, args: tuple, kwargs: dict) -> None:
        error = unhashable_error("filter_jit", self._fn, (self._fn_tree, args, kwargs))
        if error is not None:
            raise error from None

    def _n_kept(self, treedef: Any, mask: tuple[bool, ...]) -> int:
        """How many dynamic leaves (at the front) are not donated."""
        if self._donate in ("all", "warn"):
            return 0
        fn_def, args_def, _ = treedef.children()
        n = fn_def.num_leaves
        if args_def.num_leaves and args_def.children():
            n += args_def.children()[0].num_leaves
        return sum(mask[:n])

    def _new_entry(
        self, treedef: Any, sig_id: int, mask: tuple[bool, ...], static: tuple
    ) -> Callable[[list], Any]:
        inner = self._make_inner(treedef, mask, static)
        if self._donate == "none":
            jitted = jax.jit(inner)
            entry: Callable[[list], Any] = jitted
            self._traces.lowerable[(treedef, sig_id, static)] = (jitted, None)
        else:
            k = self._n_kept(treedef, mask)

            def donating(keep: list, donated: list) -> Any:
                return inner(keep + donated)

            jitted = jax.jit(_named(donating, self._name), donate_argnums=1)
            if self._donate in ("all", "all-except-first"):

                def entry(dynamic: list) -> Any:
                    with warnings.catch_warnings():
                        warnings.filterwarnings("ignore", message=_UNUSED_DONATION)
                        return jitted(dynamic[:k], dynamic[k:])
            else:

                def entry(dynamic: list) -> Any:
                    return jitted(dynamic[:k], dynamic[k:])

            self._traces.lowerable[(treedef, sig_id, static)] = (jitted, k)
        self._cache[(treedef, sig_id, static)] = entry
        return entry

    def _make_inner(self, treedef: Any, mask: tuple[bool, ...], static: tuple) -> Callable:
        # Only what the trace needs: a reference to `self` (or to a module held by `self._fn`)
        # would keep the wrapper, or the module's arrays, alive as long as the cache.
        call, count, name, flag = self._call_fn, self._traces.count, self._name, self._explain_flag
        plain_fn = self._fn if call is None and self._fn_tree is None else None

        def inner(dynamic: list) -> Any:
            count.record(
                name, flag, lambda: (treedef, mask, static, tuple(aval_of(x) for x in dynamic))
            )
            fn_tree, args, kwargs = treedef.unflatten(merge_leaves(mask, dynamic, static))
            if call is not None:
                out = call(fn_tree, *args, **kwargs)
            elif plain_fn is None:
                out = fn_tree(*args, **kwargs)
            else:
                out = plain_fn(*args, **kwargs)
            return pack_output(out, held=True)

        return _named(inner, name)

    def lower(self, /, *args: Any, **kwargs: Any) -> Lowered:
        """Trace and lower for these arguments, for ahead-of-time compilation.

        Returns:
            A `Lowered` whose `.compile()` gives a callable taking arguments of the same
            structure, array shapes and static values.
        """
        leaves, treedef = _flatten((self._fn_tree, args, kwargs))
        sig_id, mask, neg = KINDS[tuple(map(type, leaves))]
        static = tuple(compress(leaves, neg))
        key = (treedef, sig_id, static)
        try:
            found = key in self._cache
        except TypeError:
            self._raise_unhashable(args, kwargs)
            raise
        if not found:
            self._new_entry(treedef, sig_id, mask, static)
        jitted, k = self._traces.lowerable[key]
        dynamic = list(compress(leaves, mask))
        parts = (dynamic,) if k is None else (dynamic[:k], dynamic[k:])
        return Lowered(jitted.lower(*parts), self, key, k)


class Lowered:
    """The result of `filter_jit(f).lower(*args)`: call `.compile()`; `.as_text()` shows it."""

    def __init__(self, lowered: Any, wrapper: _JitWrapper, key: tuple, k: int | None) -> None:
        self._lowered = lowered
        self._wrapper = wrapper
        self._key = key
        self._k = k

    def as_text(self) -> str:
        """The lowered program (StableHLO) as text."""
        return str(self._lowered.as_text())

    def compile(self) -> Compiled:
        """Compile, returning a callable with the wrapped function's signature."""
        return Compiled(self._lowered.compile(), self._wrapper, self._key, self._k)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lowered, name)


class Compiled:
    """An ahead-of-time compiled `filter_jit` function, callable like the original."""

    def __init__(self, compiled: Any, wrapper: _JitWrapper, key: tuple, k: int | None) -> None:
        self._compiled = compiled
        self._wrapper = wrapper
        self._key = key
        self._k = k

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        wrapper = self._wrapper
        leaves, treedef = _flatten((wrapper._fn_tree, args, kwargs))
        sig_id, mask, neg = KINDS[tuple(map(type, leaves))]
        static = tuple(compress(leaves, neg))
        if (treedef, sig_id, static) != self._key:
            raise TypeError(
                f"This compiled version of {wrapper._name} was lowered for arguments with a "
                "different tree structure or different static (non-array) values. Call "
                "`.lower(...)` again with these arguments, or call the filter_jit function "
                "itself, which compiles as needed."
            )
        dynamic = list(compress(leaves, mask))
        k = self._k
        if k is None:
            return unpack_output(self._compiled(dynamic))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_UNUSED_DONATION)
            return unpack_output(self._compiled(dynamic[:k], dynamic[k:]))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._compiled, name)


def filter_jit(
    fun: Callable[..., Any] | None = None,
    *,
    donate: Donate = "none",
    explain_retraces: bool | None = None,
) -> Any:
    """Compile a function with `jax.jit`, tracing its arrays and treating everything else as static.

    JAX and NumPy arrays anywhere in the arguments (positional or keyword, nested in modules,
    lists, dicts) are traced. Every other leaf (Python numbers, strings, functions, ...) is
    static: it is hashed and compared, and a new value compiles a new version. Outputs may hold
    non-array leaves. The call returns as soon as the computation is dispatched, like `jax.jit`.

    `fun` may be a function, a `Module` (its arrays are traced like an argument), a bound method
    of a module (`filter_jit(model.loss)` traces `model`'s arrays), or a method decorated in a
    class body.

    Arguments:
        fun: the function to compile. Omit it to use `filter_jit(donate=...)` as a decorator.
        donate: which argument buffers XLA may reuse for outputs: `"all"`, `"all-except-first"`
            (keep the first positional argument, and the arrays of `fun` itself), `"warn"`
            and `"warn-except-first"` (the same, but JAX warns about buffers it could not
            reuse) or `"none"`. Donated arrays must not be used after the call.
        explain_retraces: log (logger `"treemod"`, level WARNING) which argument path changed,
            and how, whenever the function is traced again. `None` reads the environment
            variable `TREEMOD_EXPLAIN_RETRACES` (`1` turns it on).

    Returns:
        The compiled function. It has `.lower(*args, **kwargs)` for ahead-of-time compilation;
        `treemod.debug.get_num_traces` counts its traces.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> @tm.filter_jit
        ... def scale(x, factor, name):
        ...     return x * factor, name.upper()
        >>> scale(jnp.ones(2), 3.0, "double")
        (Array([3., 3.], dtype=float32), 'DOUBLE')
        >>> scale(jnp.zeros(2), 3.0, "double")[0]
        Array([0., 0.], dtype=float32)
        >>> tm.debug.get_num_traces(scale)
        1
    """
    if donate not in _DONATE_MODES:
        raise ValueError(f"filter_jit: donate must be one of {_DONATE_MODES}; got {donate!r}.")
    if fun is None:
        return lambda f: filter_jit(f, donate=donate, explain_retraces=explain_retraces)
    if not callable(fun):
        raise TypeError(
            f"filter_jit expects a callable (function, Module or bound method); got "
            f"{type(fun).__name__}. As a decorator with options, write "
            "`@filter_jit(donate=...)`."
        )
    return _JitWrapper(fun, donate, explain_retraces)
