"""Equinox's `tree_equal` result types and `tree_at`'s ambiguity check, for the compat namespace.

treemod's own `tree_equal` answers with a Python `bool` outside transforms; Equinox's answers
with a JAX boolean scalar whenever JAX arrays were compared. Programs written for Equinox may
rely on that (`isinstance(result, jax.Array)`, `result is True` only when static), so
`treemod.compat.equinox.tree_equal` gives Equinox's types; the comparison itself is treemod's.

treemod's `tree_at` tells nodes apart by position, so it can replace the first of two `None`s;
Equinox tells them apart by identity and refuses a `where` that selects a `None` when the
tree has several, unless `is_leaf` makes each one a leaf. Code written for Equinox may expect
that error, so the compat `tree_at` gives it, then runs treemod's. Equinox's `tree_at` does not
check the rebuilt modules' annotations, and Equinox code edits models whose arrays carry extra
leading axes (ensembles built with `filter_vmap`, `MLP(scan=True)`'s stacked hidden layer), so
the compat `tree_at` runs with shape checks off. treemod's `tree_at` refuses a `where` that
selects one node twice with two different replacements; Equinox's lets the last one win (and
applies `replace_fn` once), so the compat `tree_at` keeps each node's last selection before
running treemod's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.tree_util as jtu

from treemod import shape_checks
from treemod import tree_at as _tree_at
from treemod._compat_api import NotANodeError, WhereComputedError, compare_trees

from ._errors import EquinoxNotANodeError, EquinoxWhereComputedError

__all__ = ["tree_at", "tree_equal"]

_UNSET: Any = object()


def tree_equal(*pytrees: Any, typematch: bool = False, rtol: Any = 0.0, atol: Any = 0.0) -> Any:
    """Whether all `pytrees` are equal, with Equinox's result types.

    Arguments:
        *pytrees: the trees to compare.
        typematch: also require leaves to have the same type.
        rtol: relative tolerance for array values.
        atol: absolute tolerance for array values.

    Returns:
        `False` when structures, types, shapes, dtypes or non-array leaves differ; a JAX
        boolean scalar when JAX arrays were compared; else a Python `bool`.

    Example:
        >>> import jax.numpy as jnp, numpy as np
        >>> import treemod.compat.equinox as eqx
        >>> eqx.tree_equal(jnp.ones(2), jnp.ones(2))
        Array(True, dtype=bool)
        >>> eqx.tree_equal(np.ones(2), np.ones(2)), eqx.tree_equal(jnp.ones(2), jnp.ones(3))
        (True, False)
    """
    return compare_trees(pytrees, typematch, rtol, atol, jax_scalars=True)


def tree_at(
    where: Callable[[Any], Any],
    pytree: Any,
    replace: Any = _UNSET,
    replace_fn: Any = _UNSET,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """`treemod.tree_at`, refusing as Equinox does to select one of several `None`s.

    As Equinox's, it does not shape-check the modules it rebuilds (an ensemble's `Linear` holds
    weights of shape `(n, out, in)`).

    Arguments:
        where: a function from the tree to one of its nodes, or to a tuple/list of nodes.
        pytree: the tree to copy.
        replace: the new value (a sequence of values, one per node, if `where` returns several).
        replace_fn: instead of `replace`, a function from the old node to the new one.
        is_leaf: as in `jax.tree_util`: subtrees it accepts are not looked into.

    Returns:
        The changed copy.

    Example:
        >>> import treemod.compat.equinox as eqx
        >>> try:
        ...     eqx.tree_at(lambda t: t[0], (None, None, 1), True)
        ... except ValueError as e:
        ...     print(str(e)[:58])
        tree_at: `where` selected None, which is at 2 places ([0],
        >>> eqx.tree_at(lambda t: t[0], (None, None, 1), True, is_leaf=lambda x: x is None)
        (True, None, 1)
    """
    _refuse_repeated_nodes(where, pytree, is_leaf)
    given = {"replace": replace, "replace_fn": replace_fn}
    given = {k: v for k, v in given.items() if v is not _UNSET}
    try:
        with shape_checks(False):
            try:
                return _tree_at(_refuse_repeats(where), pytree, is_leaf=is_leaf, **given)
            except _Repeated as repeated:  # keep each node's last selection, as Equinox does
                kept = repeated.kept
                if isinstance(replace, Sequence) and len(replace) == repeated.count:
                    given["replace"] = [replace[i] for i in kept]
                return _tree_at(_items(where, kept), pytree, is_leaf=is_leaf, **given)
    except WhereComputedError as e:  # Equinox's types for these (theirs and treemod's)
        raise EquinoxWhereComputedError(*e.args).with_traceback(e.__traceback__) from None
    except NotANodeError as e:
        raise EquinoxNotANodeError(*e.args).with_traceback(e.__traceback__) from None


class _Repeated(Exception):  # noqa: N818 - a signal within `tree_at`, never raised to users
    """`where` selected a node more than once; `kept`: the items that are its last selections."""

    def __init__(self, kept: list[int], count: int) -> None:
        super().__init__(kept, count)
        self.kept = kept
        self.count = count  # the number of items selected


def _refuse_repeats(where: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`where`, raising `_Repeated` when it selects one node more than once.

    treemod's `tree_at` calls `where` on a copy of the tree in which each node is its own
    object, so identity tells positions apart (a repeated `1` in the tree is two nodes).
    """

    def checked(tree: Any) -> Any:
        selected = where(tree)
        if isinstance(selected, tuple | list):
            ids = [id(node) for node in selected]
            if len(set(ids)) < len(ids):
                kept = [i for i, n in enumerate(ids) if n not in ids[i + 1 :]]
                raise _Repeated(kept, len(ids))
        return selected

    return checked


def _items(where: Callable[[Any], Any], kept: list[int]) -> Callable[[Any], Any]:
    """`where`, keeping only the items `kept` of its selection."""
    return lambda tree: [where(tree)[i] for i in kept]


def _none_places(pytree: Any, is_leaf: Callable[[Any], bool] | None) -> list[str]:
    """The key paths of the `None`s in `pytree` that `is_leaf` does not make leaves."""

    def stop(x: Any) -> bool:
        return x is None or (is_leaf is not None and bool(is_leaf(x)))

    flat, _ = jtu.tree_flatten_with_path(pytree, is_leaf=stop)
    return [jtu.keystr(path) or "(root)" for path, x in flat if x is None]


def _is_node(pytree: Any, node: Any) -> bool:
    """Whether the object `node` itself is a subtree of `pytree`."""
    return any(x is node for x in jtu.tree_leaves(pytree, is_leaf=lambda x: x is node))


def _refuse_repeated_nodes(
    where: Callable[[Any], Any], pytree: Any, is_leaf: Callable[[Any], bool] | None
) -> None:
    # Equinox rebuilds the tree around its leaves before calling `where`, so every node is a
    # new object except `None`, a singleton: selecting a `None` is refused when there are
    # several, unless `is_leaf` takes it (then it is wrapped like any leaf).
    if is_leaf is not None and is_leaf(None):
        return
    try:
        selected = where(pytree)
    except Exception:  # noqa: BLE001 - treemod's `tree_at` explains what `where` did wrong
        return
    if selected is None or (
        isinstance(selected, tuple | list)
        and any(node is None for node in selected)
        and not _is_node(pytree, selected)  # a list in the tree is one node, not a selection
    ):
        places = _none_places(pytree, is_leaf)
        if len(places) > 1:
            raise ValueError(
                f"tree_at: `where` selected None, which is at {len(places)} places "
                f"({', '.join(places)}), so (as in Equinox) it does not say which one to "
                "replace. Pass `is_leaf=lambda x: x is None` so that each `None` is a leaf of "
                "its own, or use `treemod.tree_at`, which replaces by position."
            )
