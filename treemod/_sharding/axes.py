"""Logical axis names of weights: the per-class record (`axis_names`) and its reading.

A class declares, once, what each dimension of its array fields is (`"embed"`, `"mlp"`, ...)
with the `axis_names` class decorator. The record is keyed by the class and read along the
MRO, so subclasses inherit it. A parent may name the arrays of its children by relative path
(`{"up.weight": ("mlp", "embed")}`): the outermost declaration of an array wins, so a model
overrides its layers' defaults. A class whose arrays carry extra leading axes below it (a
`Stack`'s layer axis) gives them as `leading=`; they are prepended to every name below it.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import jax
import jax.tree_util as jtu
import numpy as np

from treemod._tree.module_info import is_module

__all__ = ["AxisNames", "axis_names", "is_shaped", "logical_axes", "named_leaves"]

AxisNames = tuple[str | None, ...]
Declared = Mapping[str, AxisNames | None]
T = TypeVar("T", bound=type)


@dataclasses.dataclass(frozen=True)
class _Record:
    names: Declared | Callable[[Any], Declared]
    leading: AxisNames


# Keyed weakly by class: a record lives exactly as long as the class it describes.
_RECORDS: weakref.WeakKeyDictionary[type, _Record] = weakref.WeakKeyDictionary()


def axis_names(
    names: Declared | Callable[[Any], Declared] | None = None, *, leading: AxisNames = ()
) -> Callable[[T], T]:
    """Class decorator: declare the logical axis names of a module class's arrays.

    Arguments:
        names: `{relative path: names}`, one name (or `None`) per dimension, leading
            dimensions first (missing trailing ones are unnamed); a path is a field name or a
            dotted path into a child (`"proj.weight"`, `"layers.0.weight"`). Or a function of
            the instance returning such a mapping, for names that depend on its configuration.
        leading: names of extra leading axes of every array below an instance (`nn.Stack`'s
            layer axis), prepended to the names declared below.

    Returns:
        The decorator; it returns the class unchanged, with its record stored.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> @tm.axis_names({"table": ("vocab", "embed")})
        ... class Table(tm.Module):
        ...     table: jax.Array
        >>> tm.logical_axes(Table(jnp.zeros((8, 4)))).table
        ('vocab', 'embed')
    """

    def declare(cls: T) -> T:
        if not isinstance(cls, type):
            raise TypeError(f"axis_names(...) decorates a Module class; got {cls!r}.")
        _RECORDS[cls] = _Record({} if names is None else names, tuple(leading))
        return cls

    return declare


def _record(cls: type) -> _Record | None:
    for klass in cls.__mro__:
        found = _RECORDS.get(klass)
        if found is not None:
            return found
    return None


def is_shaped(x: Any) -> bool:
    """Whether `x` is an array or an abstract one (`jax.ShapeDtypeStruct`)."""
    return isinstance(x, jax.Array | np.ndarray | jax.ShapeDtypeStruct)


def _key_name(key: Any) -> str:
    for attr in ("name", "idx", "key"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def named_leaves(tree: Any) -> tuple[list[tuple[str, Any, AxisNames]], Any]:
    """Every leaf of `tree` with its dotted path and the axis names declared for it.

    Arguments:
        tree: a model (or any pytree).

    Returns:
        `([(path, leaf, names)], treedef)`, in `jax.tree_util.tree_leaves` order; `names` is
        `()` for leaves nothing declares (and for non-array leaves).
    """
    out: list[tuple[str, Any, AxisNames]] = []

    # (depth, declared mapping) of the modules above, outermost first; leading axes so far.
    def walk(
        node: Any, parts: tuple[str, ...], owners: list[tuple[int, Declared]], lead: AxisNames
    ) -> None:
        if is_module(node):
            record = _record(type(node))
            if record is not None:
                declared = record.names(node) if callable(record.names) else record.names
                owners = [*owners, (len(parts), declared)]
                lead = lead + record.leading
        children, _ = jtu.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
        if len(children) == 1 and children[0][0] == () and children[0][1] is node:
            out.append((".".join(parts), node, _names_for(parts, owners, lead, node)))
            return
        for path, child in children:
            walk(child, parts + tuple(_key_name(k) for k in path), owners, lead)

    walk(tree, (), [], ())
    return out, jtu.tree_structure(tree)


def _names_for(
    parts: tuple[str, ...], owners: list[tuple[int, Declared]], lead: AxisNames, leaf: Any
) -> AxisNames:
    if not is_shaped(leaf):
        return ()
    for depth, declared in owners:  # the outermost declaration wins
        relative = ".".join(parts[depth:])
        if relative in declared:
            names = declared[relative]
            return () if names is None else lead + tuple(names)
    return ()


def logical_axes(tree: Any) -> Any:
    """The declared logical axis names of each array of `tree`, in its structure.

    Arguments:
        tree: a model (or any pytree).

    Returns:
        `tree` with each array leaf replaced by its tuple of names (one per dimension, `None`
        for unnamed ones) and every other leaf by `None`.

    Example:
        >>> import jax, treemod as tm
        >>> tm.logical_axes(tm.nn.Embedding(10, 4, key=jax.random.key(0))).weight
        ('vocab', 'embed')
    """
    leaves, treedef = named_leaves(tree)
    return jtu.tree_unflatten(
        treedef,
        [
            (names + (None,) * (leaf.ndim - len(names)))[: max(leaf.ndim, len(names))]
            if is_shaped(leaf)
            else None
            for _, leaf, names in leaves
        ],
    )
