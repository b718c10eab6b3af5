"""Readable printing of pytrees and a parameter summary."""

from __future__ import annotations

from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np
import wadler_lindig as wl

from ._filters import is_array

__all__ = ["tree_pformat", "tree_summary"]

_MAX_ITEMS = 12


def _array_doc(x: Any) -> wl.AbstractDoc:
    return wl.array_summary(x.shape, np.dtype(x.dtype).name, kind=None)


def _custom(max_items: int) -> Any:
    def custom(obj: Any) -> wl.AbstractDoc | None:
        if is_array(obj) or isinstance(obj, jax.ShapeDtypeStruct):
            return _array_doc(obj)
        if isinstance(obj, list | tuple) and len(obj) > max_items:
            head = [wl.pdoc(o, custom=custom, short_arrays=True) for o in obj[: max_items - 2]]
            more = wl.TextDoc(f"... {len(obj) - max_items + 2} more ...")
            open_, close = ("[", "]") if isinstance(obj, list) else ("(", ")")
            return wl.bracketed(
                begin=wl.TextDoc(open_),
                docs=[*head, more],
                sep=wl.comma,
                end=wl.TextDoc(close),
                indent=2,
            )
        return None

    return custom


def tree_pformat(pytree: Any, *, width: int = 88, max_items: int = _MAX_ITEMS) -> str:
    """Format a pytree readably: arrays as `f32[64,32]`, nesting indented, long lists elided.

    Arguments:
        pytree: anything; modules print as `ClassName(field=..., ...)`.
        width: the line width to fit.
        max_items: lists and tuples longer than this show their first items and a count.

    Returns:
        The formatted string (this is also what `repr(module)` gives).

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> print(tm.tree_pformat({"w": jnp.zeros((64, 32)), "n": 3}))
        {'w': f32[64,32], 'n': 3}
    """
    return wl.pformat(pytree, width=width, custom=_custom(max_items), short_arrays=True)


def _nbytes(x: Any) -> int:
    return int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize


def tree_summary(pytree: Any, *, depth: int = 1) -> str:
    """A table of array-parameter counts and bytes per submodule, with a total.

    Arguments:
        pytree: a model (or any pytree of arrays).
        depth: how many levels of key paths to group by.

    Returns:
        The table as a string.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> print(tm.tree_summary({"a": jnp.zeros((2, 3)), "b": jnp.zeros(4)}))
        path     params  bytes
        ['a']         6     24
        ['b']         4     16
        total        10     40
    """
    rows: dict[str, list[int]] = {}
    for path, leaf in jtu.tree_flatten_with_path(pytree)[0]:
        if not (is_array(leaf) or isinstance(leaf, jax.ShapeDtypeStruct)):
            continue
        name = jtu.keystr(tuple(path[:depth])) or "(root)"
        count = int(np.prod(leaf.shape, dtype=np.int64))
        row = rows.setdefault(name, [0, 0])
        row[0] += count
        row[1] += _nbytes(leaf)
    total = [sum(r[0] for r in rows.values()), sum(r[1] for r in rows.values())]
    table = [("path", "params", "bytes")]
    table += [(k, str(v[0]), str(v[1])) for k, v in rows.items()]
    table.append(("total", str(total[0]), str(total[1])))
    w = [max(len(r[i]) for r in table) for i in range(3)]
    return "\n".join(f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}".rstrip() for r in table)
