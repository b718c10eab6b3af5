"""Readable printing of pytrees and a parameter summary."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.tree_util as jtu
import numpy as np

from treemod._format.describe import describe_array
from treemod._tree.filters import is_array
from treemod._tree.module_info import INFO_ATTRIBUTE, is_module

if TYPE_CHECKING:
    import wadler_lindig as wl

# wadler_lindig is imported by the functions that print (the first repr of a module), not at
# `import treemod`, a fifth of whose time it was.

__all__ = [
    "count_arrays",
    "is_arraylike_leaf",
    "tree_pformat",
    "tree_pprint",
    "tree_summary",
]

_MAX_ITEMS = 12


def is_arraylike_leaf(x: Any) -> bool:
    """Whether `x` counts as an array in the printed tree and the counts: an array or a
    `jax.ShapeDtypeStruct` (an abstract model prints and counts as its concrete twin)."""
    return is_array(x) or isinstance(x, jax.ShapeDtypeStruct)


def _array_doc(x: Any) -> wl.AbstractDoc:
    import wadler_lindig as wl

    return wl.TextDoc(describe_array(x.shape, x.dtype))


def _custom(
    max_items: int,
    indent: int,
    short_arrays: bool,
    struct_as_array: bool = True,
    truncate_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """The `custom` hook for wadler_lindig: array summaries, and long containers elided."""
    import wadler_lindig as wl

    def pdoc(obj: Any) -> wl.AbstractDoc:
        return wl.pdoc(obj, custom=custom, short_arrays=short_arrays, indent=indent)

    def more(n: int) -> wl.AbstractDoc:
        return wl.TextDoc(f"... {n} more ...")

    def custom(obj: Any) -> wl.AbstractDoc | None:
        if truncate_leaf is not None and truncate_leaf(obj):
            return wl.TextDoc(f"{type(obj).__name__}(...)")
        if isinstance(obj, jax.ShapeDtypeStruct):  # (which `is_array` counts as an array)
            return _array_doc(obj) if struct_as_array else None
        if short_arrays and is_array(obj):
            return _array_doc(obj)
        if isinstance(obj, list | tuple) and len(obj) > max_items and not hasattr(obj, "_fields"):
            docs = [pdoc(o) for o in obj[: max_items - 2]] + [more(len(obj) - max_items + 2)]
            open_, close = ("[", "]") if isinstance(obj, list) else ("(", ")")
        elif isinstance(obj, dict) and len(obj) > max_items:
            items = list(obj.items())[: max_items - 2]
            docs = [pdoc(k) + wl.TextDoc(":") + wl.BreakDoc(" ") + pdoc(v) for k, v in items]
            docs.append(more(len(obj) - max_items + 2))
            open_, close = "{", "}"
        else:
            return None
        return wl.bracketed(
            begin=wl.TextDoc(open_), docs=docs, sep=wl.comma, end=wl.TextDoc(close), indent=indent
        )

    return custom


def tree_pformat(
    pytree: Any,
    *,
    width: int = 88,
    indent: int = 2,
    short_arrays: bool = True,
    struct_as_array: bool = True,
    truncate_leaf: Callable[[Any], bool] | None = None,
    max_items: int = _MAX_ITEMS,
) -> str:
    """Format a pytree readably: arrays as `f32[64,32]`, nesting indented, long containers elided.

    Arguments:
        pytree: anything; modules print as `ClassName(field=...)` (fields left at their
            default value are not shown).
        width: the line width to fit.
        indent: how far each nesting level is indented.
        short_arrays: print arrays as `f32[2,3]` (`False`: with their values).
        struct_as_array: print `jax.ShapeDtypeStruct`s as the array they stand for
            (`False`: as `ShapeDtypeStruct(shape=..., dtype=...)`, Equinox's default).
        truncate_leaf: a predicate on every node; a node it holds for prints as
            `TypeName(...)` (Equinox's option), for eliding large submodules.
        max_items: lists, tuples and dicts longer than this show their first `max_items - 2`
            entries and a count of the rest, so that a model with a thousand layers prints in
            a screenful.

    Returns:
        The formatted string (this is also what `repr(module)` gives).

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> print(tm.tree_pformat({"w": jnp.zeros((64, 32)), "n": 3}))
        {'w': f32[64,32], 'n': 3}
        >>> print(tm.tree_pformat(list(range(100)), max_items=4))
        [0, 1, ... 98 more ...]
        >>> print(tm.tree_pformat({"a": [1, 2], "b": 3}, truncate_leaf=lambda x: x == [1, 2]))
        {'a': list(...), 'b': 3}
    """
    if max_items < 3:
        raise ValueError(f"tree_pformat: max_items must be at least 3, got {max_items}.")
    import wadler_lindig as wl

    custom = _custom(max_items, indent, short_arrays, struct_as_array, truncate_leaf)
    return wl.pformat(pytree, width=width, indent=indent, custom=custom, short_arrays=short_arrays)


def tree_pprint(pytree: Any, **kwargs: Any) -> None:
    """Print `tree_pformat(pytree, **kwargs)` (Equinox's `tree_pprint`).

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> tm.tree_pprint({"w": jnp.zeros(3), "act": "relu"})
        {'w': f32[3], 'act': 'relu'}
    """
    print(tree_pformat(pytree, **kwargs))


def _children(node: Any) -> list[tuple[str, Any]]:
    """The immediate children of `node` with their keys; `[]` for a leaf or an empty node."""
    pairs, treedef = jtu.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if jtu.treedef_is_leaf(treedef) or not pairs:  # a leaf, or None / an empty container
        return []
    return [(jtu.keystr(path), child) for path, child in pairs]


def _type_name(node: Any) -> str:
    if is_arraylike_leaf(node):
        import wadler_lindig as wl

        return wl.pformat(_array_doc(node))
    if isinstance(node, list | tuple | dict) and not is_module(node):
        return f"{type(node).__name__}[{len(node)}]"
    return type(node).__name__


def _is_state_node(x: Any) -> bool:
    """Whether `x` is a `treemod.State` node (its class option `holds_state=True`: this layer
    cannot import it)."""
    info = getattr(type(x), INFO_ATTRIBUTE, None)
    return info is not None and info.holds_state


def count_arrays(node: Any, in_state: bool) -> tuple[int, int, int]:
    """Array elements outside `State` nodes, inside them, and the bytes of both."""
    counts = [0, 0]
    nbytes = 0
    for part in jtu.tree_leaves(node, is_leaf=_is_state_node):
        inside = in_state or _is_state_node(part)
        for leaf in jtu.tree_leaves(part):
            if is_arraylike_leaf(leaf):
                n = int(np.prod(leaf.shape, dtype=np.int64))
                counts[inside] += n
                nbytes += n * leaf.dtype.itemsize  # PRNG keys too: their dtype has no NumPy twin
    return counts[0], counts[1], nbytes


def _rows(
    node: Any,
    path: str,
    level: int,
    depth: int | None,
    rows: list[tuple[str, str, int, int, int]],
    in_state: bool = False,
) -> None:
    """Append the rows for `node` at `path`; `level` is how many levels `path` has used."""
    in_state = in_state or _is_state_node(node)
    children = _children(node)
    module = is_module(node)
    # A container of modules (a list of layers) is no level of its own: `.layers[0]` is one.
    transparent = not module and any(is_module(c) for _, c in children)
    at_depth = depth is not None and level >= depth and not transparent
    if not children or at_depth:
        count, state, nbytes = count_arrays(node, in_state)
        if count or state or module:
            rows.append((path or "(root)", _type_name(node), count, state, nbytes))
        return
    step = 0 if transparent and path else 1
    for key, child in children:
        _rows(child, path + key, level + step, depth, rows, in_state)


def tree_summary(pytree: Any, *, depth: int | None = 1) -> str:
    """A table of parameter and state counts and bytes per submodule, with a total.

    Rows group the arrays under each path `depth` levels below the root. A list (or tuple or
    dict) of modules is not a level of its own, so a model with `layers: list` gets one row per
    layer (`.layers[0]`, `.layers[1]`, ...). Arrays directly on a module get their own row.
    Arrays inside `State` nodes (BatchNorm's running statistics, say) are counted apart, in a
    `state` column that the table has when the tree holds any.

    Arguments:
        pytree: a model (or any pytree of arrays; `jax.ShapeDtypeStruct` leaves count too, so
            `tree_summary(jax.eval_shape(make_model))` sizes a model without allocating it).
        depth: how many levels to group by (`None`: one row per array).

    Returns:
        The table as a string: path, type (class, container or `f32[shape]`), the number of
        array elements outside `State` (`params`) and inside it (`state`), and bytes.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> class Linear(tm.Module):
        ...     weight: jnp.ndarray
        ...     bias: jnp.ndarray
        >>> class MLP(tm.Module):
        ...     layers: list
        ...     scale: jnp.ndarray
        >>> mlp = MLP([Linear(jnp.zeros((8, 2)), jnp.zeros(8)),
        ...            Linear(jnp.zeros((1, 8)), jnp.zeros(1))], jnp.ones(()))
        >>> print(tm.tree_summary(mlp))
        path        type    params  bytes
        .layers[0]  Linear      24     96
        .layers[1]  Linear       9     36
        .scale      f32[]        1      4
        total                   34    136
        >>> class Norm(tm.Module):
        ...     weight: jnp.ndarray
        ...     running_mean: tm.State
        >>> print(tm.tree_summary(Norm(jnp.ones(4), tm.State(jnp.zeros(4)))))
        path           type    params  state  bytes
        .weight        f32[4]       4      0     16
        .running_mean  State        0      4     16
        total                       4      4     32
    """
    if depth is not None and depth < 0:
        raise ValueError(f"tree_summary: depth must be >= 0 or None, got {depth}.")
    rows: list[tuple[str, str, int, int, int]] = []
    _rows(pytree, "", 0, depth, rows)
    rows.append(
        ("total", "", sum(r[2] for r in rows), sum(r[3] for r in rows), sum(r[4] for r in rows))
    )
    with_state = rows[-1][3] > 0
    table = [("path", "type", "params", *(("state",) if with_state else ()), "bytes")]
    for p, t, c, s, b in rows:
        table.append((p, t, str(c), *((str(s),) if with_state else ()), str(b)))
    w = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return "\n".join(
        "  ".join(
            f"{cell:<{w[i]}}" if i < 2 else f"{cell:>{w[i]}}" for i, cell in enumerate(r)
        ).rstrip()
        for r in table
    )
