"""State that layers update as they run (BatchNorm statistics, counters, EMAs), kept in the tree.

A `State` node holds an array inside the model. Gradients and optimisers skip it (`is_param`),
saving and printing include it, and `stateful` runs a model and returns it with its state updated.

How it works: `stateful` pushes a collector frame on a thread-local stack and runs the model;
`update_state` records `(state node, new value)` in the innermost frame, keyed by the node's
`id`; afterwards `stateful` rebuilds the model with those nodes replaced. A frame remembers the
JAX trace it was opened under, so an update made under a transform that began *inside* the
`stateful` call (whose values would leak out of that transform as tracers) is refused with an
error that says how to restructure the code.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu

from treemod._format.describe import describe_value
from treemod._module.module import Module, field
from treemod._private_apis import opaque_trace_state as _current_trace
from treemod._tree.filters import is_inexact_array

__all__ = ["State", "is_state", "is_param", "stateful", "update_state"]


class State(Module, holds_state=True):
    """A box for an array that a layer updates while it runs, rather than one trained by gradients.

    Layers keep running statistics, counters or moving averages as `State` fields. `State`
    nodes are part of the model tree (saved, printed, reachable by `tree_at`), but `is_param`
    excludes them, so `filter_grad` gives them no gradient and optimisers never see them.

    Arguments:
        value: the array.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> s = tm.State(jnp.zeros(3))
        >>> s.value
        Array([0., 0., 0.], dtype=float32)
    """

    value: Any


def is_state(element: Any) -> bool:
    """Whether `element` is a `State` node.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> tm.is_state(tm.State(jnp.zeros(2))), tm.is_state(jnp.zeros(2))
        (True, False)
    """
    return isinstance(element, State)


def is_param(element: Any) -> bool:
    """Whether `element` is a trainable parameter: a floating-point array outside any `State`.

    `filter(model, is_param)` keeps the parameters and replaces each `State` node by `None`
    (the predicate judges `State` nodes whole). It is the default of `filter_grad`, and the tree
    to hand to an optimiser. On an abstract skeleton from `jax.eval_shape`, a
    `jax.ShapeDtypeStruct` counts as the array it stands for, so
    `jax.eval_shape(optimiser.init, filter(skeleton, is_param))` gives the optimiser state's
    skeleton.

    Arguments:
        element: a leaf, or a `State` node.

    Returns:
        `True` for floating-point (or complex) arrays and abstract arrays outside `State`.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> tree = {"w": jnp.ones(2), "count": tm.State(jnp.zeros(()))}
        >>> tm.filter(tree, tm.is_param)
        {'count': None, 'w': Array([1., 1.], dtype=float32)}
    """
    return not isinstance(element, State) and is_inexact_array(element)


is_param.is_leaf = is_state  # type: ignore[attr-defined]


class _Frame:
    """The updates recorded during one `stateful` call, and the trace it was opened under."""

    __slots__ = ("updates", "forwarded", "trace")

    def __init__(self) -> None:
        self.updates: dict[int, tuple[State, Any]] = {}
        # ids of updates handed up by a nested `stateful` call: applied where they belong to
        # this frame's model, ignored where they belong to another model.
        self.forwarded: set[int] = set()
        self.trace = _current_trace()


class _Collectors(threading.local):
    def __init__(self) -> None:
        self.stack: list[_Frame] = []


_collectors = _Collectors()


def in_stateful_call() -> bool:
    """Whether code is running inside a `stateful` call, so that `update_state` may be used."""
    return bool(_collectors.stack)


def update_state(state: State, value: Any) -> None:
    """Record a new value for `state` during a `stateful` call.

    Called by layers from inside their `__call__`; the value must have the shape and dtype of
    the current one. Each `State` may be updated once per `stateful` call. The layer keeps
    reading the old value (`state.value`); the new one appears in the model that `stateful`
    returns.

    Arguments:
        state: a `State` node of the module being run (e.g. `self.running_mean`).
        value: its new value.

    Raises:
        TypeError: if `state` is not a `State` node.
        ValueError: if the shape or dtype changes.
        RuntimeError: outside `stateful` (nothing would receive the update); under a JAX
            transform (`jax.jit`, `jax.vmap`, `lax.scan`, ...) that started inside the
            `stateful` call; or when the same `State` is updated twice in one call.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> class Counter(tm.Module):
        ...     count: tm.State
        ...     def __call__(self, x):
        ...         tm.update_state(self.count, self.count.value + 1)
        ...         return x
        >>> _, counter = tm.stateful(Counter(tm.State(jnp.array(0))))(1.0)
        >>> counter.count.value
        Array(1, dtype=int32, weak_type=True)
    """
    if not isinstance(state, State):
        raise TypeError(
            f"update_state expects a State node (such as `self.running_mean`), got "
            f"{type(state).__name__}. Keep the array in a field declared as `State` and pass "
            "that field."
        )
    old = state.value
    new, held = jax.numpy.asarray(value), jax.numpy.asarray(old)
    if new.shape != held.shape or new.dtype != held.dtype:  # PRNG key dtypes compare too
        raise ValueError(
            f"update_state: the new value is {describe_value(new)} but the state holds "
            f"{describe_value(held)}. "
            "State keeps its shape and dtype; cast or reshape the new value."
        )
    if not _collectors.stack:
        raise RuntimeError(
            "update_state was called outside treemod.stateful, so the new state would be lost. "
            "Run the model as `out, model = treemod.stateful(model)(x)`, or switch it to "
            "inference with `treemod.nn.inference_mode(model)`."
        )
    frame = _collectors.stack[-1]
    if frame.trace is not None and _current_trace() != frame.trace:
        raise RuntimeError(
            "update_state was called under a JAX transform (jax.jit, filter_jit, jax.vmap, "
            "lax.scan, jax.checkpoint, ...) that started inside the treemod.stateful call, so "
            "the new state would leak out of that transform as a tracer. Put the transform "
            "outside: `treemod.filter_jit(step)` where `step` calls `treemod.stateful(model)(x)`, "
            "or `jax.vmap(treemod.stateful(model), axis_name=..., out_axes=(0, None))(x)`; "
            "a layer that applies its own transform to stateful sublayers must carry their "
            "updates out itself (as treemod.nn.Stack does)."
        )
    _record(frame, state, value)


def _record(frame: _Frame, state: State, value: Any) -> None:
    if id(state) in frame.updates:
        raise RuntimeError(
            f"update_state: this State ({describe_value(jax.numpy.asarray(state.value))}) was "
            "already updated during this stateful call, and the second update would silently "
            "replace the first. Is a stateful layer (e.g. a BatchNorm) applied twice? Apply it "
            "once (e.g. on the concatenated batch), or give each use its own layer."
        )
    frame.updates[id(state)] = (state, value)


def collect_state_updates(
    fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> tuple[Any, dict[Any, Any]]:
    """Run `fn` and return its output and the state updates it made, keyed by `id` of the node.

    The values are `{id(node): (node, new_value)}`. A layer that runs sublayers under its own
    transform (a scan, say) calls this inside the transform, returns the new values as outputs,
    and calls `update_state` on the original nodes outside it.
    """
    _collectors.stack.append(_Frame())
    try:
        out = fn(*args, **kwargs)
    finally:
        frame = _collectors.stack.pop()
    return out, frame.updates


def apply_state_updates(
    tree: Any, updates: dict[int, tuple[State, Any]], optional: set[int] | None = None
) -> Any:
    """Return `tree` with each `State` node whose id is in `updates` holding its new value.

    Every update must belong to a node of `tree`, except those whose ids are in `optional`.
    """
    if not updates:
        return tree
    seen: set[int] = set()

    def replace(node: Any) -> Any:
        if isinstance(node, State) and id(node) in updates:
            seen.add(id(node))
            return State(updates[id(node)][1])
        return node

    new_tree = jtu.tree_map(replace, tree, is_leaf=is_state)
    if len(seen) != len(updates) and set(updates) - seen - (optional or set()):
        raise ValueError(
            "stateful: a layer updated a State that is not part of the model being run (was a "
            "different model called inside, or a module rebuilt during the call?). Only the "
            "state of the model given to stateful can be updated."
        )
    return new_tree


class _Stateful(Module):
    """What `stateful` returns: a module, so transforms trace the wrapped model's arrays."""

    owner: Any
    function: Callable[..., Any] | None = field(static=True)

    # Compared and hashed by identity, like the closure it stands for, so `jax.jit` accepts it.
    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        if self.function is None:
            return _run(self.owner, self.owner, *args, **kwargs)
        if self.owner is not None:
            return _run(self.owner, self.function, self.owner, *args, **kwargs)
        if not args:
            raise TypeError(
                "stateful(fn) with a plain function updates the function's first positional "
                "argument, but none was given."
            )
        return _run(args[0], self.function, *args, **kwargs)


def _run(tree: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """Run `fn` collecting state updates, apply them to `tree`, and hand them up if nested."""
    frame = _Frame()
    _collectors.stack.append(frame)
    try:
        out = fn(*args, **kwargs)
    finally:
        _collectors.stack.pop()
    new_tree = apply_state_updates(tree, frame.updates, frame.forwarded)
    # A `stateful` call inside another one (a layer running a sublayer with `stateful`) also
    # hands its updates to the enclosing call, so that they reach the outer model too. Not
    # across a transform boundary: those values belong to the inner trace.
    if _collectors.stack and frame.updates:
        outer = _collectors.stack[-1]
        if outer.trace is None or outer.trace == frame.trace:
            for sid, (state, value) in frame.updates.items():
                _record(outer, state, value)
                outer.forwarded.add(sid)
    return out, new_tree


def stateful(fn: Callable[..., Any]) -> Callable[..., tuple[Any, Any]]:
    """Wrap a model (or function) so that calling it also returns the model with updated state.

    `stateful(model)(*args)` runs `model(*args)` and returns `(output, new_model)`, where
    `new_model` holds the values its layers recorded with `update_state` (BatchNorm running
    statistics, counters, ...). It is pure: use it inside `filter_jit` and `filter_grad` like
    any function, and put transforms outside it (`jax.vmap(stateful(model), ...)`), not between
    it and the layers. With a bound method (`stateful(model.loss)`), the method's module is
    updated; with any other function, its first positional argument is. A `stateful` call
    nested in another one (a layer running a sublayer with `stateful`) also passes its updates
    on, so they reach the outer model as well.

    Arguments:
        fn: a `Module`, a bound method of one, or a function whose first argument is the model.

    Returns:
        A callable returning `(output, updated_model)`. It is itself a module holding the
        model, so `filter_jit(stateful(model))` traces the model's arrays.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> class Total(tm.Module):
        ...     total: tm.State
        ...     def __call__(self, x):
        ...         tm.update_state(self.total, self.total.value + x.sum())
        ...         return x
        >>> model = Total(tm.State(jnp.array(0.0)))
        >>> _, model = tm.stateful(model)(jnp.ones(3))
        >>> _, model = tm.stateful(model)(jnp.ones(3))
        >>> model.total.value
        Array(6., dtype=float32)
    """
    if isinstance(fn, Module):
        return _Stateful(fn, None)
    if isinstance(fn, types.MethodType) and isinstance(fn.__self__, Module):
        return _Stateful(fn.__self__, fn.__func__)
    if not callable(fn):
        raise TypeError(f"stateful expects a model or a function, got {type(fn).__name__}.")
    return _Stateful(None, fn)
