"""`compile_report`: trace, lower (and compile) a function once, measuring each module path."""

from __future__ import annotations

import dataclasses
import time
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu

from treemod._compile_report.hlo_costs import hlo_costs
from treemod._compile_report.intercept import Recorder, recording
from treemod._compile_report.jaxpr_costs import jaxpr_costs
from treemod._compile_report.names import ScopeReader, argument_labels, module_paths
from treemod._compile_report.report import CompileReport, PathCost, ProgramCost, advice
from treemod._format.describe import describe_value
from treemod._format.paths import function_name
from treemod._transforms.caches import clear_caches
from treemod._transforms.jit import JitWrapped
from treemod._transforms.leaves import merge_leaves, split_leaves
from treemod._transforms.roll import UNIT_MARK, contains_units, eval_rolled
from treemod._transforms.wrapper import split_fn
from treemod._tree.filters import IS_ARRAY_TYPE

__all__ = ["ONCE_MARKER", "Traced", "compile_report", "trace_scoped"]

# The marker in the names of `compile_once`'s nested programs.
ONCE_MARKER = UNIT_MARK


def _unwrap(fn: Any) -> Any:
    """The function a `filter_jit` wraps (also as a bound method): the report traces it
    itself, splitting the arguments as `filter_jit` does."""
    if isinstance(fn, JitWrapped):
        return fn.__wrapped__
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, JitWrapped):
        return types.MethodType(fn.__func__.__wrapped__, fn.__self__)
    return fn


def compile_report(
    fn: Callable[..., Any], /, *args: Any, compile: bool = False, cold: bool = False, **kwargs: Any
) -> CompileReport:
    """Trace and lower `fn(*args, **kwargs)` once, and report what each module path costs.

    As `filter_jit` would: array leaves are traced, every other leaf is static. Each module in
    the arguments is named by its key path (`model.layers[3].mlp`), and every call of its
    `__call__` or public methods during the trace is timed and scoped, so the report gives per
    path the calls, the time spent tracing, the equations emitted and the StableHLO lowered
    (inclusive and exclusive), and lists the nested programs (inner `jax.jit`/`filter_jit`, such
    as `treemod.nn` layers' cores) with how many call sites share each trace. Modules built
    inside `fn`, private methods and nested programs count toward the module calling them. A
    module a transform rebuilds inside `fn` (`filter_grad`'s copy) keeps its path when it is
    found inside the module calling it, or is the only module of the arguments of its
    structure and shapes; otherwise it too counts toward its caller.

    Arguments:
        fn: a function, a module, a bound method, or a `filter_jit` of one of those.
        *args: its positional arguments.
        compile: also compile with XLA, timing it and counting the fusions.
        cold: first clear JAX's and treemod's caches (`jax.clear_caches()`,
            `tm.clear_caches()`), so nested programs are traced as in a fresh process; every
            function compiles again at its next call.
        **kwargs: its keyword arguments (wrap `fn` in `functools.partial` to pass one named
            `compile` or `cold`).

    Returns:
        A `CompileReport`: `print` it for the table, or read `.rows` and `.programs`.

    Raises:
        TypeError: `fn` is not callable.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> layers = [tm.nn.Linear(4, 4, key=k) for k in jax.random.split(jax.random.key(0), 3)]
        >>> def forward(layers, x):
        ...     for layer in layers:
        ...         x = layer(x)
        ...     return x.sum()
        >>> report = tm.debug.compile_report(forward, layers, jnp.ones(4))
        >>> [(r.path, r.calls, r.eqns) for r in report.rows]
        [('forward', 1, 19), ('layers[0]', 1, 6), ('layers[1]', 1, 6), ('layers[2]', 1, 6)]
        >>> [(p.name, p.uses, p.eqns) for p in report.programs]
        [('Linear._flat', 3, 3)]
    """
    if not callable(fn):
        raise TypeError(
            "compile_report: `fn` must be callable (a function, a module or a filter_jit "
            f"function); got {describe_value(fn)}."
        )
    if cold:
        clear_caches()
        jax.clear_caches()
    traced = trace_scoped(fn, args, kwargs)
    name, root, recorder, stage, lowered = (
        traced.name,
        traced.root,
        traced.recorder,
        traced.stage,
        traced.lowered,
    )
    trace_s, lower_s = traced.trace_s, traced.lower_s
    compile_s = fusions = None
    if compile:
        start = time.perf_counter()
        compiled = lowered.compile()
        compile_s = time.perf_counter() - start
        fusions = _count_fusions(compiled.as_text() or "")
    read = ScopeReader(recorder.scopes)
    by_eqn = jaxpr_costs(stage.jaxpr, read, root, ONCE_MARKER)
    by_hlo = hlo_costs(lowered.as_text(debug_info=True), read, root)
    rows = tuple(
        PathCost(
            path=path,
            type_name=s.type_name,
            calls=s.calls,
            trace_s=s.time,
            self_trace_s=s.self_time,
            eqns=by_eqn.eqns[path],
            self_eqns=by_eqn.self_eqns[path],
            hlo_chars=by_hlo.chars[path],
            self_hlo_chars=by_hlo.self_chars[path],
            once_uses=by_eqn.once_uses[path],
        )
        for path, s in recorder.stats.items()
        if path == root or s.calls or by_eqn.eqns[path] or by_hlo.chars[path]
    )
    programs = tuple(
        ProgramCost(
            p.name, p.inputs, p.uses, p.eqns, ONCE_MARKER in p.name, tuple(p.callers.items())
        )
        for p in by_eqn.programs
    )
    return CompileReport(
        function=name,
        rows=rows,
        programs=programs,
        trace_s=trace_s,
        lower_s=lower_s,
        compile_s=compile_s,
        eqns=by_eqn.total,
        hlo_chars=len(lowered.as_text()),
        hlo_functions=len(by_hlo.functions),
        scan_loops=by_hlo.whiles,
        fusions=fusions,
        advice=advice(rows, {p: s.signature for p, s in recorder.stats.items()}, by_eqn.reads),
    )


def _count_fusions(hlo: str) -> int:
    """Fusion instructions in XLA's optimised HLO text (`... = f32[...] fusion(...)`)."""
    return sum(line.count(" fusion(") for line in hlo.splitlines())


@dataclasses.dataclass(frozen=True)
class Traced:
    """One scoped trace of a function (see `trace_scoped`)."""

    name: str
    root: str
    labels: tuple[str, ...]  # the positional arguments' names in paths
    recorder: Recorder
    stage: Any  # jax.stages.Traced
    lowered: Any  # jax.stages.Lowered
    dynamic: list[Any]
    trace_s: float
    lower_s: float


def trace_scoped(
    fn: Callable[..., Any], args: Any, kwargs: Any, *, model_only: bool = False
) -> Traced:
    """Trace and lower `fn(*args, **kwargs)` as `filter_jit` would, each module of the
    arguments called under a `jax.named_scope` of its key path (`compile_report`'s trace, also
    `memory_report`'s).

    Arguments:
        fn: a function, a module, a bound method, or a `filter_jit` of one of those.
        args: its positional arguments.
        kwargs: its keyword arguments.
        model_only: scope only the modules of the first argument holding modules (the model;
            an optimiser state's copies of its structure would make paths ambiguous).

    Returns:
        The `Traced` record: names, the recorder of module calls, JAX's traced and lowered
        stages, the dynamic arguments, and the trace and lowering times.
    """
    target = _unwrap(fn)
    name = function_name(target)
    fn_tree, call = split_fn(target)
    labels, kw_labels = argument_labels(target, args, kwargs)
    root = name if name not in (*labels, *kw_labels, "self") else f"{name}()"
    leaves, treedef = jtu.tree_flatten((fn_tree, args, kwargs))
    mask = tuple(IS_ARRAY_TYPE[type(x)] for x in leaves)
    dynamic, static = split_leaves(leaves, mask)
    recorder = Recorder(root)

    def traced(dynamic: list[Any]) -> list[Any]:
        t_fn, t_args, t_kwargs = jtu.tree_unflatten(treedef, merge_leaves(mask, dynamic, static))
        # Paths of the objects this trace sees (the unflattened ones), not the caller's.
        found = [] if t_fn is None else list(module_paths(t_fn, "self"))
        for value, label in zip(t_args, labels, strict=True):
            if not (model_only and found):
                found += module_paths(value, label)
        for key, value in t_kwargs.items():
            if not (model_only and found):
                found += module_paths(value, kw_labels[key])
        for instance, path in found:
            recorder.add(instance, path)
        with recording(recorder, {type(m) for m, _ in found}):
            if t_fn is None:
                out = recorder.run_root(lambda: target(*t_args, **t_kwargs))
            elif call is None:
                out = recorder.run_root(lambda: t_fn(*t_args, **t_kwargs))
            else:
                out = recorder.run_root(lambda: call(t_fn, *t_args, **t_kwargs))
        return [x for x in jtu.tree_leaves(out) if IS_ARRAY_TYPE[type(x)]]

    traced.__name__ = traced.__qualname__ = name  # JAX names the program after it
    start = time.perf_counter()
    stage = jax.jit(traced).trace(dynamic)
    trace_s = time.perf_counter() - start
    start = time.perf_counter()
    if contains_units(stage.jaxpr.jaxpr):
        # Lowered as `filter_jit` lowers it: independent `compile_once` calls rolled into loops.
        closed = stage.jaxpr
        lowered = jax.jit(lambda d: eval_rolled(closed, jtu.tree_leaves(d))).lower(dynamic)
    else:
        lowered = stage.lower()
    lower_s = time.perf_counter() - start
    return Traced(name, root, tuple(labels), recorder, stage, lowered, dynamic, trace_s, lower_s)
