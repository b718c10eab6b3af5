"""`tree_flatten_one_level` and `tree_check`: a node's children, and well-formed pytrees."""

from __future__ import annotations

from typing import Any

import jax.tree_util as jtu

__all__ = ["tree_check", "tree_flatten_one_level"]

_LEAF = jtu.tree_structure(0)


def tree_flatten_one_level(pytree: Any) -> tuple[list[Any], Any]:
    """The immediate children of a pytree node (a leaf gives itself).

    Arguments:
        pytree: any pytree.

    Returns:
        As `jax.tree_util.tree_flatten`: the children as a list, and the treedef that
        `jax.tree_util.tree_unflatten` rebuilds the node from.

    Raises:
        ValueError: the node holds itself as a child (`x = []; x.append(x)`).

    Example:
        >>> import treemod as tm
        >>> tm.tree_flatten_one_level({"a": 3, "b": (1, 2)})[0]
        [3, (1, 2)]
        >>> tm.tree_flatten_one_level(4)[0]
        [4]
    """
    root_seen = holds_itself = False

    # Refused after the flattening, not raised from inside `is_leaf`: an exception raised
    # through jaxlib's C++ flattening leaks Python's recursion budget, one level per enclosing
    # node (jaxlib 0.10.2), so every such error would bring a later RecursionError closer.
    def is_leaf(node: Any) -> bool:
        nonlocal root_seen, holds_itself
        if node is not pytree:
            return True
        if root_seen:
            holds_itself = True
            return True
        root_seen = True
        return False

    flat = jtu.tree_flatten(pytree, is_leaf=is_leaf)
    if holds_itself:
        raise ValueError(
            f"tree_flatten_one_level: a {type(pytree).__name__} node holds itself as an "
            "immediate child; a pytree cannot contain itself. Remove the self-reference."
        )
    return flat


def tree_check(pytree: Any) -> None:
    """Check that no pytree node contains itself and no inner node appears twice.

    JAX's transforms copy a tree by flattening and unflattening it, so a node that appears at
    two places (`[layer, layer]` with the same module object) becomes two independent copies
    after `jit` or `grad`: parameters meant to be shared silently stop being shared. Leaves
    (and empty nodes such as `[]`, `None` or a module without fields) may repeat.

    Arguments:
        pytree: the tree to check.

    Returns:
        Nothing.

    Raises:
        ValueError: naming the node's type and the key paths of both places, or the path at
            which a node contains itself.

    Example:
        >>> import treemod as tm
        >>> shared = [1.0]
        >>> tm.tree_check([[1.0], [1.0]])  # equal, but distinct objects: fine
        >>> tm.tree_check([shared, shared])
        Traceback (most recent call last):
        ValueError: tree_check: the same list object appears at [0] and at [1]; ...
    """
    first_path: dict[int, str] = {}
    on_stack: set[int] = set()
    # Depth-first, without recursion (deep trees would hit Python's recursion limit).
    stack: list[tuple[Any, str, bool]] = [(pytree, "", False)]
    while stack:
        node, path, leaving = stack.pop()
        if leaving:
            on_stack.discard(id(node))
            continue
        try:
            _, treedef = tree_flatten_one_level(node)
        except ValueError:
            raise ValueError(
                f"tree_check: the {type(node).__name__} at {path or '(root)'} contains itself "
                "as an immediate child; a pytree cannot contain itself. Remove the "
                "self-reference."
            ) from None
        if treedef == _LEAF or treedef.num_leaves == 0:
            continue
        key = id(node)
        if key in on_stack:
            raise ValueError(
                f"tree_check: the {type(node).__name__} at {path or '(root)'} contains itself "
                f"(it is also its own ancestor at {first_path[key] or '(root)'}); a pytree "
                "cannot contain itself. Remove the self-reference."
            )
        if key in first_path:
            raise ValueError(
                f"tree_check: the same {type(node).__name__} object appears at "
                f"{first_path[key] or '(root)'} and at {path or '(root)'}; JAX transforms "
                "would turn it into two independent copies. Build a separate object for each "
                "place, or share it explicitly (treemod.nn.Shared)."
            )
        first_path[key] = path
        on_stack.add(key)
        stack.append((node, path, True))
        keyed, _ = jtu.tree_flatten_with_path(node, is_leaf=lambda x, node=node: x is not node)
        for child_path, child in reversed(keyed):
            stack.append((child, path + jtu.keystr(child_path), False))
