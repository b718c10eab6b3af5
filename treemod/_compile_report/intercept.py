"""Which module instance is running while a function is traced, and for how long.

`recording(recorder, classes)` swaps each public method (and `__call__`) of the given Module
classes for a wrapper, for the duration of one trace, and restores the originals in `finally`.
The wrapper looks the instance up in the recorder's map of the modules found in the traced
arguments (by identity: the trace rebuilds the arguments once, and those objects are the ones
the function sees). A mapped instance's call runs under a `jax.named_scope` of its path, which
JAX records on every equation and StableHLO location it emits, and is timed. Anything else (a
module built inside the function, one rebuilt by a nested transform, a call in another thread)
runs untouched and counts toward the module that called it. Private methods (`_name`) are left
alone: a layer hands its `_flat` core to a nested `filter_jit`, whose cache is keyed by that
function, and the report must trace what a normal call traces.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import threading
import time
import types
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any

import jax
import jax.tree_util as jtu

from treemod._compile_report.names import module_paths, scope_name
from treemod._module.module import Module
from treemod._transforms.wrapper import TransformedFunction
from treemod._tree.filters import IS_ARRAY_TYPE
from treemod._tree.module_info import is_module_class

__all__ = ["CallStats", "Recorder", "recording"]


@dataclasses.dataclass
class CallStats:
    """What the trace did at one path: its calls and their inclusive and exclusive time."""

    path: str
    type_name: str
    signature: Hashable
    calls: int = 0
    time: float = 0.0
    self_time: float = 0.0


@dataclasses.dataclass
class _Frame:
    path: str
    instance: Any
    child_time: float = 0.0


class Recorder:
    """The module paths of one trace, and the calls made at them.

    A module rebuilt by a transform inside the function (`filter_grad`, a nested `filter_jit`)
    is a new object: it takes the path of the object it stands for when it is found inside the
    module that calls it (by identity, from the caller's path), or else when exactly one module
    of the arguments has its signature (structure, static values, array shapes), or else when
    exactly one has its outline (structure and static values; any leaf, or a `None` hole, alike:
    the model `tm.combine(trainable, frozen)` rebuilds from a `tm.partition`ed argument).
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self.instances: dict[int, tuple[Any, str | None]] = {}  # id -> (kept alive, path)
        self.stats: dict[str, CallStats] = {root: CallStats(root, "function", root)}
        self.scopes: dict[str, str] = {}  # scope name -> path
        self._by_signature: dict[Hashable, str | None] = {}  # None: several paths
        self._by_outline: dict[Hashable, str | None] = {}
        self._children: dict[int, dict[int, str]] = {}
        self._stack: list[_Frame] = []

    def add(self, instance: Any, path: str) -> None:
        """Give `instance` (one object of the traced arguments) its path."""
        signature = _signature(instance)
        self.instances[id(instance)] = (instance, path)
        self.stats.setdefault(path, CallStats(path, type(instance).__name__, signature))
        self.scopes[scope_name(path)] = path
        self._by_signature[signature] = None if signature in self._by_signature else path
        outline = _outline(instance)
        self._by_outline[outline] = None if outline in self._by_outline else path

    def run_root(self, fn: Callable[[], Any]) -> Any:
        """Call the traced function itself, timed as the root row."""
        return self._timed(self.root, None, fn)

    def call(self, method: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        """Run `method(instance, ...)`, under its path's scope when `instance` has a path."""
        path = self._path_of(instance)
        if path is None or any(f.path == path for f in self._stack):
            # No path, or its own method (or a recursion): it counts toward its caller.
            return method(instance, *args, **kwargs)
        with jax.named_scope(scope_name(path)):
            return self._timed(path, instance, lambda: method(instance, *args, **kwargs))

    def _path_of(self, instance: Any) -> str | None:
        entry = self.instances.get(id(instance))
        if entry is not None and entry[0] is instance:
            return entry[1]
        path = None
        for frame in reversed(self._stack):
            relative = self._relative(frame.instance).get(id(instance))
            if relative is not None:
                path = frame.path + relative
                break
        else:
            signature = _signature(instance)
            if signature in self._by_signature:
                path = self._by_signature[signature]
            else:
                path = self._by_outline.get(_outline(instance))
        self.instances[id(instance)] = (instance, path)
        if path is not None and path not in self.stats:
            self.add(instance, path)
        return path

    def _relative(self, parent: Any) -> dict[int, str]:
        """`id(module) -> key path` of the modules below `parent` (memoised per parent)."""
        if parent is None:
            return {}
        found = self._children.get(id(parent))
        if found is None:
            found = self._children[id(parent)] = {
                id(m): p for m, p in module_paths(parent, "") if m is not parent
            }
        return found

    def _timed(self, path: str, instance: Any, fn: Callable[[], Any]) -> Any:
        frame = _Frame(path, instance)
        self._stack.append(frame)
        start = time.perf_counter()
        try:
            return fn()
        finally:
            elapsed = time.perf_counter() - start
            self._stack.pop()
            stats = self.stats[path]
            stats.calls += 1
            stats.time += elapsed
            stats.self_time += elapsed - frame.child_time
            if self._stack:
                self._stack[-1].child_time += elapsed


def _signature(instance: Any) -> Hashable:
    """What identical modules share: structure, static values and array shapes and dtypes
    (`id(instance)` where a static value is unhashable)."""
    leaves, treedef = jtu.tree_flatten(instance)
    key = (treedef, tuple((x.shape, x.dtype) if IS_ARRAY_TYPE[type(x)] else x for x in leaves))
    try:
        hash(key)
    except TypeError:
        return id(instance)
    return key


def _outline(instance: Any) -> Hashable:
    """The structure and static fields alone, each leaf (an array, a number, or the `None` of a
    `tm.partition` hole) alike: a partitioned module's outline is the combined one's."""
    treedef = jtu.tree_structure(instance, is_leaf=lambda x: x is None)
    try:
        hash(treedef)
    except TypeError:
        return id(instance)
    return treedef


_ACTIVE: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar(
    "treemod_compile_report", default=None
)
# (class, method name) -> (the original, how many recordings use the wrapper now): two reports
# traced at once in two threads share one wrapper, restored when the last one ends.
_PATCHED: dict[tuple[type, str], tuple[Any, int]] = {}
_LOCK = threading.Lock()


def _wrappable(name: str, value: Any) -> bool:
    if name != "__call__" and name.startswith("_"):
        return False
    return isinstance(value, types.FunctionType | TransformedFunction)


def _wrapper(original: Any) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorder = _ACTIVE.get()
        if recorder is None:
            return original(self, *args, **kwargs)
        return recorder.call(original, self, args, kwargs)

    try:
        return functools.wraps(original)(method)
    except AttributeError:  # pragma: no cover - a callable without a name
        return method


def _methods(classes: Iterable[type]) -> set[tuple[type, str]]:
    """Each (defining class, name) of the public methods of `classes` and their bases."""
    found: set[tuple[type, str]] = set()
    for cls in classes:
        for klass in cls.__mro__:
            if klass is Module or not is_module_class(klass):
                continue
            for name, value in vars(klass).items():
                if _wrappable(name, value):
                    found.add((klass, name))
    return found


@contextlib.contextmanager
def recording(recorder: Recorder, classes: Iterable[type]) -> Iterator[None]:
    """Route the calls of `classes`' methods through `recorder` while the block runs."""
    keys = _methods(classes)
    done: list[tuple[type, str]] = []
    token = _ACTIVE.set(recorder)
    try:
        with _LOCK:
            for key in keys:
                original, users = _PATCHED.get(key, (None, 0))
                if original is None:
                    original = vars(key[0])[key[1]]
                    setattr(key[0], key[1], _wrapper(original))
                _PATCHED[key] = (original, users + 1)
                done.append(key)
        yield
    finally:
        _ACTIVE.reset(token)
        with _LOCK:
            for key in done:
                original, users = _PATCHED[key]
                if users == 1:
                    del _PATCHED[key]
                    setattr(key[0], key[1], original)
                else:
                    _PATCHED[key] = (original, users - 1)
