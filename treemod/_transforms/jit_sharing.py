"""Which `filter_jit` wrappers share one `JitCache`, and what their traces call.

`filter_jit(f)(x)` written inline makes a new wrapper per call; it must not compile again.
So wrappers of the same function share one `JitCache` per set of options, found in `_SHARED`,
keyed weakly on:

- a plain Python function (or a `SharedByIdentity` instance): itself;
- a transform wrapper of one (`filter_jit(filter_grad(f))`, declared by the wrapper class's
  `_tm_share_fields`): the function inside, the wrappers' classes and options added to the
  cache's options;
- a method bound to a module: its function (the module's arrays are traced like arguments,
  its static fields are in the key);
- a module: its class.

A function whose closure cells hold other objects than when its cache was made gets a new
cache (`closure_of`): `scale = 5.0` between two `filter_jit(f)(x)` must not run the program
built for the old `scale`. Cells the function assigns itself (a `nonlocal` counter: its state,
not its configuration) are left out, as reusing one wrapper would; telling them apart takes
the bytecode (`STORE_DEREF`), read once per code object. Anything else keeps a cache of its own.

The traced function must not hold the shared function strongly (the cache is keyed weakly on
it: a strong reference would keep both alive forever), so `share` returns a caller holding a
weak reference, rebuilding any transform wrappers around the function at trace time.
"""

from __future__ import annotations

import dis
import functools
import operator
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from treemod._transforms.jit_cache import JitCache

__all__ = ["SharedByIdentity", "all_shared_caches", "closure_of", "share", "share_target"]

Caller = Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]
"""What a trace calls: `caller(fn_tree, args, kwargs)` returns the function's output."""

_SHARED: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], tuple[JitCache, Caller]]] = (
    weakref.WeakKeyDictionary()
)


def share(
    fn: Any, fn_tree: Any, call: Callable[..., Any] | None, options: tuple[Any, ...]
) -> tuple[JitCache, Caller]:
    """The cache a new `filter_jit` wrapper of `fn` uses, and what its traces call.

    Runs once per wrapper, so on the path of `filter_jit(f)(x)` written inline: the caller is
    made with the cache and shared with it, and nothing else is allocated.

    Arguments:
        fn: the wrapped callable.
        fn_tree: its pytree part (a module, or the module a method is bound to), or `None`.
        call: the method's function when `fn` is a bound method of `fn_tree`, else `None`.
        options: the wrapper's options (`donate`, `explain_retraces`).

    Returns:
        `(cache, caller)`: a shared or a new `JitCache`, and `caller(fn_tree, args, kwargs)`.
    """
    remake = None
    closure: tuple[Any, ...] = ()
    if call is None and fn_tree is not None:  # a module: its class lives as long as it does
        target: Any = type(fn_tree)
    elif call is not None:
        target = call
    else:
        found = share_target(fn)
        if found is None:
            return JitCache(), functools.partial(_call, lambda: fn, None)
        target, closure, variant, remake = found
        options += (variant,)
    try:
        per_target = _SHARED.setdefault(target, {})
    except TypeError:  # not weakly referenceable: a cache of its own
        return JitCache(), functools.partial(_call, lambda: target, remake)
    entry = per_target.get(options)
    if entry is None or not _same_objects(entry[0].closure, closure):
        caller = _call_tree if isinstance(target, type) else _weak_caller(target, remake)
        entry = per_target[options] = (JitCache(closure=closure), caller)
    return entry


def _weak_caller(target: Any, remake: Callable[[Any], Any] | None) -> Caller:
    return functools.partial(_call, weakref.ref(target), remake)


def _call_tree(fn_tree: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return fn_tree(*args, **kwargs)


def _call(
    get: Callable[[], Any],
    remake: Callable[[Any], Any] | None,
    fn_tree: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Call the function `get()` returns (rebuilt by `remake`): with the module first for a
    method (`fn_tree` is its module), else with the arguments alone."""
    fn = get() if remake is None else remake(get())
    return fn(*args, **kwargs) if fn_tree is None else fn(fn_tree, *args, **kwargs)


def all_shared_caches() -> Iterator[JitCache]:
    """Every shared `JitCache` alive (for `treemod.clear_caches`)."""
    for per_target in list(_SHARED.values()):
        for cache, _ in list(per_target.values()):
            yield cache


def _same_objects(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(map(operator.is_, a, b))


def share_target(fn: Any) -> tuple[Any, tuple[Any, ...], tuple[Any, ...], Any] | None:
    """How `filter_jit` wrappers of the plain callable `fn` share versions, or `None`.

    Returns `(target, closure, variant, remake)`: the function to key on weakly (the one
    inside any transform wrappers such as `filter_grad(f)`, found by their `share_spec`), its
    closure, the wrappers' options (part of the key), and `remake(target)` rebuilding `fn` from
    the target (`None` when `fn` is the target), for the trace to call without holding `fn`.
    """
    variant: tuple[Any, ...] = ()
    rewraps: list[Callable[[Any], Any]] = []
    while not _shareable(fn):
        found = fn.share_spec() if getattr(type(fn), "_tm_share_fields", None) else None
        if found is None:
            return None
        fn, options, rewrap = found
        try:
            hash(options)
        except TypeError:  # an unhashable option (a dict in_axes): this wrapper shares nothing
            return None
        variant += (options,)
        rewraps.append(rewrap)
    remake = functools.partial(_remake, tuple(reversed(rewraps))) if rewraps else None
    return fn, closure_of(fn), variant, remake


def _remake(rewraps: tuple[Callable[[Any], Any], ...], target: Any) -> Any:
    for rewrap in rewraps:
        target = rewrap(target)
    return target


class SharedByIdentity:
    """Base class of callables that are one function for good once made (`filter_custom_jvp`,
    `filter_custom_vjp`): `filter_jit` wrappers of the same instance share compiled versions,
    as wrappers of the same Python function do."""

    __slots__ = ()


def _shareable(fn: Any) -> bool:
    """A Python function, or a `SharedByIdentity`: shared by identity."""
    return type(fn) is types.FunctionType or isinstance(fn, SharedByIdentity)


_EMPTY_CELL = object()
_SELF = object()
_OWNED = object()


def closure_of(fn: Any) -> tuple[Any, ...]:
    """What `fn`'s closure cells hold now (itself replaced by a marker, to avoid a cycle),
    with the cells `fn` assigns itself replaced by a marker (see the module docstring).

    Example:
        >>> def make(scale):
        ...     return lambda x: x * scale
        >>> closure_of(make(2.0))
        (2.0,)
    """
    cells = getattr(fn, "__closure__", None)
    if not cells:
        return ()
    owned = _assigned_cells(fn.__code__)
    out = []
    for i, cell in enumerate(cells):
        if i in owned:
            out.append(_OWNED)
            continue
        try:
            value = cell.cell_contents
        except ValueError:
            value = _EMPTY_CELL
        out.append(_SELF if value is fn else value)
    return tuple(out)


@functools.lru_cache(maxsize=1024)
def _assigned_cells(code: types.CodeType) -> frozenset[int]:
    """The positions in `co_freevars` (so in `__closure__`) of the cells `code` assigns."""
    stored = {
        ins.argval
        for ins in dis.get_instructions(code)
        if ins.opname in ("STORE_DEREF", "DELETE_DEREF")
    }
    return frozenset(i for i, name in enumerate(code.co_freevars) if name in stored)
