"""Debugging helpers for compiled code (Equinox's `equinox.debug`).

`assert_max_traces` / `get_num_traces` count traces with the same counter `filter_jit` uses
(one implementation, one message); `backward_nan` shows a value's cotangent on the backward
pass; `breakpoint_if` stops in the debugger when a traced predicate holds; `store_dce` and
`inspect_dce` show which arrays the compiler removed as dead code; `compile_report` shows what
tracing and lowering cost per module path, and `memory_report` where a step's memory goes per
module path (`treemod/_compile_report/`).
"""

import functools as _functools
import types as _types
from collections.abc import Callable as _Callable
from collections.abc import Hashable as _Hashable
from typing import Any as _Any

import jax as _jax
import jax.numpy as _jnp
import jax.tree_util as _jtu

from treemod._compile_report.api import compile_report
from treemod._compile_report.memory import MemoryReport, MemoryRow, memory_report
from treemod._compile_report.report import CompileReport, PathCost, ProgramCost
from treemod._format.describe import describe_array as _describe_array
from treemod._format.paths import function_name as _function_name
from treemod._format.pretty import tree_pformat as _tree_pformat
from treemod._module.module import Module as _Module
from treemod._module.module import field as _field
from treemod._transforms.error_if import error_if as _error_if
from treemod._transforms.jit import JitWrapped as _JitWrapped
from treemod._transforms.jit_cache import TraceCount as _TraceCount
from treemod._transforms.unvmap import unvmap_any as _unvmap_any
from treemod._transforms.wrapper import PytreeBoundMethod as _PytreeBoundMethod
from treemod._tree.filters import combine as _combine
from treemod._tree.filters import is_traceable_array as _is_array
from treemod._tree.filters import partition as _partition

__all__ = [
    "CompileReport",
    "PathCost",
    "ProgramCost",
    "assert_max_traces",
    "backward_nan",
    "breakpoint_if",
    "compile_report",
    "memory_report",
    "MemoryReport",
    "MemoryRow",
    "get_num_traces",
    "inspect_dce",
    "store_dce",
]


def _no_signature() -> tuple[()]:
    return ()


class _MaxTraces(_Module):
    """A function that counts its calls (its traces, under a transform): a pytree of `fn`."""

    fn: _Callable[..., _Any]
    count: _TraceCount = _field(static=True)
    name: str = _field(static=True)

    @property
    def __wrapped__(self) -> _Callable[..., _Any]:
        return self.fn

    def __call__(self, *args: _Any, **kwargs: _Any) -> _Any:
        self.count.record(self.name, False, _no_signature)
        return self.fn(*args, **kwargs)


def assert_max_traces(fn: _Callable[..., _Any] | None = None, *, max_traces: int | None) -> _Any:
    """Fail when a function is traced more than `max_traces` times.

    Put it under `filter_jit` or `jax.jit` (it then runs once per trace), or apply it to a
    `filter_jit` function. Exceeding the limit raises `RuntimeError` at the offending call;
    turn on `TREEMOD_EXPLAIN_RETRACES=1` to see which argument changed. The wrapper is a
    pytree of `fn` (a module's arrays stay traced by `filter_jit`), and copies of it made by
    unflattening share one count.

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
        return _functools.partial(assert_max_traces, max_traces=max_traces)
    if max_traces is not None and (not isinstance(max_traces, int) or max_traces < 0):
        raise ValueError(f"assert_max_traces: max_traces must be an int >= 0; got {max_traces!r}")
    if isinstance(fn, _JitWrapped):
        return fn.with_max_traces(max_traces)
    if not callable(fn):
        raise TypeError(f"assert_max_traces expects a callable; got {type(fn).__name__}.")
    return _MaxTraces(fn, _TraceCount(max_traces), _function_name(fn))


def get_num_traces(fn: _Any) -> int:
    """How many times a `filter_jit` or `assert_max_traces` function has been traced.

    Wrappers are looked through (`__wrapped__`, bound methods), so this also accepts a
    function that wraps one of those.

    Arguments:
        fn: a function returned by `filter_jit` or `assert_max_traces` (or a method of a class
            decorated with one).

    Returns:
        The number of traces so far.

    Raises:
        ValueError: `fn` wraps neither (Equinox raises the same type).

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> f = tm.filter_jit(lambda x, n: x * n)
        >>> _ = f(jnp.ones(2), 2); _ = f(jnp.ones(2), 2); _ = f(jnp.ones(2), 3)
        >>> tm.debug.get_num_traces(f)
        2
    """
    inner = fn
    for _ in range(100):  # wrapper chains are short; this bounds a cyclic `__wrapped__`
        if isinstance(inner, _JitWrapped):
            return inner.num_traces
        if isinstance(inner, _MaxTraces):
            return inner.count.num_traces
        if isinstance(inner, _types.MethodType | _PytreeBoundMethod):
            inner = inner.__func__
        elif hasattr(inner, "__wrapped__"):
            inner = inner.__wrapped__
        else:
            break
    raise ValueError(
        f"get_num_traces: {fn!r} is neither a filter_jit function nor wrapped by "
        "treemod.debug.assert_max_traces, so its traces are not counted."
    )


class _Long(_Module):
    """Prints its tree with array values (for `backward_nan`'s message)."""

    tree: _Any

    def __repr__(self) -> str:
        return _tree_pformat(self.tree, short_arrays=False)


def _backward_nan_message(name: str | None, primal: _Any, cotangent: _Any) -> None:
    head = "" if name is None else f"{name}:\n"
    print(f"{head}   primals={_Long(primal)!r}\ncotangents={_Long(cotangent)!r}")


def backward_nan(x: _Any, name: str | None = None, terminate: bool = True) -> _Any:
    """Return `x`; on the backward pass print its primal and cotangent, and stop at a NaN.

    For NaNs that appear only in gradients: the cotangent arriving at `x` is printed (with
    `name`, if given), and with `terminate=True` a NaN in it raises through `error_if`.

    Arguments:
        x: any pytree; its inexact arrays are watched.
        name: a label for the printed lines.
        terminate: raise `RuntimeError("Encountered NaN")` when the cotangent holds a NaN.

    Returns:
        `x`, unchanged.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> f = lambda x: jnp.sqrt(tm.debug.backward_nan(x, name="x", terminate=False)).sum()
        >>> _ = jax.grad(f)(jnp.array([4.0])); jax.effects_barrier()
        x:
           primals=Array([4.], dtype=float32)
        cotangents=Array([0.25], dtype=float32)
    """
    dynamic, static = _partition(x, _is_array)
    leaves, treedef = _jtu.tree_flatten(dynamic)
    watched = _watch(name, terminate, treedef, static)(leaves)
    return _combine(_jtu.tree_unflatten(treedef, watched), static)


@_functools.lru_cache(maxsize=256)
def _watch_rule(name: str | None, terminate: bool, treedef: _Any, static: _Any) -> _Any:
    @_jax.custom_vjp
    def watch(leaves: list[_jax.Array]) -> list[_jax.Array]:
        return leaves

    def fwd(leaves: list[_jax.Array]) -> tuple[list[_jax.Array], list[_jax.Array]]:
        return leaves, leaves

    def bwd(leaves: list[_jax.Array], cotangents: list[_jax.Array]) -> tuple[list[_jax.Array]]:
        primal = _combine(_jtu.tree_unflatten(treedef, leaves), static)
        cotangent = _jtu.tree_unflatten(treedef, cotangents)
        _jax.debug.callback(_functools.partial(_backward_nan_message, name), primal, cotangent)
        if terminate:
            inexact = [
                _jnp.isnan(c).any()
                for c in cotangents
                if _jnp.issubdtype(_jnp.result_type(c), _jnp.inexact)
            ]
            if inexact:
                cotangents = _error_if(cotangents, _jnp.any(_jnp.stack(inexact)), "Encountered NaN")
        return (cotangents,)

    watch.defvjp(fwd, bwd)
    return watch


def _watch(name: str | None, terminate: bool, treedef: _Any, static: _Any) -> _Any:
    try:
        return _watch_rule(name, terminate, treedef, static)
    except TypeError:  # an unhashable static part: a rule for this call only
        return _watch_rule.__wrapped__(name, terminate, treedef, static)


def breakpoint_if(pred: _Any, **kwargs: _Any) -> _Any:
    """`jax.debug.breakpoint()`, but only when `pred` holds (any element; any batch entry).

    Arguments:
        pred: a boolean array.
        **kwargs: passed on to `jax.debug.breakpoint` (`backend=`, `num_frames=`, `token=`).

    Returns:
        What `jax.debug.breakpoint` returns when it runs (`token`, else `None`).

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> @jax.jit
        ... def f(x):
        ...     tm.debug.breakpoint_if(x < 0)  # opens the debugger only for negative x
        ...     return x + 1
        >>> f(jnp.ones(()))
        Array(2., dtype=float32)
    """
    if _jnp.result_type(pred) != _jnp.bool_:
        raise TypeError(
            "breakpoint_if: `pred` must be a boolean array (such as `x < 0`); got "
            f"{_describe_array(_jnp.shape(pred), _jnp.result_type(pred))}."
        )
    token = kwargs.get("token")
    return _jax.lax.cond(_unvmap_any(pred), lambda: _jax.debug.breakpoint(**kwargs), lambda: token)


# An alive leaf's (shape, dtype).
_Alive = tuple[tuple[int, ...], _jnp.dtype]
# name -> {tag: (alive leaves {index: (shape, dtype)}, treedef, static part)}
_DCE_STORE: dict[_Hashable, dict[object, tuple[dict[int, _Alive], _Any, _Any]]] = {}


def _in_trace() -> bool:
    return isinstance(_jnp.zeros(()) + 1, _jax.core.Tracer)


def store_dce(x: _Any, name: _Hashable = None) -> _Any:
    """Return `x`, recording, when the compiled program runs, which of its arrays survived.

    Use it inside `jax.jit`/`filter_jit`, run the function, then call `inspect_dce(name)` to
    print `x` with every array the compiler removed as dead code shown as `<DCE'd>`.

    Arguments:
        x: any pytree; non-array leaves are kept as they are.
        name: any hashable label, to tell several call sites apart.

    Returns:
        `x`, unchanged.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> @jax.jit
        ... def f(x):
        ...     used, unused = tm.debug.store_dce((x * 2, x + 1), name="doc")
        ...     return used
        >>> _ = f(jnp.array(1.0))
        >>> tm.debug.inspect_dce("doc")
        Found 1 call to `store_dce`.
        Entry 0:
        (f32[], <DCE'd>)
    """
    if not _in_trace():
        raise RuntimeError(
            "treemod.debug.store_dce must be called inside a compiled function (jax.jit or "
            "filter_jit): dead code is only eliminated there."
        )
    dynamic, static = _partition(x, _is_array)
    leaves, treedef = _jtu.tree_flatten(dynamic)
    tag = object()
    alive: dict[int, _Alive] = {}
    _DCE_STORE.setdefault(name, {})[tag] = (alive, treedef, static)

    def record(i: int, value: _Any) -> _Any:
        alive[i] = (value.shape, value.dtype)
        return value

    out = [
        _jax.pure_callback(
            _functools.partial(record, i),
            _jax.ShapeDtypeStruct(leaf.shape, leaf.dtype),
            leaf,
            vmap_method="expand_dims",
        )
        for i, leaf in enumerate(leaves)
    ]
    return _combine(_jtu.tree_unflatten(treedef, out), static)


class _Shown:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def inspect_dce(name: _Hashable = None) -> None:
    """Print what `store_dce(..., name)` recorded: each array's type, or `<DCE'd>`.

    Arguments:
        name: the label given to `store_dce`.

    Returns:
        Nothing; prints one entry per traced call of `store_dce` with this name.
    """
    if _in_trace():
        raise RuntimeError(
            "treemod.debug.inspect_dce must be called outside compiled code, after running "
            "the function that calls store_dce."
        )
    entries = _DCE_STORE.get(name, {})
    print(f"Found {len(entries)} call{'' if len(entries) == 1 else 's'} to `store_dce`.")
    for i, (alive, treedef, static) in enumerate(entries.values()):
        shown = [
            _Shown(_describe_array(*alive[j]) if j in alive else "<DCE'd>")
            for j in range(treedef.num_leaves)
        ]
        print(f"Entry {i}:")
        print(_tree_pformat(_combine(_jtu.tree_unflatten(treedef, shown), static)))
