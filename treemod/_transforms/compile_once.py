"""`compile_once`: a module method traced once per configuration, its repeats compiled once.

A sprawling network (a DARTS supernet, a UNet, a multi-branch cell) calls many sub-modules of the
same class on inputs of the same shapes. Written the natural way, each call is traced, lowered
and compiled by XLA as its own copy. Decorating the repeated module's method with
`compile_once` changes three things, and nothing in what the program computes:

1. Under a trace (`filter_jit`, `jax.jit`, `filter_grad`, ...), each call runs the method as a
   nested `filter_jit` program, so calls on modules of one configuration (same structure,
   static fields and array shapes) with inputs of the same shapes are traced once and share
   one program, as do their derivatives.
2. When `filter_jit` traces a function, independent calls of one such program (none reads
   another's output) are rolled into one `lax.scan` before lowering (`roll.py`), so XLA
   compiles the body once rather than once per call.
3. `State` updates made inside the method (BatchNorm statistics) are carried out of the nested
   program and recorded on the module's own `State` nodes, as if the method ran inline.

Eager calls (outside any trace) run the method directly. Keys, BatchNorm state, gradients and
outputs are the same with and without it (`tests/test_compile_once.py`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

import jax.tree_util as jtu

from treemod._module.state import (
    State,
    collect_state_updates,
    in_stateful_call,
    is_state,
    update_state,
)
from treemod._private_apis import trace_state_clean
from treemod._transforms.jit import filter_jit
from treemod._transforms.roll import UNIT_MARK, unit_called

__all__ = ["compile_once"]

_P = ParamSpec("_P")
_R = TypeVar("_R")
_S = TypeVar("_S")


def _state_nodes(tree: Any) -> list[State]:
    return [x for x in jtu.tree_leaves(tree, is_leaf=is_state) if isinstance(x, State)]


def compile_once(method: Callable[Concatenate[_S, _P], _R]) -> Callable[Concatenate[_S, _P], _R]:
    """Trace a module method once per configuration and compile its independent repeats once.

    Decorate the method (usually `__call__`) of a module class that a network uses many times
    with the same configuration and input shapes. Under `filter_jit`, each distinct
    configuration is traced once, and calls that do not depend on each other's outputs (the
    branches of a cell, the edges into one node) run as one `lax.scan`, whose body XLA compiles
    once. Outputs, gradients and `State` updates are those of the undecorated method.

    The price, at run time: XLA does not fuse across the call's boundary, the inputs of rolled
    calls are stacked (copied), and rolled calls run one after another. It pays where a network
    repeats sizeable blocks; a block of one small layer is cheaper inline.

    Arguments:
        method: a method whose first parameter is the module (`self`).

    Returns:
        The method, with the same signature.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> class Branch(tm.Module):
        ...     w: jax.Array
        ...     @tm.compile_once
        ...     def __call__(self, x):
        ...         return jnp.tanh(x @ self.w)
        >>> branches = [Branch(jnp.eye(2) * i) for i in range(3)]
        >>> step = tm.filter_jit(lambda bs, x: sum(b(x) for b in bs))
        >>> step(branches, jnp.ones(2))
        Array([1.7256..., 1.7256...], dtype=float32)
    """
    qualname = getattr(method, "__qualname__", type(method).__name__)
    name = f"{UNIT_MARK}_{re.sub(r'[^0-9A-Za-z_]', '_', qualname)}"

    def plain(self: Any, *args: Any, **kwargs: Any) -> Any:
        return method(self, *args, **kwargs)

    def collecting(self: Any, *args: Any, **kwargs: Any) -> tuple[Any, list[Any]]:
        out, updates = collect_state_updates(method, self, *args, **kwargs)
        nodes = _state_nodes(self)
        own = {id(s) for s in nodes}
        foreign = [s for sid, (s, _) in updates.items() if sid not in own]
        if foreign:
            raise RuntimeError(
                f"compile_once: `{qualname}` updated a State that is not part of its own module "
                "(one passed in as an argument, or of a module built during the call); such "
                "an update cannot be carried out of the compiled-once program. Keep the stateful "
                "layer inside the module whose method is decorated, or remove `compile_once`."
            )
        return out, [updates[id(s)][1] if id(s) in updates else None for s in nodes]

    plain.__name__ = plain.__qualname__ = name
    collecting.__name__ = collecting.__qualname__ = name
    run_plain = filter_jit(plain, explain_retraces=False)
    run_collecting = filter_jit(collecting, explain_retraces=False)
    # One version per configuration and input shapes is the point, not a sign of retracing.
    run_plain.cache.expect_many_versions()
    run_collecting.cache.expect_many_versions()

    @functools.wraps(method)
    def call(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if trace_state_clean():
            return method(self, *args, **kwargs)
        unit_called()
        if not in_stateful_call():
            out: _R = run_plain(self, *args, **kwargs)
            return out
        out, new = run_collecting(self, *args, **kwargs)
        for node, value in zip(_state_nodes(self), new, strict=True):
            if value is not None:
                update_state(node, value)
        return out

    return call
