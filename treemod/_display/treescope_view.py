"""treescope's view of treemod modules: a foldable tree with counts, static fields, `State`.

Loaded by `hook.py` at the first render (so treescope is already imported). Each module is
drawn with treescope's own parts (`treescope.rendering_parts`) and its children by treescope's
renderer, so arrays get treescope's summaries and array views:

- the first line says the parameter and state counts and bytes below the module (the numbers of
  `treemod.tree_summary`);
- a `field(static=True)` field carries a `# static` comment (it is part of the tree structure,
  not a leaf);
- a `State` node is labelled as state, not a parameter;
- an array that appears in two places of the rendered model carries `# shared: also at ...`
  comments, and `nn.Shared` says which nodes it fills in when called;
- an `nn.Stack` is one layer (its arrays without the layer axis) times `num_layers`, with each
  layer's root-mean-square weight (what the shapes alone do not show: a layer that diverged or
  was never loaded);
- a static value (a model's config) that an enclosing module already showed is drawn folded,
  with a note naming where it was shown;
- a module that says something of itself through `TreescopeNote` (a precision policy's
  classes) carries that in its first line.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import jax
import jax.tree_util as jtu
import numpy as np
from treescope import rendering_parts as rp

from treemod._format.pretty import count_arrays, is_arraylike_leaf
from treemod._module.state import State
from treemod._tree.module_info import module_info
from treemod.nn._shared import Shared
from treemod.nn._stack import Stack

__all__ = ["TreescopeNote", "render_module"]


@runtime_checkable
class TreescopeNote(Protocol):
    """A module that adds a note to its first line in treescope (e.g. the precision policy it
    computes under)."""

    def treescope_note(self) -> str: ...


# Arrays seen more than once in the model being rendered: id -> the paths where they sit.
_SHARED: contextvars.ContextVar[dict[int, list[str]] | None] = contextvars.ContextVar(
    "treemod_treescope_shared", default=None
)

# Static values already drawn (a config held by a model and again by its inner model): id ->
# the path where they were drawn.
_STATICS: contextvars.ContextVar[dict[int, str] | None] = contextvars.ContextVar(
    "treemod_treescope_statics", default=None
)
_SHOWN_LAYERS = 8  # per-layer statistics listed for a Stack (then "...")

_STATE_COLOR = "#f3e6ff"  # State nodes stand apart from parameters


def _counts_text(module: Any) -> str:
    params, state, nbytes = count_arrays(module, in_state=False)
    parts = [f"{params:,} params"]
    if state:
        parts.append(f"{state:,} state")
    parts.append(_bytes(nbytes))
    return " · ".join(parts)


def _bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _shared_arrays(root: Any, root_path: str) -> dict[int, list[str]]:
    """The arrays that occur at two or more key paths of `root`, by id."""
    seen: dict[int, list[str]] = {}
    for key, leaf in jtu.tree_leaves_with_path(root):
        if isinstance(leaf, jax.Array):
            seen.setdefault(id(leaf), []).append(root_path + jtu.keystr(key))
    return {k: v for k, v in seen.items() if len(v) > 1}


@contextlib.contextmanager
def _shared_scope(module: Any, path: str | None) -> Iterator[None]:
    if _SHARED.get() is not None:  # an inner module: the outermost one found the sharing
        yield
        return
    token = _SHARED.set(_shared_arrays(module, path or ""))
    statics = _STATICS.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)
        _STATICS.reset(statics)


def _layer_rms(layers: Any, n: int) -> str | None:
    """Each stacked layer's root-mean-square over its floating arrays ("0.021, 0.020, ...");
    None for abstract or traced arrays."""
    leaves = [x for x in jtu.tree_leaves(layers) if isinstance(x, jax.Array)]
    leaves = [x for x in leaves if jax.numpy.issubdtype(x.dtype, jax.numpy.floating)]
    if not leaves or any(isinstance(x, jax.core.Tracer) for x in leaves):
        return None
    shown = min(n, _SHOWN_LAYERS)
    total = np.zeros(shown)
    count = 0
    for x in leaves:
        head = np.asarray(x[:shown], np.float64).reshape(shown, -1)
        total += np.sum(head * head, axis=1)
        count += head.shape[1]
    rms = ", ".join(f"{v:.3g}" for v in np.sqrt(total / max(count, 1)))
    return rms + (", ..." if n > shown else "")


class _Folded:
    """Drawn as `<TypeName ...>`: a value shown in full elsewhere."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name} ...>"


def _comment(text: str) -> rp.RenderableTreePart:
    return rp.comment_color(rp.text(text))


def _one_layer(layers: Any) -> Any:
    """A Stack's layers without the layer axis, as `jax.ShapeDtypeStruct` leaves."""
    return jtu.tree_map(
        lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype) if is_arraylike_leaf(a) else a,
        layers,
    )


def _field_line(
    name: str,
    value: Any,
    path: str | None,
    subtree_renderer: Any,
    note: str | None,
    prefix: str,
    last: bool,
) -> rp.RenderableAndLineAnnotations:
    child_path = None if path is None else f"{path}.{name}"
    rendered = subtree_renderer(value, path=child_path)
    parts: list[Any] = [f"{name}={prefix}", rendered]
    line = rp.build_full_line_with_annotations(
        rp.siblings_with_annotations(*parts),
        rp.fold_condition(expanded=rp.text(","), collapsed=None if last else rp.text(", ")),
    )
    if note is None:
        return line
    # Notes are comments at the end of a line: shown only when the node is expanded.
    return rp.siblings_with_annotations(line, rp.fold_condition(expanded=_comment(f"  # {note}")))


def render_module(module: Any, path: str | None, subtree_renderer: Any) -> Any:
    """treescope's rendering of one treemod module (see the file's docstring).

    Arguments:
        module: the module.
        path: its key path, as treescope passes it.
        subtree_renderer: treescope's renderer for its children.

    Returns:
        A `treescope.rendering_parts.RenderableAndLineAnnotations`.
    """
    with _shared_scope(module, path):
        return _render(module, path, subtree_renderer)


def _render(module: Any, path: str | None, subtree_renderer: Any) -> Any:
    info = module_info(type(module))
    static = set(info.static_fields)
    shared = _SHARED.get() or {}
    header = _counts_text(module)
    color = None
    if isinstance(module, State):
        header = "state, not a parameter: " + header
        color = _STATE_COLOR
    if isinstance(module, Stack):
        header = f"{module.num_layers} × {type(module.layers).__name__} · {header}"
    if isinstance(module, Shared):
        tied = jtu.tree_leaves(module.get(module.pytree))
        header += f" · ties {len(tied)} array(s): filled in from `get` at each call"
    if isinstance(module, TreescopeNote):
        header += f" · {module.treescope_note()}"
    statics = _STATICS.get()
    if statics is None:
        statics = {}
    children = []
    own = path or ""
    fields = [f for f in info.fields if hasattr(module, f.name)]
    for i, f in enumerate(fields):
        value = getattr(module, f.name)
        note = None
        prefix = ""
        if f.name in static:
            note = "static"
            if not isinstance(value, int | float | str | bool | tuple | type(None)):
                seen = statics.get(id(value))
                if seen is not None:
                    note = f"static; the same object as {seen}"
                    value = _Folded(type(value).__name__)
                else:
                    statics[id(value)] = f"{own}.{f.name}"
        elif isinstance(module, Stack) and f.name == "layers":
            rms = _layer_rms(value, module.num_layers)
            value = _one_layer(value)
            prefix = f"{module.num_layers} × "
            note = f"one layer of {module.num_layers}; stored with a leading layer axis"
            if rms is not None:
                note += f"; per-layer RMS: {rms}"
        elif isinstance(value, jax.Array) and id(value) in shared:
            here = f"{own}.{f.name}"
            others = [p for p in shared[id(value)] if p != here]
            note = "shared: also at " + ", ".join(others or shared[id(value)])
        last = i == len(fields) - 1
        children.append(_field_line(f.name, value, path, subtree_renderer, note, prefix, last))
    return rp.build_foldable_tree_node_from_children(
        prefix=rp.siblings(rp.maybe_qualified_type_name(type(module)), "("),
        children=children,
        suffix=")",
        path=path,
        background_color=color,
        first_line_annotation=_comment(f"  # {header}"),
    )
