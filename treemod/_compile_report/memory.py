"""`memory_report`: where the memory of a step goes, per module path, with XLA's totals.

The step is traced as `compile_report` traces it (each module of the arguments under a
`jax.named_scope` of its key path) and compiled once. The first argument that holds modules is
the model; per module path of it: the bytes of its parameters (and of their gradients, where
the step differentiates through it) and state (its arrays), of the optimiser state that mirrors
its parameters (any other argument's arrays whose key path ends with the parameter's path, as
optax's `mu`/`nu` do), and of the activations its forward equations produce (the values a
backward pass may keep: what rematerialisation or smaller batches reduce; inside a loop, such
as an `nn.Stack`'s scan, once per iteration). XLA's
`memory_analysis()` of the compiled step gives the totals: arguments, outputs, temporaries (the
peak of the live intermediate buffers), generated code.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any

import jax.tree_util as jtu
import numpy as np

from treemod._compile_report.api import trace_scoped
from treemod._compile_report.names import ScopeReader, module_paths
from treemod._module.state import State
from treemod._tree.filters import IS_ARRAY_TYPE

__all__ = ["MemoryReport", "MemoryRow", "memory_report"]


@dataclasses.dataclass(frozen=True)
class MemoryRow:
    """One module path's bytes (see `memory_report`).

    Arguments:
        path: the module's key path (`model.layers`).
        type_name: its class.
        param_bytes: its parameters (floating arrays outside `State`).
        grad_bytes: the gradients of its parameters, when the step differentiates through it
            (its backward equations are in the program); 0 otherwise.
        state_bytes: its `State` arrays.
        optimiser_bytes: the optimiser state of its parameters.
        activation_bytes: the values its forward equations produce (itself, not its children).
    """

    path: str
    type_name: str
    param_bytes: int
    grad_bytes: int
    state_bytes: int
    optimiser_bytes: int
    activation_bytes: int


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """What `memory_report` returns: `str()` is a table; the rows and XLA's totals as fields.

    Arguments:
        rows: one `MemoryRow` per module path, the largest total first.
        argument_bytes: XLA's `memory_analysis()` of the compiled step: its arguments,
        output_bytes: its outputs,
        temp_bytes: its temporaries (the peak of the live intermediate buffers),
        code_bytes: its generated code,
        alias_bytes: the outputs that reuse argument buffers.
    """

    rows: tuple[MemoryRow, ...]
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    code_bytes: int
    alias_bytes: int

    @property
    def peak_bytes(self) -> int:
        """Arguments, outputs and temporaries, less the outputs that reuse argument buffers."""
        return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes

    def __str__(self) -> str:
        head = ("path", "type", "params", "grads", "state", "optimiser", "activations")
        rows = [head] + [
            (
                r.path,
                r.type_name,
                *(
                    _bytes(n)
                    for n in (r.param_bytes, r.grad_bytes, r.state_bytes, r.optimiser_bytes)
                ),
                _bytes(r.activation_bytes),
            )
            for r in self.rows
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = [
            "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
            for r in rows
        ]
        lines.append(
            f"XLA: arguments {_bytes(self.argument_bytes)}, outputs {_bytes(self.output_bytes)} "
            f"({_bytes(self.alias_bytes)} reusing arguments), temporaries "
            f"{_bytes(self.temp_bytes)}, code {_bytes(self.code_bytes)}; peak about "
            f"{_bytes(self.peak_bytes)}"
        )
        return "\n".join(lines)


def _bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _array_paths(tree: Any, label: str) -> dict[str, int]:
    """`{dotted key path: bytes}` of the arrays in `tree`."""
    out = {}
    for key, leaf in jtu.tree_leaves_with_path(tree):
        if IS_ARRAY_TYPE.get(type(leaf), False) or hasattr(leaf, "nbytes"):
            out[label + jtu.keystr(key)] = int(np.prod(leaf.shape)) * leaf.dtype.itemsize
    return out


# Loops whose bodies call modules are walked: an `nn.Stack`'s scan runs each layer's modules
# inside its body and keeps `length` copies of the values its backward pass needs. A loop inside
# one module (a quantised layer's slices) and other nested programs (a layer's own `filter_jit`,
# a rematerialised block) count by their outputs, as one equation.
_LOOPS = {"scan": "length", "while": None}


def _bodies(eqn: Any) -> list[Any]:
    return [
        body
        for value in eqn.params.values()
        if hasattr(body := getattr(value, "jaxpr", value), "eqns")
    ]


def _calls_modules(bodies: list[Any], stack: str, read: ScopeReader) -> bool:
    """Whether an equation of `bodies` runs in a module below the loop's own."""
    depth = len(read(stack))
    return any(
        len(read(f"{stack}/{eqn.source_info.name_stack}")) > depth
        for body in bodies
        for eqn in body.eqns
    )


def _walk(
    jaxpr: Any,
    prefix: str,
    times: int,
    read: ScopeReader,
    activations: Counter[str],
    backward: set[str],
) -> None:
    """Count the forward values of `jaxpr`'s equations (`times` copies) toward the innermost
    module path of their name stack (`prefix` + the equation's own: a loop body's stacks are
    relative to the loop), and collect the paths with backward equations."""
    for eqn in jaxpr.eqns:
        own = str(eqn.source_info.name_stack)
        stack = f"{prefix}/{own}" if prefix and own else prefix or own
        name = eqn.primitive.name
        if name in _LOOPS and _calls_modules(bodies := _bodies(eqn), stack, read):
            count = _LOOPS[name]
            inner = times * (int(eqn.params.get(count, 1)) if count else 1)
            for body in bodies:
                _walk(body, stack, inner, read, activations, backward)
            continue
        paths = read(stack)
        if not paths:
            continue
        if "transpose(" in stack:
            backward.update(paths)
            continue
        for v in eqn.outvars:
            aval: Any = getattr(v, "aval", None)
            if hasattr(aval, "shape") and hasattr(aval, "dtype"):
                activations[paths[-1]] += times * int(np.prod(aval.shape)) * aval.dtype.itemsize


def _state_bytes(module: Any) -> int:
    nodes = jtu.tree_leaves(module, is_leaf=lambda x: isinstance(x, State))
    return sum(sum(_array_paths(n, "").values()) for n in nodes if isinstance(n, State))


def memory_report(step: Callable[..., Any], /, *args: Any, **kwargs: Any) -> MemoryReport:
    """Per module path, where the memory of `step(*args, **kwargs)` goes (see the module
    docstring), and XLA's totals for the compiled step.

    Arguments:
        step: a function (a training step: model, optimiser state, batch), a module, or a
            `filter_jit` of one of those.
        *args: its positional arguments (arrays or `jax.ShapeDtypeStruct`s).
        **kwargs: its keyword arguments.

    Returns:
        A `MemoryReport`; `print` it for the table.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> mlp = tm.nn.MLP(4, 2, 64, 1, key=jax.random.key(0))
        >>> report = tm.debug.memory_report(lambda m, x: m(x).sum(), mlp, jnp.ones((8, 4)))
        >>> [(r.path, r.param_bytes) for r in report.rows][:2]
        [('m', 1800), ('m.layers[0]', 1280)]
    """
    traced = trace_scoped(step, args, kwargs, model_only=True)
    compiled = traced.lowered.compile()
    analysis = compiled.memory_analysis()
    read = ScopeReader(traced.recorder.scopes)
    activations: Counter[str] = Counter()
    backward: set[str] = set()
    _walk(traced.stage.jaxpr.jaxpr, "", 1, read, activations, backward)
    modules: list[tuple[Any, str, str]] = []  # (module, its path, path below its argument)
    arrays: dict[str, int] = {}
    for value, label in zip(args, traced.labels, strict=True):
        if not modules:  # the first argument holding modules is the model
            modules = [(m, p, p[len(label) :]) for m, p in module_paths(value, label)]
        arrays.update(_array_paths(value, label))
    owned = {p for _, p, _ in modules}
    mirrors = {p: n for p, n in arrays.items() if not any(p.startswith(o) for o in owned)}
    rows = []
    for module, path, rel in modules:
        own = [rel + p for p in _array_paths(module, "")]
        state = _state_bytes(module)
        params = sum(_array_paths(module, "").values()) - state
        rows.append(
            MemoryRow(
                path=path,
                type_name=type(module).__name__,
                param_bytes=params,
                grad_bytes=params if path in backward else 0,
                state_bytes=state,
                optimiser_bytes=sum(
                    n for p, n in mirrors.items() if any(p.endswith(q) for q in own)
                ),
                activation_bytes=activations.get(path, 0),
            )
        )
    rows.sort(key=lambda r: -(r.param_bytes + r.optimiser_bytes + r.activation_bytes))
    return MemoryReport(
        rows=tuple(rows),
        argument_bytes=int(analysis.argument_size_in_bytes),
        output_bytes=int(analysis.output_size_in_bytes),
        temp_bytes=int(analysis.temp_size_in_bytes),
        code_bytes=int(analysis.generated_code_size_in_bytes),
        alias_bytes=int(analysis.alias_size_in_bytes),
    )
