"""Explaining which static argument or static field of a transformed call is not hashable."""

from __future__ import annotations

from typing import Any

import jax.tree_util as jtu

from treemod._format.paths import function_name, render_path
from treemod._tree.filters import IS_ARRAY_TYPE
from treemod._tree.module_info import static_field_names


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def unhashable_error(
    transform: str, fn: Any, tree: Any, fn_label: str = "self"
) -> TypeError | None:
    """Explain which static leaf or static field of `(fn_tree, args, kwargs)` is unhashable."""
    name = function_name(fn)
    for path, leaf in jtu.tree_flatten_with_path(tree)[0]:
        if not IS_ARRAY_TYPE[type(leaf)] and not _hashable(leaf):
            where = render_path(path, fn_label)
            return TypeError(
                f"{transform}({name}): the argument {where} is a {type(leaf).__name__}, which is "
                "not hashable. Non-array arguments are static: they are hashed to choose a "
                "compiled version. Make it hashable (a tuple, a frozen dataclass), pass it as "
                "an array, or close over it."
            )
    bad = _unhashable_node(tree, ())
    if bad is not None:
        path, node = bad
        fields = static_field_names(type(node))
        culprits = [f for f in fields if not _hashable(getattr(node, f, None))]
        what = (
            f"the static field {type(node).__qualname__}.{culprits[0]}"
            if culprits
            else f"the tree node {type(node).__qualname__}"
        )
        return TypeError(
            f"{transform}({name}): at {render_path(path, fn_label)}, {what} holds an unhashable "
            "value. Static fields are part of the tree structure and must be hashable; use a "
            "tuple instead of a list, or make the field a normal (non-static) field."
        )
    return None


def _unhashable_node(node: Any, path: tuple[Any, ...]) -> tuple[tuple[Any, ...], Any] | None:
    leaves, treedef = jtu.tree_flatten(node, is_leaf=lambda x: x is not node)
    if jtu.treedef_is_leaf(treedef):
        return None
    if not _hashable(treedef):
        # Look deeper first: the culprit is the innermost node whose structure does not hash.
        for child_path, child in jtu.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)[
            0
        ]:
            found = _unhashable_node(child, path + tuple(child_path))
            if found is not None:
                return found
        return path, node
    return None
