"""`Shared`: tie parts of a tree together (one stored copy, used in several places)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from treemod._format.describe import describe_value
from treemod._module.module import Module, field
from treemod._transforms.eval_shape import filter_eval_shape
from treemod._tree.tree_at import tree_at
from treemod._tree.tree_equal import tree_equal

__all__ = ["Shared"]


class Shared(Module):
    """Tie nodes of a tree together, as Equinox's `nn.Shared`: one copy stored and trained.

    A module tree is a tree: the same layer placed in two fields is two independent copies
    that drift apart in training. `Shared(pytree, where, get)` removes the nodes that
    `where(pytree)` selects (stored as `None`) and, when called, puts `get(pytree)` back in
    their place, so gradients from both uses reach the one stored copy. The typical use is
    tying a language model's output layer to its input embedding. `get` may transform what
    it returns (e.g. transpose a matrix), as long as the result matches `where`'s nodes in
    structure, shape and dtype.

    Arguments:
        pytree: the tree holding both the source and the nodes to replace.
        where: selects the node(s) to replace, as in `treemod.tree_at`.
        get: returns their replacement(s) from the tree.

    Returns (when called):
        `pytree` with `get(pytree)` in the place of `where(pytree)`.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> k1, k2 = jax.random.split(jax.random.key(0))
        >>> embed, head = nn.Embedding(10, 4, key=k1), nn.Linear(4, 10, key=k2)
        >>> shared = nn.Shared((embed, head), lambda p: p[1].weight, lambda p: p[0].weight)
        >>> embed, head = shared()
        >>> head.weight is embed.weight
        True
    """

    pytree: Any
    where: Callable[[Any], Any] = field(static=True)
    get: Callable[[Any], Any] = field(static=True)

    def __init__(self, pytree: Any, where: Callable[[Any], Any], get: Callable[[Any], Any]):
        source = filter_eval_shape(get, pytree)
        dest = filter_eval_shape(where, pytree)
        if tree_equal(source, dest) is not True:
            raise ValueError(
                "Shared: Every node being shared together must have the same tree structure, "
                "shapes and dtypes: what `get` returns must match what `where` selects; got\n"
                f"  get:   {_describe(source)}\n  where: {_describe(dest)}"
            )
        self.pytree = tree_at(where, pytree, replace_fn=lambda _: None)
        self.where = where
        self.get = get

    def __call__(self) -> Any:
        """The tree with the shared nodes filled in.

        Returns:
            `pytree` as given, with `get(pytree)` in the place of `where(pytree)`.
        """
        return tree_at(self.where, self.pytree, self.get(self.pytree), is_leaf=_is_none)


def _is_none(x: Any) -> bool:
    return x is None


def _describe(tree: Any) -> str:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return f"{treedef} with leaves [{', '.join(map(describe_value, leaves))}]"
