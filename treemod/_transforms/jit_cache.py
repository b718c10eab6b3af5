"""`filter_jit`'s compiled versions: how they are keyed, shared, bounded and counted.

A compiled version is keyed by `(treedef, sig_id, static)` of the flattened
`(fn_tree, args, kwargs)`. Static leaves compare as Python's `==` says, except Python floats
and complex numbers, which compare by their bit pattern: `0.0` and `-0.0` are different versions
(`math.copysign` tells them apart), and a NaN finds the version compiled for the same NaN
instead of compiling again on every call.

Wrappers of the same function share their versions (`filter_jit(f)(x)` written inline compiles
once), keyed weakly on the function object (or, for a Module method, its function; for a
Module, its class) and the wrapper's options. A transform wrapper of a function
(`filter_grad(f)`, `filter_vmap(f)`, declared by `_tm_share_fields`) shares through that
function, its options part of the key (`share_target`). A function whose closure cells now
hold other objects than when it was first wrapped gets fresh versions (cells the function itself
assigns, such as a `nonlocal` counter, are left out). Each function keeps at most
`MAX_VERSIONS` versions, dropping the oldest, and warns once at `WARN_VERSIONS`.

A version's key holds the whole tree structure, so modules (or owners of a method) whose
static fields differ never share a program; each such structure also has its own trace count.
No lock is held while tracing: a miss registers the new version as pending (under the lock,
briefly) and runs it; threads that miss the same key meanwhile run the same `jax.jit`, which
traces once. Threads tracing functions that call each other therefore cannot deadlock.
"""

from __future__ import annotations

import dis
import functools
import os
import struct
import threading
import types
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from treemod._format.retrace import explain, logger
from treemod._transforms.leaves import KINDS

__all__ = ["MAX_VERSIONS", "WARN_VERSIONS", "RecompileWarning", "static_key", "traces_for"]

# One function's compiled versions: warn at this many, keep at most that many.
WARN_VERSIONS = 64
MAX_VERSIONS = 512


class RecompileWarning(UserWarning):
    """One `filter_jit` function has compiled many versions (see `WARN_VERSIONS`)."""


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
        self.last_signature: tuple[Any, ...] | None = None
        self.log: list[str] = []

    def record(
        self, name: str, explain_flag: bool | None, signature: Callable[[], tuple[Any, ...]]
    ) -> None:
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


_EMPTY_CELL = object()
_SELF = object()
_OWNED = object()


def closure_of(fn: Any) -> tuple[Any, ...]:
    """What `fn`'s closure cells hold now (itself replaced by a marker, to avoid a cycle).

    Cells that `fn` itself assigns (`nonlocal n; n += 1`: a counter, a cache) are its state,
    not its configuration: they count as unchanged, as they would for one wrapper reused.
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


class _Traces:
    """Compiled versions and trace bookkeeping, shared by wrappers of the same function.

    `cache` is read without a lock (the hot path). A miss takes `lock` only to find or add
    the key's `pending` version, then runs it unlocked; the version moves to `cache` once its
    first call has returned. `counts` holds one trace count per tree structure of the
    callable (a Module's static fields are in it; `None`'s structure for a plain function).
    """

    __slots__ = (
        "cache",
        "pending",
        "lowerable",
        "counts",
        "max_traces",
        "lock",
        "closure",
        "warn_at",
    )

    def __init__(self, max_traces: int | None = None, closure: tuple[Any, ...] = ()) -> None:
        self.cache: dict[tuple[Any, ...], Callable[[list[Any]], Any]] = {}
        self.pending: dict[tuple[Any, ...], Callable[[list[Any]], Any]] = {}
        self.lowerable: dict[tuple[Any, ...], tuple[Any, int | None]] = {}
        self.counts: dict[Any, _TraceCount] = {}
        self.max_traces = max_traces
        self.lock = threading.Lock()
        self.closure = closure
        self.warn_at: int | None = WARN_VERSIONS

    def count_for(self, structure: Any) -> _TraceCount:
        """The trace count of callables with this tree structure (made on first use)."""
        count = self.counts.get(structure)
        if count is None:
            count = self.counts[structure] = _TraceCount(self.max_traces)
            if len(self.counts) > MAX_VERSIONS:
                del self.counts[next(iter(self.counts))]
        return count

    def publish(self, key: tuple[Any, ...], entry: Callable[[list[Any]], Any], name: str) -> None:
        """Add a compiled version, dropping the oldest past `MAX_VERSIONS`; warn once."""
        cache = self.cache
        cache[key] = entry
        if len(cache) > MAX_VERSIONS:
            oldest = next(iter(cache))
            del cache[oldest]
            self.lowerable.pop(oldest, None)
        if self.warn_at is not None and len(cache) >= self.warn_at:
            self.warn_at = None
            warnings.warn(
                f"filter_jit({name}) has now compiled {len(cache)} versions, one for each new "
                "combination of static (non-array) argument values, tree structure, shapes "
                "and dtypes; each keeps its compiled program in memory. A Python number or "
                "other static value that changes between calls should be passed as an array "
                "(jnp.asarray(value)) so that it is traced; TREEMOD_EXPLAIN_RETRACES=1 logs "
                f"which argument changed. treemod keeps at most {MAX_VERSIONS} versions per "
                "function (dropping the oldest); to fail instead, use "
                "`filter_jit(f).with_max_traces(n)`.",
                RecompileWarning,
                stacklevel=4,
            )


# Wrappers of the same function (a Module method's function, a Module class) share their
# compiled versions, so `filter_jit(f)(x)` or `filter_jit(model.step)` written inside a loop
# compiles once. Weak keys: a function that is freed takes its versions with it.
_SHARED: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], _Traces]] = (
    weakref.WeakKeyDictionary()
)


def traces_for(
    target: Any,
    donate: str,
    explain_retraces: bool | None,
    closure: tuple[Any, ...] = (),
    variant: tuple[Any, ...] = (),
) -> _Traces:
    """The shared versions of `target` under these options (new ones if its closure changed);
    `variant`: the options of transform wrappers around it (see `share_target`)."""
    if target is None:
        return _Traces()
    try:
        per_target = _SHARED.setdefault(target, {})
    except TypeError:  # not weakly referenceable: this wrapper keeps its own versions
        return _Traces()
    options = (donate, explain_retraces, variant)
    traces = per_target.get(options)
    if traces is None or not _same_objects(traces.closure, closure):
        traces = per_target[options] = _Traces(closure=closure)
    return traces


def _same_objects(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def share_target(fn: Any) -> tuple[Any, tuple[Any, ...], tuple[Any, ...], Any] | None:
    """How `filter_jit` wrappers of the plain callable `fn` share versions, or `None`.

    Returns `(target, closure, variant, remake)`: the function to key on weakly (the one
    inside any transform wrappers such as `filter_grad(f)`, found by their `share_spec`), its
    closure, the wrappers' options (part of the key), and `remake(target)` rebuilding `fn` from
    the target (`None` when `fn` is the target), for the trace to call without holding `fn`.
    """
    variant: tuple[Any, ...] = ()
    rewraps: list[Callable[[Any], Any]] = []
    while not shareable(fn):
        found = fn.share_spec() if _is_transform(fn) else None
        if found is None:
            return None
        fn, options, rewrap = found
        try:
            hash(options)
        except TypeError:  # an unhashable option (a dict in_axes): this wrapper shares nothing
            return None
        variant += (options,)
        rewraps.append(rewrap)
    remake = None
    if rewraps:
        remake = functools.partial(_remake, tuple(reversed(rewraps)))
    return fn, closure_of(fn), variant, remake


def _is_transform(fn: Any) -> bool:
    return getattr(type(fn), "_tm_share_fields", None) is not None


def _remake(rewraps: tuple[Callable[[Any], Any], ...], target: Any) -> Any:
    for rewrap in rewraps:
        target = rewrap(target)
    return target


def shareable(fn: Any) -> bool:
    """Whether wrappers of the plain callable `fn` may share versions: a Python function, or
    an object whose class says it is one function for good (`__tm_shareable__`, as
    `filter_custom_vjp` does), shared by identity."""
    return type(fn) is types.FunctionType or getattr(type(fn), "__tm_shareable__", False)


_pack_float = struct.Struct("<d").pack
_pack_complex = struct.Struct("<dd").pack


def _bits(x: Any) -> bytes:
    if isinstance(x, float):
        return _pack_float(x)
    return _pack_complex(x.real, x.imag)


class _FloatPositions(dict[int, tuple[int, ...]]):
    """Maps a `sig_id` to the positions of its float and complex static leaves."""

    def __missing__(self, sig_id: int) -> tuple[int, ...]:
        sig = next(s for s, i in list(KINDS.sig_ids.items()) if i == sig_id)
        static_types = [t for t in sig if t is not None]
        value = tuple(i for i, t in enumerate(static_types) if issubclass(t, float | complex))
        self[sig_id] = value
        return value


FLOAT_POSITIONS = _FloatPositions()


def static_key(static: tuple[Any, ...], positions: tuple[int, ...]) -> tuple[Any, ...]:
    """The cache key of `static`, whose floats and complex numbers (at `positions`) compare by
    their bit patterns: `0.0` and `-0.0` differ, a NaN equals itself.

    When every leaf at `positions` is a plain nonzero, non-NaN `float`, `static` itself is the
    key (the hot path: no allocation), since two such floats are `==` exactly when their bits
    agree. Otherwise (a zero, a NaN, a complex number, a float subclass) every leaf at
    `positions` is replaced by its bit pattern. A position holds leaves of one type only (the
    types are part of `sig_id`), and a bit pattern (bytes) never equals a float.

    Arguments:
        static: the static leaves of a call.
        positions: where `static` holds floats or complex numbers.

    Returns:
        `static`, or a copy with the bit patterns.

    Example:
        >>> static = (0.5, "relu")
        >>> static_key(static, (0,)) is static
        True
        >>> static_key((-0.0, "relu"), (0,))
        (b'\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x80', 'relu')
    """
    for i in positions:
        x = static[i]
        if type(x) is not float or x != x or x == 0.0:
            break
    else:
        return static
    key = list(static)
    for i in positions:
        key[i] = _bits(key[i])
    return tuple(key)
