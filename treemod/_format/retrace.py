"""The retrace explainer: say which argument path changed, and how, when a function retraces.

Used by `filter_jit` at trace time only (never per call). A trace signature is
`(treedef, mask, static, avals)` of the flattened `(fn_tree, args, kwargs)`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.tree_util as jtu

from treemod._format.describe import describe_array
from treemod._format.paths import render_path
from treemod._tree.module_info import static_field_names

logger = logging.getLogger("treemod")

Signature = tuple[Any, tuple[bool, ...], tuple[Any, ...], tuple[Any, ...]]


def aval_of(x: Any) -> tuple[tuple[int, ...], Any, bool]:
    """`(shape, dtype, weak_type)` of an array or tracer."""
    aval = getattr(x, "aval", None)
    if aval is None:
        aval = jax.typeof(x)
    return tuple(aval.shape), aval.dtype, bool(getattr(aval, "weak_type", False))


def short_repr(value: Any) -> str:
    """`repr`, shortened, with functions shown by name (and never raising)."""
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    if callable(value) and isinstance(name, str) and not isinstance(value, type):
        text = f"<function {name}>"
    else:
        try:
            text = repr(value)
        except Exception as e:  # noqa: BLE001 - a diagnostic never fails the call it explains
            text = f"<{type(value).__qualname__} object; its repr raised {type(e).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _describe_static(value: Any) -> str:
    return f"static value {short_repr(value)}"


def _leaf_descriptions(
    mask: Sequence[bool], static: Sequence[Any], avals: Sequence[Any]
) -> list[Any]:
    it_s, it_a = iter(static), iter(avals)
    return [("array", next(it_a)) if m else ("static", next(it_s)) for m in mask]


def leaf_paths(treedef: Any, fn_label: str) -> list[str]:
    """The path of each leaf of `treedef` as a message shows it (`fn_label` names the root)."""
    try:
        tree = treedef.unflatten([_Hole()] * treedef.num_leaves)
        return [render_path(p, fn_label) for p, _ in jtu.tree_flatten_with_path(tree)[0]]
    except Exception:  # a custom node that rejects placeholders: fall back to leaf numbers
        return [f"leaf {i}" for i in range(treedef.num_leaves)]


def _bits_equal(a: complex, b: complex) -> bool:
    x, y = complex(a), complex(b)
    return all(
        u == v and math.copysign(1.0, u) == math.copysign(1.0, v)
        for u, v in ((x.real, y.real), (x.imag, y.imag))
    )


class _Hole:
    __slots__ = ()


def _same_static(a: Any, b: Any) -> bool:
    """Equal as `filter_jit` keys them: floats by their bits (`0.0` is not `-0.0`, a NaN is
    itself), everything else by `==`."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float | complex):
        return repr(complex(a)) == repr(complex(b)) if a != a or b != b else _bits_equal(a, b)
    try:
        return bool(a == b)
    except Exception:
        return a is b


def _leaf_change(old: tuple[str, Any], new: tuple[str, Any]) -> str | None:
    if old[0] == "array" and new[0] == "array":
        if old[1] == new[1]:
            return None
        return f"{describe_array(*old[1])} -> {describe_array(*new[1])}"
    if old[0] == "static" and new[0] == "static":
        if _same_static(old[1], new[1]):
            return None
        text = f"{_describe_static(old[1])} -> {short_repr(new[1])}"
        if type(old[1]) is not type(new[1]):
            text += f" (type {type(old[1]).__name__} -> {type(new[1]).__name__})"
        return text
    left = describe_array(*old[1]) if old[0] == "array" else _describe_static(old[1])
    right = describe_array(*new[1]) if new[0] == "array" else _describe_static(new[1])
    return f"{left} -> {right}"


def _children_with_keys(treedef: Any) -> list[tuple[Any, Any]]:
    """One level of `treedef`: `(key, child_treedef)` pairs."""
    children = treedef.children()
    try:
        obj = treedef.unflatten([_Hole()] * treedef.num_leaves)
        keyed = jtu.tree_flatten_with_path(obj, is_leaf=lambda x: x is not obj)[0]
        keys = [p[0] for p, _ in keyed]
    except Exception:
        keys = [jtu.SequenceKey(i) for i in range(len(children))]
    if len(keys) != len(children):
        keys = [jtu.SequenceKey(i) for i in range(len(children))]
    return list(zip(keys, children, strict=True))


def _node_name(treedef: Any) -> str:
    data = treedef.node_data()
    if data is None:
        return "a leaf"
    name: str = data[0].__qualname__
    return name


def _structure_diff(a: Any, b: Any, path: tuple[Any, ...], fn_label: str, out: list[str]) -> None:
    if a == b:
        return
    where = render_path(path, fn_label)
    da, db = a.node_data(), b.node_data()
    if da is None or db is None or da[0] is not db[0]:
        out.append(f"{where}: {_node_name(a)} -> {_node_name(b)}")
        return
    cls, aux_a, aux_b = da[0], da[1], db[1]
    if not _aux_equal(aux_a, aux_b):
        fields = static_field_names(cls)
        if fields and isinstance(aux_a, tuple) and isinstance(aux_b, tuple):
            for name, x, y in zip(fields, aux_a, aux_b, strict=False):
                if not _same_static(x, y):
                    out.append(
                        f"{where}.{name}: static field {cls.__qualname__}.{name} "
                        f"{short_repr(x)} -> {short_repr(y)}"
                    )
        elif cls is dict:
            out.append(f"{where}: dict keys {list(aux_a)} -> {list(aux_b)}")
            return
        else:
            out.append(f"{where}: {cls.__qualname__} node data {aux_a!r} -> {aux_b!r}")
            return
    ca, cb = _children_with_keys(a), _children_with_keys(b)
    if len(ca) != len(cb):
        out.append(f"{where}: {cls.__qualname__} of length {len(ca)} -> {len(cb)}")
        return
    for (key, x), (_, y) in zip(ca, cb, strict=True):
        _structure_diff(x, y, path + (key,), fn_label, out)


def _aux_equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return a is b


def explain(old: Signature, new: Signature, fn_label: str = "self") -> list[str]:
    """Lines saying how the arguments of a retrace differ from those of the previous trace."""
    t0, m0, s0, a0 = old
    t1, m1, s1, a1 = new
    if t0 != t1:
        lines: list[str] = []
        _structure_diff(t0, t1, (), fn_label, lines)
        lines = ["tree structure changed: " + line for line in lines]
        return lines or ["tree structure changed"]
    paths = leaf_paths(t1, fn_label)
    before = _leaf_descriptions(m0, s0, a0)
    after = _leaf_descriptions(m1, s1, a1)
    lines = []
    for path, x, y in zip(paths, before, after, strict=True):
        change = _leaf_change(x, y)
        if change is not None:
            lines.append(f"{path}: {change}")
    return lines or [
        "no argument changed (JAX dropped its cache, e.g. after jax.clear_caches() or a change "
        "of jax.config)"
    ]
