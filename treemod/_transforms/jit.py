"""`filter_jit`: `jax.jit` where arrays are traced and every other leaf is static.

Per call the wrapper does as little Python as possible: one C++ flatten of
`(fn_tree, args, kwargs)`, a cached classification of the leaf types, two `compress` passes and
one dict lookup keyed by `(treedef, static leaf types, static leaves)`. Each key owns a `jax.jit`
of a function that rebuilds the arguments. An output with non-array leaves comes back as a
`HeldPacked` with only arrays as leaves, which keeps JAX's C++ dispatch path, and is rebuilt
after the call; nothing blocks.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from itertools import compress
from typing import Any, Generic, Literal, overload

import jax
import jax.tree_util as jtu

from treemod._format.paths import function_name
from treemod._format.retrace import aval_of
from treemod._transforms.error_if import runtime_check_error
from treemod._transforms.jit_cache import (
    FLOAT_POSITIONS,
    _Traces,
    share_target,
    static_key,
    traces_for,
)
from treemod._transforms.jit_cache import _TraceCount as _TraceCount
from treemod._transforms.leaves import KINDS, merge_leaves, pack_output, unpack_output
from treemod._transforms.unhashable import unhashable_error
from treemod._transforms.wrapper import P, R, TransformedFunction, split_fn

__all__ = ["filter_jit"]

Donate = Literal["all", "all-except-first", "warn", "warn-except-first", "none"]
_DONATE_MODES = ("all", "all-except-first", "warn", "warn-except-first", "none")
_UNUSED_DONATION = "Some donated buffers were not usable"
_flatten = jtu.tree_flatten


def signature_key(
    leaves: list[Any], treedef: Any
) -> tuple[tuple[Any, ...], tuple[bool, ...], tuple[Any, ...]]:
    """The cache key of flattened arguments, their array mask and their static leaves."""
    sig_id, mask, neg = KINDS[tuple(map(type, leaves))]
    static = tuple(compress(leaves, neg))
    floats = FLOAT_POSITIONS[sig_id]
    return (treedef, sig_id, static_key(static, floats) if floats else static), mask, static


def _reference(code: Any, weak: bool) -> Callable[[], Any]:
    """A getter of `code`: weak for a shared function, whose versions live in a cache keyed
    weakly on it (a strong reference from the traced function would keep both alive)."""
    if weak and code is not None:
        return weakref.ref(code)
    return lambda: code


def _raise_check_error(error: Exception) -> None:
    """Raise the `RuntimeCheckError` an `error_if` inside the program raised, if it was one."""
    check = runtime_check_error(error)
    if check is not None:
        raise check from None


def _named(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """`fn`, renamed: JAX names the program (and nested calls in it) after the function."""
    fn.__name__ = fn.__qualname__ = name
    return fn


class _JitWrapper(TransformedFunction[P, R]):
    """The callable returned by `filter_jit`: typed as the function it wraps (`Callable[P, R]`)."""

    def __init__(self, fn: Callable[P, R], donate: str, explain_retraces: bool | None) -> None:
        self._fn: Any = fn
        self._fn_tree, self._call_fn = split_fn(fn)
        self._donate = donate
        self._explain_flag = explain_retraces
        self._name = function_name(fn)
        closure: tuple[Any, ...] = ()
        variant: tuple[Any, ...] = ()
        self._remake: Any = None  # rebuilds `fn` from `target` when fn wraps it (share_target)
        if self._call_fn is not None:
            target: Any = self._call_fn
        elif self._fn_tree is not None:
            target = type(self._fn_tree)
        elif (shared := share_target(fn)) is not None:
            target, closure, variant, self._remake = shared
        else:
            target = None
        # The traced function holds the shared function weakly (the shared cache is keyed
        # weakly on it): a strong reference would keep it, and its versions, alive forever.
        self._weak = target is not None and not isinstance(target, type)
        self._target = target if self._remake is not None else None
        self._traces = traces_for(target, donate, explain_retraces, closure, variant)
        self._cache = self._traces.cache
        self._wraps(fn)

    # The hot path: keep it short.
    def __call__(self, /, *args: P.args, **kwargs: P.kwargs) -> R:
        leaves, treedef = _flatten((self._fn_tree, args, kwargs))
        sig_id, mask, neg = KINDS[tuple(map(type, leaves))]
        static = tuple(compress(leaves, neg))
        floats = FLOAT_POSITIONS[sig_id]
        key = (treedef, sig_id, static_key(static, floats) if floats else static)
        try:
            entry = self._cache[key]
        except KeyError:
            return self._miss(key, mask, static, list(compress(leaves, mask)))  # type: ignore[no-any-return]
        except TypeError:
            self._raise_unhashable(args, kwargs)
            raise
        try:  # costs nothing unless raised
            return unpack_output(entry(list(compress(leaves, mask))))  # type: ignore[no-any-return]
        except jax.errors.JaxRuntimeError as e:
            _raise_check_error(e)
            raise

    def __repr__(self) -> str:
        return f"filter_jit({self._name})"

    def _count(self) -> _TraceCount | None:
        """This callable's trace count (its static parts' own), or `None` before any trace."""
        try:
            return self._traces.counts.get(jtu.tree_structure(self._fn_tree))
        except TypeError:  # an unhashable static field: never traced
            return None

    @property
    def num_traces(self) -> int:
        """How many times the function has been traced (compiled versions made)."""
        count = self._count()
        return 0 if count is None else count.num_traces

    @property
    def retrace_explanations(self) -> list[str]:
        """The lines the retrace explainer has logged so far."""
        count = self._count()
        return [] if count is None else count.log

    def with_max_traces(self, max_traces: int | None) -> _JitWrapper[P, R]:
        """A copy with its own compiled versions and trace count, failing past `max_traces`."""
        new: _JitWrapper[P, R] = _JitWrapper(self._fn, self._donate, self._explain_flag)
        new._traces = _Traces(max_traces)
        new._cache = new._traces.cache
        return new

    def _raise_unhashable(self, args: tuple[Any, ...], kwargs: dict[Any, Any]) -> None:
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

    def _miss(
        self,
        key: tuple[Any, ...],
        mask: tuple[bool, ...],
        static: tuple[Any, ...],
        dynamic: list[Any],
    ) -> Any:
        """Trace, compile and run a new version; publish it once it has run (thread-safe).

        The lock is held only to find or add the pending version, never while tracing, so
        threads tracing functions that call each other cannot deadlock; threads running the
        same pending `jax.jit` meanwhile are made to wait by JAX, which traces once.
        """
        traces = self._traces
        with traces.lock:
            entry = traces.cache.get(key)
            if entry is None:
                entry = traces.pending.get(key)
            first = entry is None
            if entry is None:
                entry = traces.pending[key] = self._new_entry(key, mask, static)
        try:
            out = entry(dynamic)
        except BaseException as e:
            if first:  # not published: the next call traces again
                with traces.lock:
                    del traces.pending[key]
                    if key not in traces.cache:
                        traces.lowerable.pop(key, None)
            if isinstance(e, jax.errors.JaxRuntimeError):
                _raise_check_error(e)
            raise
        if first:
            with traces.lock:
                del traces.pending[key]
                traces.publish(key, entry, self._name)
        return unpack_output(out)

    def _new_entry(
        self, key: tuple[Any, ...], mask: tuple[bool, ...], static: tuple[Any, ...]
    ) -> Callable[[list[Any]], Any]:
        treedef = key[0]
        inner = self._make_inner(treedef, mask, static)
        if self._donate == "none":
            jitted = jax.jit(inner)
            entry: Callable[[list[Any]], Any] = jitted
            self._traces.lowerable[key] = (jitted, None)
        else:
            k = self._n_kept(treedef, mask)

            def donating(keep: list[Any], donated: list[Any]) -> Any:
                return inner(keep + donated)

            jitted = jax.jit(_named(donating, self._name), donate_argnums=1)
            if self._donate in ("all", "all-except-first"):

                def entry(dynamic: list[Any]) -> Any:
                    with warnings.catch_warnings():
                        warnings.filterwarnings("ignore", message=_UNUSED_DONATION)
                        return jitted(dynamic[:k], dynamic[k:])
            else:

                def entry(dynamic: list[Any]) -> Any:
                    return jitted(dynamic[:k], dynamic[k:])

            self._traces.lowerable[key] = (jitted, k)
        return entry

    def _make_inner(
        self, treedef: Any, mask: tuple[bool, ...], static: tuple[Any, ...]
    ) -> Callable[..., Any]:
        # Only what the trace needs: a reference to `self` (or to a module held by `self._fn`)
        # would keep the wrapper, or the module's arrays, alive as long as the cache.
        call, name, flag = self._call_fn, self._name, self._explain_flag
        count = self._traces.count_for(treedef.children()[0])
        plain_fn = self._fn if call is None and self._fn_tree is None else None
        code = call if call is not None else plain_fn
        remake = self._remake
        if remake is not None:  # `fn` wraps the shared target: rebuild it from the target
            code = self._target
        get_code = _reference(code, self._weak)
        if remake is not None:
            get_target = get_code

            def get_code() -> Any:
                return remake(get_target())

        calls_tree, calls_method = call is None and plain_fn is None, call is not None
        del call, plain_fn, code  # `inner` must not hold them (see `_reference`)

        def inner(dynamic: list[Any]) -> Any:
            count.record(
                name, flag, lambda: (treedef, mask, static, tuple(aval_of(x) for x in dynamic))
            )
            fn_tree, args, kwargs = treedef.unflatten(merge_leaves(mask, dynamic, static))
            if calls_tree:
                out = fn_tree(*args, **kwargs)
            elif calls_method:
                out = get_code()(fn_tree, *args, **kwargs)
            else:
                out = get_code()(*args, **kwargs)
            return pack_output(out, held=True)

        return _named(inner, name)

    def lower(self, /, *args: P.args, **kwargs: P.kwargs) -> Lowered[P, R]:
        """Trace and lower for these arguments, for ahead-of-time compilation.

        Returns:
            A `Lowered` whose `.compile()` gives a callable taking arguments of the same
            structure, array shapes and static values.
        """
        leaves, treedef = _flatten((self._fn_tree, args, kwargs))
        key, mask, static = signature_key(leaves, treedef)
        try:
            found = key in self._traces.lowerable
        except TypeError:
            self._raise_unhashable(args, kwargs)
            raise
        if not found:
            with self._traces.lock:
                if key not in self._traces.lowerable:
                    self._traces.publish(key, self._new_entry(key, mask, static), self._name)
        jitted, k = self._traces.lowerable[key]
        dynamic = list(compress(leaves, mask))
        parts = (dynamic,) if k is None else (dynamic[:k], dynamic[k:])
        lowered = Lowered(jitted.lower(*parts), self, key, k)
        # What `save_compiled` records: the arguments as the trace saw them.
        lowered._signature = (treedef, mask, static, tuple(aval_of(x) for x in dynamic))
        return lowered


class Lowered(Generic[P, R]):
    """The result of `filter_jit(f).lower(*args)`: call `.compile()`; `.as_text()` shows it."""

    def __init__(
        self, lowered: Any, wrapper: _JitWrapper[P, R], key: tuple[Any, ...], k: int | None
    ) -> None:
        self._lowered = lowered
        self._wrapper = wrapper
        self._key = key
        self._k = k
        self._signature: tuple[Any, ...] = ()

    def as_text(self) -> str:
        """The lowered program (StableHLO) as text."""
        return str(self._lowered.as_text())

    def compile(self, compiler_options: dict[str, Any] | None = None) -> Compiled[P, R]:
        """Compile, returning a callable with the wrapped function's signature.

        Arguments:
            compiler_options: XLA options for this compilation only (`jax.jit`'s
                `.lower(...).compile(compiler_options=...)`), e.g.
                `{"xla_cpu_experimental_ynn_fusion_type": ""}`.

        Returns:
            A `Compiled` taking arguments of the same structure, shapes and static values.
        """
        compiled = Compiled(
            self._lowered.compile(compiler_options), self._wrapper, self._key, self._k
        )
        compiled._signature = self._signature
        return compiled

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lowered, name)


class Compiled(Generic[P, R]):
    """An ahead-of-time compiled `filter_jit` function, callable like the original."""

    def __init__(
        self, compiled: Any, wrapper: _JitWrapper[P, R], key: tuple[Any, ...], k: int | None
    ) -> None:
        self._compiled = compiled
        self._wrapper = wrapper
        self._key = key
        self._k = k
        self._signature: tuple[Any, ...] = ()

    def __call__(self, /, *args: P.args, **kwargs: P.kwargs) -> R:
        wrapper = self._wrapper
        leaves, treedef = _flatten((wrapper._fn_tree, args, kwargs))
        key, mask, _ = signature_key(leaves, treedef)
        if key != self._key:
            raise TypeError(
                f"This compiled version of {wrapper._name} was lowered for arguments with a "
                "different tree structure or different static (non-array) values. Call "
                "`.lower(...)` again with these arguments, or call the filter_jit function "
                "itself, which compiles as needed."
            )
        dynamic = list(compress(leaves, mask))
        k = self._k
        if k is None:
            return unpack_output(self._compiled(dynamic))  # type: ignore[no-any-return]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_UNUSED_DONATION)
            return unpack_output(self._compiled(dynamic[:k], dynamic[k:]))  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._compiled, name)


@overload
def filter_jit(
    fun: Callable[P, R], *, donate: Donate = "none", explain_retraces: bool | None = None
) -> _JitWrapper[P, R]: ...


@overload
def filter_jit(
    fun: None = None, *, donate: Donate = "none", explain_retraces: bool | None = None
) -> Callable[[Callable[P, R]], _JitWrapper[P, R]]: ...


def filter_jit(
    fun: Callable[P, R] | None = None,
    *,
    donate: Donate = "none",
    explain_retraces: bool | None = None,
) -> _JitWrapper[P, R] | Callable[[Callable[P, R]], _JitWrapper[P, R]]:
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
        The compiled function, typed as `fun` (a type checker sees its parameters and result).
        It has `.lower(*args, **kwargs)` for ahead-of-time compilation and
        `.with_max_traces(n)`; `treemod.debug.get_num_traces` counts its traces.

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
