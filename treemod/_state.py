"""State that layers update as they run (BatchNorm statistics, counters, EMAs), kept in the tree.

A `State` node holds an array inside the model. Gradients and optimisers skip it (`is_param`),
saving and printing include it, and `stateful` runs a model and returns it with its state updated.
"""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np

from ._filters import is_inexact_array
from ._module import Module

__all__ = ["State", "is_state", "is_param", "stateful", "update_state"]


class State(Module):
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
    to hand to an optimiser.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> tree = {"w": jnp.ones(2), "count": tm.State(jnp.zeros(()))}
        >>> tm.filter(tree, tm.is_param)
        {'count': None, 'w': Array([1., 1.], dtype=float32)}
    """
    return not isinstance(element, State) and is_inexact_array(element)


is_param.is_leaf = is_state  # type: ignore[attr-defined]


class _Collectors(threading.local):
    def __init__(self) -> None:
        self.stack: list[dict[int, tuple[State, Any]]] = []


_collectors = _Collectors()


def _describe(x: Any) -> str:
    dtype = np.dtype(x.dtype).name
    return f"{dtype}[{','.join(map(str, x.shape))}]"


def update_state(state: State, value: Any) -> None:
    """Record a new value for `state` during a `stateful` call.

    Called by layers from inside their `__call__`; the value must have the shape and dtype of
    the current one.

    Arguments:
        state: a `State` node of the module being run (e.g. `self.running_mean`).
        value: its new value.

    Raises:
        RuntimeError: outside `stateful` (nothing would receive the update).
        ValueError: if the shape or dtype changes.

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
    old = state.value
    if tuple(np.shape(value)) != tuple(np.shape(old)) or np.dtype(
        jax.numpy.result_type(value)
    ) != np.dtype(jax.numpy.result_type(old)):
        raise ValueError(
            f"update_state: the new value is {_describe(jax.numpy.asarray(value))} but the state "
            f"holds {_describe(jax.numpy.asarray(old))}. State keeps its shape and dtype; "
            "cast or reshape the new value."
        )
    if not _collectors.stack:
        raise RuntimeError(
            "update_state was called outside treemod.stateful, so the new state would be lost. "
            "Run the model as `out, model = treemod.stateful(model)(x)`, or switch it to "
            "inference with `treemod.nn.inference_mode(model)`."
        )
    _collectors.stack[-1][id(state)] = (state, value)


def collect_state_updates(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, dict]:
    """Run `fn` and return its output and the state updates it made, keyed by `id` of the node."""
    _collectors.stack.append({})
    try:
        out = fn(*args, **kwargs)
    finally:
        updates = _collectors.stack.pop()
    return out, updates


def apply_state_updates(tree: Any, updates: dict[int, tuple[State, Any]]) -> Any:
    """Return `tree` with each `State` node whose id is in `updates` holding its new value."""
    seen: set[int] = set()

    def replace(node: Any) -> Any:
        if isinstance(node, State) and id(node) in updates:
            seen.add(id(node))
            return State(updates[id(node)][1])
        return node

    new_tree = jtu.tree_map(replace, tree, is_leaf=is_state)
    if len(seen) != len(updates):
        raise ValueError(
            "stateful: a layer updated a State that is not part of the model being run (was a "
            "different model called inside, or a module rebuilt during the call?). Only the "
            "state of the model given to stateful can be updated."
        )
    return new_tree


def stateful(fn: Callable[..., Any]) -> Callable[..., tuple[Any, Any]]:
    """Wrap a model (or function) so that calling it also returns the model with updated state.

    `stateful(model)(*args)` runs `model(*args)` and returns `(output, new_model)`, where
    `new_model` holds the values its layers recorded with `update_state` (BatchNorm running
    statistics, counters, ...). It is pure: use it inside `filter_jit` and `filter_grad` like
    any function. With a bound method (`stateful(model.loss)`), the method's module is updated;
    with any other function, its first positional argument is.

    Arguments:
        fn: a `Module`, a bound method of one, or a function whose first argument is the model.

    Returns:
        A function returning `(output, updated_model)`.

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
    if isinstance(fn, types.MethodType) and isinstance(fn.__self__, Module):
        owner: Any = fn.__self__
    elif isinstance(fn, Module):
        owner = fn
    else:
        owner = None

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        if owner is None and not args:
            raise TypeError(
                "stateful(fn) with a plain function updates the function's first positional "
                "argument, but none was given."
            )
        out, updates = collect_state_updates(fn, *args, **kwargs)
        tree = owner if owner is not None else args[0]
        return out, apply_state_updates(tree, updates)

    return wrapper
