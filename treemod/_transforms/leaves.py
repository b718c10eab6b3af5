"""Splitting a call's array leaves from its static leaves, and packing outputs.

The filtered transforms split the leaves of `(fn, args, kwargs)` into arrays (traced) and
everything else (static); `split_tree` is that one mechanism, and `Split.rebuild` undoes it.
Outputs that hold non-array leaves travel through JAX as `Packed` stand-ins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.tree_util as jtu

from treemod._tree.filters import IS_ARRAY_TYPE


def is_abstract_array(x: Any) -> bool:
    """Whether `x` is an array or a `jax.ShapeDtypeStruct` standing for one."""
    return IS_ARRAY_TYPE[type(x)] or isinstance(x, jax.ShapeDtypeStruct)


def merge_leaves(mask: Sequence[bool], dynamic: Iterable[Any], static: Iterable[Any]) -> list[Any]:
    """Interleave dynamic and static leaves back into one list, following `mask`."""
    dyn, sta = iter(dynamic), iter(static)
    return [next(dyn) if m else next(sta) for m in mask]


def split_leaves(leaves: Iterable[Any], mask: Sequence[bool]) -> tuple[list[Any], list[Any]]:
    """The leaves where `mask` is true, and the others; `merge_leaves` undoes it."""
    kept: list[Any] = []
    others: list[Any] = []
    for x, m in zip(leaves, mask, strict=True):
        (kept if m else others).append(x)
    return kept, others


def _is_array_leaf(x: Any) -> bool:
    return IS_ARRAY_TYPE[type(x)]


def split_tree(
    tree: Any,
    keep: Callable[[Any], bool] = _is_array_leaf,
    is_leaf: Callable[..., Any] | None = None,
) -> tuple[list[Any], Split]:
    """The leaves of `tree` that `keep` selects (arrays by default), and the `Split` holding the
    rest, which rebuilds the tree from new kept leaves: the filtered transforms' one mechanism."""
    leaves, treedef = jtu.tree_flatten(tree, is_leaf=is_leaf)
    mask = tuple(keep(x) for x in leaves)
    kept, others = split_leaves(leaves, mask)
    return kept, Split(treedef, mask, tuple(others))


class Split:
    """A pytree with its kept leaves taken out (see `split_tree`); compared and hashed by identity.

    Attributes:
        treedef: the tree's structure.
        mask: for each leaf, whether it was kept.
        static: the other leaves, in order.
    """

    __slots__ = ("treedef", "mask", "static")

    def __init__(self, treedef: Any, mask: tuple[bool, ...], static: tuple[Any, ...]) -> None:
        self.treedef = treedef
        self.mask = mask
        self.static = static

    def rebuild(self, kept: Iterable[Any], *, static_as_none: bool = False) -> Any:
        """The tree with `kept` in place of the kept leaves, and its other leaves (or `None`
        in their place, as in a tangent or a shape description)."""
        static = [None] * len(self.static) if static_as_none else self.static
        return self.treedef.unflatten(merge_leaves(self.mask, kept, static))


class Packed:
    """A traced function's output with its non-array leaves moved into the tree structure.

    Its unflatten rebuilds the caller's output directly, so `jax.eval_shape` or
    `jax.checkpoint` hands back the user's tree with no further Python in the wrapper.
    """

    __slots__ = ("arrays", "plan")

    def __init__(self, arrays: list[Any], plan: Split) -> None:
        self.arrays = arrays
        self.plan = plan


class HeldPacked(Packed):
    """A `Packed` that stays packed through unflatten, for compiled calls: JAX's C++ dispatch
    only takes outputs whose leaves are all arrays, and one float or function leaf sends every
    call down its Python path (about ten times slower). `unpack_output` rebuilds the tree after
    the call."""

    __slots__ = ()


def _flatten_packed(p: Packed) -> tuple[list[Any], Split]:
    return p.arrays, p.plan


jtu.register_pytree_node(Packed, _flatten_packed, lambda plan, arrays: plan.rebuild(arrays))


jtu.register_pytree_node(HeldPacked, _flatten_packed, lambda plan, a: HeldPacked(list(a), plan))


def pack_output(out: Any, *, held: bool = False) -> Any:
    """Return `out` unchanged if all its leaves are arrays, else a `Packed` (or, if `held`, a
    `HeldPacked`) stand-in for it."""
    arrays, plan = split_tree(out)
    if all(plan.mask):
        return out
    return HeldPacked(arrays, plan) if held else Packed(arrays, plan)


def unpack_output(out: Any) -> Any:
    """The caller's output from what a compiled call returned (see `HeldPacked`)."""
    return out.plan.rebuild(out.arrays) if type(out) is HeldPacked else out
