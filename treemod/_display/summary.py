"""`summary`: a model's table per module path, with output shapes and XLA's FLOP counts.

The call runs once under `jax.eval_shape` (nothing is computed) with every submodule's class
`__call__` wrapped for the duration, so each module in the tree records the shapes it
returned and the abstract arguments it was given; the model itself is not changed. Each
called module's FLOPs are then XLA's cost analysis of that module's call compiled alone
(`jax.jit(...).lower(...).compile().cost_analysis()`), and the total is the whole call's.
Parameter, state and byte counts are `treemod.tree_summary`'s.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Callable, Iterator
from typing import Any, Literal

import jax
import jax.tree_util as jtu

from treemod._format.describe import describe_array
from treemod._format.pretty import count_arrays
from treemod._module.module import Module
from treemod._module.state import State, stateful
from treemod._tree.filters import combine, is_array, partition

__all__ = ["ModelSummary", "summary"]


@dataclasses.dataclass(frozen=True)
class SummaryRow:
    """One module of the table: counts of its subtree, what its call returned and cost."""

    path: str
    type: str
    outputs: str
    params: int
    state: int
    bytes: int
    flops: float | None


@dataclasses.dataclass(frozen=True)
class ModelSummary:
    """What `summary` returns: `str()` is a text table, `_repr_html_` an HTML one.

    Attributes:
        rows: one `SummaryRow` per module, in tree order (the root first).
        flops: XLA's FLOP count of the whole call (None with `flops=None`).
    """

    rows: tuple[SummaryRow, ...]
    flops: float | None

    _HEADER = ("path", "type", "outputs", "params", "state", "bytes", "FLOPs")

    def _cells(self) -> list[tuple[str, ...]]:
        root = self.rows[0]
        cells = [
            (
                r.path,
                r.type,
                r.outputs,
                f"{r.params:,}",
                f"{r.state:,}",
                f"{r.bytes:,}",
                "-" if r.flops is None else f"{r.flops:,.0f}",
            )
            for r in self.rows
        ]
        total = ("total", "", "", f"{root.params:,}", f"{root.state:,}", f"{root.bytes:,}")
        return [*cells, (*total, "-" if self.flops is None else f"{self.flops:,.0f}")]

    def __str__(self) -> str:
        rows = [self._HEADER, *self._cells()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self._HEADER))]
        lines = []
        for r in rows:
            left = [c.ljust(w) for c, w in zip(r[:3], widths[:3], strict=True)]
            right = [c.rjust(w) for c, w in zip(r[3:], widths[3:], strict=True)]
            lines.append("  ".join(left + right).rstrip())
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self._HEADER)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
            for r in self._cells()
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _modules(tree: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every module in `tree` with its key path, parents before children."""
    if isinstance(tree, State):  # a box for an array, counted as state by its parent
        return
    if isinstance(tree, Module):
        yield path or "(root)", tree
    pairs, treedef = jtu.tree_flatten_with_path(tree, is_leaf=lambda x: x is not tree)
    if jtu.treedef_is_leaf(treedef):
        return
    for key, child in pairs:
        if not is_array(child):
            yield from _modules(child, path + jtu.keystr(key))


def _shapes(tree: Any) -> str:
    leaves = [x for x in jtu.tree_leaves(tree) if hasattr(x, "shape") and hasattr(x, "dtype")]
    return ", ".join(describe_array(tuple(x.shape), x.dtype) for x in leaves)


def _abstract(x: Any) -> Any:
    if isinstance(x, jax.Array) or is_array(x):  # tracers are `jax.Array`s
        return jax.ShapeDtypeStruct(x.shape, x.dtype)
    return x


def _is_dynamic(x: Any) -> bool:
    return isinstance(x, jax.ShapeDtypeStruct) or is_array(x)


def _cost(fn: Callable[..., Any], module: Any, args: Any, kwargs: Any, compiled: bool) -> float:
    """XLA's FLOP count of `fn(module, *args, **kwargs)`, arrays abstract, the rest static: of
    the lowered program, or (`compiled`) of the program XLA optimised."""
    dyn, static = partition((module, args, kwargs), _is_dynamic)
    dyn = jtu.tree_map(_abstract, dyn)

    def call(dyn: Any) -> Any:
        m, a, k = combine(dyn, static)
        return fn(m, *a, **k)

    lowered = jax.jit(call).lower(dyn)
    analysis = lowered.compile().cost_analysis() if compiled else lowered.cost_analysis()
    if isinstance(analysis, list | tuple):  # older jax: one dict per computation
        analysis = analysis[0] if analysis else {}
    return float((analysis or {}).get("flops", 0.0))


def _run(module: Any, *args: Any, **kwargs: Any) -> Any:
    # `stateful`, so that layers recording state (BatchNorm in training) run as in training.
    return stateful(module)(*args, **kwargs)[0]


def summary(
    model: Any,
    *example_args: Any,
    flops: Literal["lowered", "compiled", None] = "lowered",
    **example_kwargs: Any,
) -> ModelSummary:
    """A table per module path: type, output shapes, parameters, state, bytes and FLOPs.

    The model is called once on the example arguments under `jax.eval_shape` (abstract: no
    computation, and `jax.ShapeDtypeStruct` arguments work), recording what each submodule's
    call returned; the model is not changed. FLOPs are XLA's cost analysis of each module's
    call lowered alone (no compilation: fast), and of the whole call for the total;
    `flops="compiled"` analyses the programs XLA optimised instead (slower: each is compiled),
    and `flops=None` leaves FLOPs out. A module that the call never
    runs directly (a layer inside `nn.Stack`'s scan, say) shows `-`. Parameter, state and
    byte counts are those of `treemod.tree_summary` (arrays inside `State` are state).

    Arguments:
        model: the model (any `treemod.Module`).
        *example_args: arguments for the call (arrays or `jax.ShapeDtypeStruct`s).
        flops: `"lowered"` (the default), `"compiled"` or None (see above).
        **example_kwargs: keyword arguments for the call.

    Returns:
        A `ModelSummary`: `print(...)` shows a text table, a notebook an HTML one.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> mlp = tm.nn.MLP(4, 2, 8, 1, key=jax.random.key(0))
        >>> print(tm.summary(mlp, jnp.ones((3, 4))))  # doctest: +NORMALIZE_WHITESPACE
        path         type     outputs    params  state  bytes  FLOPs
        (root)       MLP      f32[3,2]       58      0    232    ...
        .layers[0]   Linear   f32[3,8]       40      0    160    ...
        .layers[1]   Linear   f32[3,2]       18      0     72    ...
        total                                58      0    232    ...
    """
    if not isinstance(model, Module):
        raise TypeError(f"summary: expected a treemod Module, got {type(model).__name__}.")
    if flops not in ("lowered", "compiled", None):
        raise ValueError(f"summary: flops must be 'lowered', 'compiled' or None; got {flops!r}.")
    modules = list(_modules(model))
    paths = {id(m): p for p, m in modules}
    records: dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]] = {}
    classes = {type(m) for _, m in modules if callable(m)}
    originals = {cls: cls.__dict__.get("__call__") for cls in classes}

    def make_wrapper(cls: type) -> Callable[..., Any]:
        inner = cls.__call__

        def record(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = inner(self, *args, **kwargs)
            path = paths.get(id(self))
            if path is not None and path not in records:
                abstract = jtu.tree_map(_abstract, (args, kwargs))
                records[path] = (jtu.tree_map(_abstract, out), *abstract)
            return out

        return record

    wrappers = {cls: make_wrapper(cls) for cls in classes}
    try:
        for cls, wrapper in wrappers.items():
            cls.__call__ = wrapper
        jax.eval_shape(lambda a, k: _run(model, *a, **k), example_args, example_kwargs)
    finally:
        for cls, original in originals.items():
            if original is None:
                del cls.__call__
            else:
                cls.__call__ = original

    rows = []
    for path, module in modules:
        params, state, nbytes = count_arrays(module, in_state=False)
        record = records.get(path)
        outputs, cost = "-", None
        if record is not None:
            out, args, kwargs = record
            outputs = _shapes(out)
            if flops is not None:
                cost = _cost(_run, module, args, kwargs, flops == "compiled")
        rows.append(SummaryRow(path, type(module).__name__, outputs, params, state, nbytes, cost))
    total = (
        None
        if flops is None
        else _cost(_run, model, example_args, example_kwargs, flops == "compiled")
    )
    return ModelSummary(tuple(rows), total)
