"""Rolling: independent calls of one `compile_once` program become one `lax.scan`.

XLA inlines every nested call before it optimises, so a program with twelve calls of one
traced function is compiled as twelve copies (on the CPU each copy's fusions are generated and
compiled by LLVM separately: the bulk of a sprawling network's compile). A loop is the one
construct whose body XLA compiles once. This file rewrites a traced program so that calls of
the same `compile_once` program that do not depend on each other run as one `lax.scan` over
their stacked inputs.

Which calls are grouped: equations binding JAX's `jit` primitive whose program name carries
`UNIT_MARK` (given by `compile_once`, and kept by JAX in the names of their derivatives:
`jvp(...)`, `transpose(jvp(...))`), with the same program object, that do not depend on each
other. The program's equations are emitted in a new order (`_schedule`) that holds each call
back until as many calls of its program as possible can run with it: in a DARTS cell, the
edges leaving one node form a group in the forward pass and again in the backward pass, where
a schedule in the traced order would reach them one destination node at a time. Programs with
side effects are left as they are. Each group of two or more becomes a scan: inputs that every
call shares are passed to the body once, the others stacked along a new leading axis; each
call's outputs are slices of the scan's stacked outputs. Nested programs that contain units
are rolled inside as well.

The trade-off (measured in `benchmarks/experiments/compile_once.py`): XLA no longer fuses across
the loop's boundary, stacking copies the inputs, and the calls run one after another rather than
side by side.
"""

from __future__ import annotations

import heapq
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from treemod._private_apis import Literal, bind_equation, called_program, eqn_context, eval_jaxpr

__all__ = [
    "UNIT_MARK",
    "contains_units",
    "eval_rolled",
    "trace_maybe_rolled",
    "trace_rolled",
    "unit_called",
]

UNIT_MARK = "tm_once"


class _NeedsRolling(BaseException):
    """Raised by the first `compile_once` call of a trace that runs without rolling, so that
    `trace_maybe_rolled` starts again with it. A `BaseException`, so that a user's
    `except Exception` around a model call does not swallow it."""


class _Frames(threading.local):
    def __init__(self) -> None:
        self.rolling: list[bool] = []  # one per `filter_jit` trace running in this thread


_frames = _Frames()


def unit_called() -> None:
    """Called by `compile_once` under a trace: if the innermost `filter_jit` trace runs without
    rolling, abandon it (`_NeedsRolling`) so that it starts again with rolling."""
    stack = _frames.rolling
    if stack and not stack[-1]:
        raise _NeedsRolling


def trace_maybe_rolled(fn: Callable[[Any], Any], arg: Any) -> Any:
    """`fn(arg)` under the current trace, rolled only if it calls a `compile_once` method.

    A function without such calls is traced once, as it would be without this wrapper. At its
    first `compile_once` call the trace is abandoned and `fn` is traced again through
    `trace_rolled`: the Python before that call runs twice.

    Arguments:
        fn: what `filter_jit` traces (one argument, the list of array leaves).
        arg: that argument.

    Returns:
        `fn(arg)`.
    """
    stack = _frames.rolling
    stack.append(False)
    try:
        return fn(arg)
    except _NeedsRolling:
        pass
    finally:
        stack.pop()
    stack.append(True)
    try:
        return trace_rolled(fn, (arg,))
    finally:
        stack.pop()


def _unit_program(eqn: Any) -> Any:
    """The program `eqn` calls if it is a call of a `compile_once` program, else `None`."""
    call = called_program(eqn)
    return call[0] if call is not None and UNIT_MARK in call[1] else None


def _nested_with_units(eqn: Any) -> tuple[Any, str] | None:
    """`(program, name)` if `eqn` calls a nested program that calls units, else `None`."""
    call = called_program(eqn)
    return call if call is not None and contains_units(call[0].jaxpr) else None


# Per program, held weakly: a long-lived process traces many programs and drops them.
_contains: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def contains_units(jaxpr: Any) -> bool:
    """Whether `jaxpr` (open) calls a `compile_once` program, directly or in a nested `jit`."""
    hit = _contains.get(jaxpr)
    if hit is not None:
        return hit
    found = any(
        _unit_program(e) is not None or _nested_with_units(e) is not None for e in jaxpr.eqns
    )
    _contains[jaxpr] = found
    return found


def _read(env: dict[Any, Any], v: Any) -> Any:
    return v.val if isinstance(v, Literal) else env[v]


def _schedule(eqns: Sequence[Any], unit_of: dict[int, int]) -> list[list[int]]:
    """A valid order of `eqns` in steps: one equation, or several calls of one program.

    `unit_of` maps the index of each groupable call to its program's number. Other equations
    run as soon as their inputs are there. When only calls are left to run, a program's ready
    calls run together once no other call of it can become ready first: every call of the
    program not yet run and not waiting for another call of the same program is ready. If no
    program is in that state (calls of two programs waiting on each other), the program with
    the most ready calls runs them.

    Arguments:
        eqns: a program's equations, in a valid order.
        unit_of: groupable call index -> program number.

    Returns:
        The steps, each a list of equation indices; a step of several is one group.
    """
    producer: dict[Any, int] = {}
    users: list[list[int]] = [[] for _ in eqns]
    waiting = [0] * len(eqns)
    bit = {i: 1 << n for n, i in enumerate(unit_of)}  # compact: one bit per call
    below = [0] * len(eqns)  # the bits of the calls it depends on, its own included
    for i, eqn in enumerate(eqns):
        deps = {producer[v] for v in eqn.invars if not isinstance(v, Literal) and v in producer}
        waiting[i] = len(deps)
        b = 0
        for d in deps:
            users[d].append(i)
            b |= below[d]
        below[i] = b | bit.get(i, 0)
        for v in eqn.outvars:
            producer[v] = i
    programs: dict[int, set[int]] = {}
    for i, p in unit_of.items():
        programs.setdefault(p, set()).add(i)
    mask = {p: sum(bit[i] for i in members) for p, members in programs.items()}
    glue = [i for i in range(len(eqns)) if waiting[i] == 0 and i not in unit_of]
    heapq.heapify(glue)
    ready = {i for i in unit_of if waiting[i] == 0}
    run_units = 0
    steps: list[list[int]] = []

    def done(i: int) -> None:
        for j in users[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                if j in unit_of:
                    ready.add(j)
                else:
                    heapq.heappush(glue, j)

    while True:
        while glue:
            i = heapq.heappop(glue)
            steps.append([i])
            done(i)
        if not ready:
            return steps
        best: tuple[bool, int, int] | None = None
        for p, members in programs.items():
            now = [i for i in members if i in ready]
            if not now:
                continue
            pending = mask[p] & ~run_units
            free = sum(1 for i in members if not (below[i] & pending & ~bit[i]))
            key = (len(now) == free, len(now), -min(now))
            if best is None or key > best:
                best = key
                chosen = sorted(now)
        for i in chosen:
            ready.discard(i)
            programs[unit_of[i]].discard(i)
            run_units |= bit[i]
        steps.append(chosen)
        for i in chosen:
            done(i)


def _same(vs: Sequence[Any]) -> bool:
    """Whether every call passes the same variable (or equal literal) at this position."""
    first = vs[0]
    if isinstance(first, Literal):
        return all(isinstance(v, Literal) and v.val is first.val for v in vs)
    return all(v is first for v in vs)


_rolled_programs: weakref.WeakKeyDictionary[Any, Callable[..., Any]] = weakref.WeakKeyDictionary()


def _rolled_call(closed: Any, name: str) -> Callable[..., Any]:
    """A `jax.jit` running `closed` with its own units rolled (one per program)."""
    hit = _rolled_programs.get(closed)
    if hit is not None:
        return hit
    program = weakref.ref(closed)  # the cached function must not keep its key alive

    def run(*args: Any) -> Any:
        return eval_rolled(program(), args)

    run.__name__ = run.__qualname__ = name
    fn = jax.jit(run)
    _rolled_programs[closed] = fn
    return fn


def _run(eqn: Any, invals: list[Any]) -> list[Any]:
    """`eqn` on `invals`; a nested program that calls units runs with them rolled inside, any
    other equation (a unit's own call included: JAX lowers it once) is bound as it is."""
    nested = _nested_with_units(eqn)
    if nested is not None:
        return list(_rolled_call(*nested)(*invals))
    return bind_equation(eqn, invals)


def _emit_one(eqn: Any, env: dict[Any, Any]) -> None:
    with eqn_context(eqn):
        outs = _run(eqn, [_read(env, v) for v in eqn.invars])
    for v, o in zip(eqn.outvars, outs, strict=True):
        env[v] = o


def _emit_group(group: list[Any], env: dict[Any, Any]) -> None:
    """Run the calls in `group` (one program, independent of each other) as one scan.

    Each input that differs between the calls is stacked on its own. Packing all of them into
    one buffer per dtype would copy less often, but every slice out of such a buffer has its
    own offset, so XLA would generate a distinct kernel for each; a stack or a slice of one
    array's shape is the same kernel wherever it occurs, and XLA compiles it once.
    """
    n_in = len(group[0].invars)
    shared: dict[int, Any] = {}
    stacked_pos: list[int] = []
    stacked: list[Any] = []
    for p in range(n_in):
        vs = [e.invars[p] for e in group]
        if _same(vs):
            shared[p] = _read(env, vs[0])
        else:
            stacked_pos.append(p)
            stacked.append(jnp.stack([jnp.asarray(_read(env, v)) for v in vs]))

    def body(carry: None, xs: list[Any]) -> tuple[None, list[Any]]:
        args: list[Any] = [None] * n_in
        for p, value in shared.items():
            args[p] = value
        for p, x in zip(stacked_pos, xs, strict=True):
            args[p] = x
        return None, _run(group[0], args)

    with eqn_context(group[0]):
        _, ys = lax.scan(body, None, stacked, length=len(group))
    for m, eqn in enumerate(group):
        for v, y in zip(eqn.outvars, ys, strict=True):
            env[v] = y[m]


def eval_rolled(closed: Any, args: Sequence[Any]) -> list[Any]:
    """Evaluate `closed` (a `ClosedJaxpr`) on `args`, rolling independent unit calls.

    Called under a trace: the result is the traced program with each group of independent
    calls of one `compile_once` program replaced by a `lax.scan`.

    Arguments:
        closed: the program, as `jax.make_jaxpr` gives it.
        args: its inputs (tracers or arrays), one per input variable.

    Returns:
        Its outputs, one per output variable.
    """
    jaxpr = closed.jaxpr
    if jaxpr.effects or not contains_units(jaxpr):
        return list(eval_jaxpr(jaxpr, closed.consts, *args))
    env: dict[Any, Any] = {}
    for v, x in zip(jaxpr.constvars, closed.consts, strict=True):
        env[v] = x
    for v, x in zip(jaxpr.invars, args, strict=True):
        env[v] = x
    eqns = jaxpr.eqns
    programs: dict[int, int] = {}
    units = {i: _unit_program(eqn) for i, eqn in enumerate(eqns)}
    unit_of = {
        i: programs.setdefault(id(program), len(programs))
        for i, program in units.items()
        if program is not None and not program.effects
    }
    # A chain (each call reading the previous one's output) is left unrolled: measured on a
    # UNet (`benchmarks/experiments/unet_compile_once.py`), a loop over 4 chained residual
    # blocks of convolutions compiled 2.1x and ran 2.5x slower on the CPU. `nn.Stack` is the
    # tool for long chains.
    for step in _schedule(eqns, unit_of):
        if len(step) > 1:
            _emit_group([eqns[i] for i in step], env)
        else:
            _emit_one(eqns[step[0]], env)
    return [_read(env, v) for v in jaxpr.outvars]


def trace_rolled(fn: Callable[..., Any], args: Sequence[Any]) -> Any:
    """Run `fn(*args)` under the current trace with its unit calls rolled.

    `fn` is traced to a program first (`jax.make_jaxpr`); a program without units is
    evaluated as it is, so the only cost is the second pass over its equations.

    Arguments:
        fn: a function of arrays returning a pytree of arrays.
        args: its arguments.

    Returns:
        `fn(*args)`, as a pytree of the same structure.
    """
    closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    flat = jax.tree_util.tree_leaves(args)
    outs = eval_rolled(closed, flat)
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), outs)
