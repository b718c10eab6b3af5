"""`filter_jit`'s cache: `JitCache` holds one function's compiled versions; the key is made here.

Start with `JitCache`'s docstring: what a key is made of, when a version is valid, how threads
share it. `call_key` computes a call's key from its flattened arguments (`KINDS` classifies the
leaf types once per combination; `static_key` keys floats by their bits; `snapshot_structure`
copies mutable static values). `TraceCount` counts traces and remembers what the retrace
explainer needs. Which wrappers share one `JitCache` is decided in `jit_sharing.py`.
"""

from __future__ import annotations

import functools
import os
import struct
import threading
import warnings
from collections.abc import Callable
from itertools import compress
from typing import Any

import jax.tree_util as jtu

from treemod._format.retrace import explain, logger
from treemod._tree.filters import IS_ARRAY_TYPE
from treemod._tree.module_info import static_field_names

__all__ = [
    "KINDS",
    "MAX_VERSIONS",
    "WARN_VERSIONS",
    "JitCache",
    "RecompileWarning",
    "TraceCount",
    "call_key",
    "snapshot_structure",
    "static_key",
]

# One cache's compiled versions: warn at this many, keep at most that many.
WARN_VERSIONS = 64
MAX_VERSIONS = 512

Key = tuple[Any, int, tuple[Any, ...]]
"""`(treedef, sig_id, static key)`: see `JitCache`."""


class RecompileWarning(UserWarning):
    """One `filter_jit` function has compiled many versions (see `WARN_VERSIONS`)."""


class JitCache:
    """The compiled versions of one function under one set of `filter_jit` options.

    Invariants:

    - **Key.** A version is keyed by `(treedef, sig_id, static)` of the flattened
      `(fn_tree, args, kwargs)` (`call_key`). `treedef` is the tree structure, static fields
      of modules included; `sig_id` numbers the leaf types with every array type erased (NumPy
      and JAX arrays share versions; `1` and `1.0` do not); `static` holds the non-array leaves,
      compared with `==`, except floats and complex numbers, compared by their bits (`0.0` and
      `-0.0` differ, a NaN finds its own version). Shapes and dtypes are not in the key: each
      version is one `jax.jit`, whose own cache compiles per shape and dtype.
    - **Validity.** A stored key holds the values of the call that made it: a static field
      holding a dict, list or set is copied into the key (`snapshot_structure`), so mutating
      it later makes the next call miss instead of running the program built for the old
      value. A version stays valid until dropped: past `MAX_VERSIONS` (the oldest first), by
      `clear()` (`treemod.clear_caches`), or when the function it was made for is freed.
    - **Threads.** `versions` is read without a lock (the per-call path: one dict lookup under
      the GIL). `lock` guards adding and dropping versions and is never held while tracing, so
      threads tracing functions that call each other cannot deadlock. A new version is added
      before its first call returns; threads that find it meanwhile call the same `jax.jit`,
      which traces once. A version whose first call raised is dropped again (as `jax.jit`
      keeps no failed trace).
    - **Counting.** `counts` holds one `TraceCount` per tree structure of the callable itself
      (`fn_tree`: a module's static fields, or `None` for a plain function), so each module
      configuration counts its own traces (`treemod.debug.get_num_traces`).

    Why not one `jax.jit` with the key as a static argument: measured as fast (0.94x-0.99x
    per call), but JAX keeps the first key object it saw, so a mutated dict in a static field
    would go stale there, and JAX's cache is not bounded per function.

    Attributes:
        versions: key -> the compiled callable, called with the list of array leaves.
        counts: structure of the callable -> its `TraceCount`.
        max_traces: the limit each new `TraceCount` gets (`with_max_traces`).
        warn_at: the number of versions that warns (`None`: do not warn).
        closure: what the shared function's closure cells held when this cache was made.
        lock: guards writes to `versions` and `counts`.
    """

    __slots__ = ("versions", "counts", "max_traces", "warn_at", "closure", "lock")

    def __init__(self, max_traces: int | None = None, closure: tuple[Any, ...] = ()) -> None:
        self.versions: dict[Key, Callable[[list[Any]], Any]] = {}
        self.counts: dict[Any, TraceCount] = {}
        self.max_traces = max_traces
        self.warn_at: int | None = WARN_VERSIONS
        self.closure = closure
        self.lock = threading.Lock()

    def add(self, key: Key, version: Callable[[list[Any]], Any], name: str) -> None:
        """Store a version (the caller holds `lock`); drop the oldest past `MAX_VERSIONS`."""
        versions = self.versions
        versions[key] = version
        if len(versions) > MAX_VERSIONS:
            del versions[next(iter(versions))]
        if self.warn_at is not None and len(versions) >= self.warn_at:
            self.warn_at = None
            warnings.warn(
                f"filter_jit({name}) has now compiled {len(versions)} versions, one for each "
                "new combination of static (non-array) argument values, tree structure, shapes "
                "and dtypes; each keeps its compiled program in memory. A Python number or "
                "other static value that changes between calls should be passed as an array "
                "(jnp.asarray(value)) so that it is traced; TREEMOD_EXPLAIN_RETRACES=1 logs "
                f"which argument changed. treemod keeps at most {MAX_VERSIONS} versions per "
                "function (dropping the oldest); to fail instead, use "
                "`filter_jit(f).with_max_traces(n)`.",
                RecompileWarning,
                stacklevel=5,
            )

    def discard(self, key: Key, version: Callable[[list[Any]], Any]) -> None:
        """Drop `version` if it is still the one stored at `key` (its first call failed)."""
        with self.lock:
            if self.versions.get(key) is version:
                del self.versions[key]

    def count_for(self, structure: Any) -> TraceCount:
        """The trace count of callables with this tree structure (made on first use)."""
        with self.lock:
            count = self.counts.get(structure)
            if count is None:
                count = self.counts[structure] = TraceCount(self.max_traces)
                if len(self.counts) > MAX_VERSIONS:
                    del self.counts[next(iter(self.counts))]
            return count

    def expect_many_versions(self) -> None:
        """Never warn about the number of versions: for a function meant to compile one
        version per configuration, such as the cache every eager layer call shares."""
        self.warn_at = None

    def clear(self) -> None:
        """Drop every version (the trace counts go on)."""
        with self.lock:
            self.versions.clear()


def _env_explain() -> bool:
    return os.environ.get("TREEMOD_EXPLAIN_RETRACES", "").lower() in ("1", "true", "yes", "on")


class TraceCount:
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
        """Count one trace of `name`; raise past `max_traces`; log what changed if explaining.

        The explanation is a diagnostic: if making it fails (an argument whose `repr` or `==`
        raises), one line says so and the trace goes on.
        """
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
        try:
            new = signature()
            lines = [] if self.last_signature is None else explain(self.last_signature, new)
        except Exception as e:  # noqa: BLE001 - a diagnostic never changes what the call does
            new, lines = None, [f"(cannot explain it: {type(e).__name__}: {e})"]
        for line in lines:
            message = f"retrace of {name}: {line}"
            self.log.append(message)
            logger.warning(message)
        self.last_signature = new


# --------------------------------------------------------------------------------------- keys

Kind = tuple[int, tuple[bool, ...], tuple[bool, ...], tuple[int, ...]]


class LeafKinds(dict[tuple[type, ...], Kind]):
    """Maps the types of a call's leaves to `(sig_id, mask, not_mask, floats)`, once per
    combination: `mask` marks the array leaves, `floats` the positions (among the static
    leaves) of floats and complex numbers, and `sig_id` numbers the types with arrays erased."""

    def __init__(self) -> None:
        super().__init__()
        self.sig_ids: dict[tuple[Any, ...], int] = {}

    def __missing__(self, leaf_types: tuple[type, ...]) -> Kind:
        mask = tuple(IS_ARRAY_TYPE[t] for t in leaf_types)
        static_types = [t for m, t in zip(mask, leaf_types, strict=True) if not m]
        sig = tuple(None if m else t for m, t in zip(mask, leaf_types, strict=True))
        sig_id = self.sig_ids.setdefault(sig, len(self.sig_ids))
        floats = tuple(i for i, t in enumerate(static_types) if issubclass(t, float | complex))
        kind = self[leaf_types] = (sig_id, mask, tuple(not m for m in mask), floats)
        return kind


KINDS = LeafKinds()


def call_key(leaves: list[Any], treedef: Any) -> tuple[Key, tuple[bool, ...], tuple[Any, ...]]:
    """The key of a call's flattened arguments (before `snapshot_structure`), its array mask
    and its static leaves. `JitWrapped.__call__` inlines this (the per-call path)."""
    sig_id, mask, not_mask, floats = KINDS[tuple(map(type, leaves))]
    static = tuple(compress(leaves, not_mask))
    return (treedef, sig_id, static_key(static, floats) if floats else static), mask, static


_pack_float = struct.Struct("<d").pack
_pack_complex = struct.Struct("<dd").pack


def static_key(static: tuple[Any, ...], positions: tuple[int, ...]) -> tuple[Any, ...]:
    """The cache key of `static`, whose floats and complex numbers (at `positions`) compare by
    their bit patterns: `0.0` and `-0.0` differ, a NaN equals itself.

    When every leaf at `positions` is a plain nonzero, non-NaN `float`, `static` itself is the
    key (the per-call path: no allocation), since two such floats are `==` exactly when their
    bits agree. Otherwise each leaf at `positions` is replaced by its bit pattern (bytes, which
    never equal a float; a position holds one type only, as the types are in `sig_id`).

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
        x = key[i]
        key[i] = _pack_float(x) if isinstance(x, float) else _pack_complex(x.real, x.imag)
    return tuple(key)


_MUTABLE = (dict, list, set, bytearray)


def _holds_mutable(value: Any) -> bool:
    if isinstance(value, _MUTABLE):
        return True
    return type(value) is tuple and any(map(_holds_mutable, value))


def _copied(value: Any) -> Any:
    """`value` with its dicts, lists and sets (nested in each other or in tuples) copied."""
    if isinstance(value, dict):
        return type(value)({k: _copied(v) for k, v in value.items()})
    if isinstance(value, list | tuple) and type(value) in (list, tuple):
        return type(value)(map(_copied, value))
    if isinstance(value, set | bytearray):
        return value.copy()
    return value


def _mutable_static(treedef: Any) -> bool:
    data = treedef.node_data()
    if data is not None and static_field_names(data[0]) and _holds_mutable(data[1]):
        return True
    return any(map(_mutable_static, treedef.children()))


class _Hole:
    __slots__ = ()


_HOLE = _Hole()


def snapshot_structure(treedef: Any) -> Any:
    """`treedef`, with the mutable static field values of its modules copied (issue 37).

    A module's static fields are in its tree structure, which compares them with `==`. A key
    holding the user's dict itself would compare equal to that dict after it is mutated, and
    the next call would run the program built for the old value. Called once per new
    version (never per call): with no dict, list or set in a static field, `treedef` itself.

    Arguments:
        treedef: the structure of a call's `(fn_tree, args, kwargs)`.

    Returns:
        An equal structure that no later mutation changes.
    """
    if not _mutable_static(treedef):
        return treedef
    tree = treedef.unflatten([_HOLE] * treedef.num_leaves)  # new nodes: ours to change
    _copy_static_fields(tree)
    return jtu.tree_structure(tree)


def _copy_static_fields(tree: Any) -> None:
    """Copy, in place, the mutable static values of every module in `tree` (fresh nodes)."""
    for node in jtu.tree_flatten(tree, is_leaf=_has_static_fields)[0]:
        if node is _HOLE:
            continue
        fields: dict[str, Any] = node.__dict__
        for name in static_field_names(type(node)):
            if _holds_mutable(fields[name]):
                fields[name] = _copied(fields[name])
        for child in jtu.tree_flatten(node, is_leaf=functools.partial(_is_not, node))[0]:
            _copy_static_fields(child)


def _is_not(node: Any, x: Any) -> bool:
    return x is not node


def _has_static_fields(x: Any) -> bool:
    return bool(static_field_names(type(x)))
