"""Equinox's view of a tree for its checkpoint format: one slot per leaf, in file order.

The file holds the tree's leaves depth first, with the layers that have an Equinox layout
(`_layouts.py`) replaced by Equinox's fields. treemod keeps state (`treemod.State` nodes:
BatchNorm's statistics, SpectralNorm's vectors) inside the model; Equinox keeps it in a separate
`State` and saves the pair `(model, state)`. A tree holding state is therefore written as
Equinox writes `(model, state)` made by `equinox.nn.make_with_state`: the model's leaves, then
the state's values in the order of the model's state indices. A tree without state is written
as the tree itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.tree_util as jtu

from treemod import State

from ._layouts import equinox_fields, from_equinox_fields, has_layout

__all__ = ["Slot", "plan"]


class Slot:
    """One leaf of the file: where it is, the leaf of the tree, how to read or write it, and
    (while loading) the value read."""

    __slots__ = ("path", "leaf", "spec", "owner", "value")

    def __init__(self, path: jtu.KeyPath[Any], leaf: Any, spec: Any, owner: str | None) -> None:
        self.path, self.leaf, self.spec, self.owner, self.value = path, leaf, spec, owner, leaf

    def get(self) -> Any:
        return self.value

    def where(self) -> str:
        """The key path, and the layer whose Equinox layout holds the leaf, if any."""
        where = jtu.keystr(self.path) or "(root)"
        if self.owner:
            where += f" (in Equinox's layout of {self.owner})"
        return where


def _view(
    node: Any,
    path: jtu.KeyPath[Any],
    spec: Any,
    is_leaf: Any,
    model: list[Slot],
    state: list[Slot],
    owner: str | None = None,
) -> Callable[[], Any]:
    """Append `node`'s slots (Equinox's order) and return a function rebuilding `node`."""
    if is_leaf is not None and is_leaf(node):
        slot = Slot(path, node, spec, owner)
        model.append(slot)
        return slot.get
    if isinstance(node, State):
        slots: list[Slot] = []
        value_path = (*path, jtu.GetAttrKey("value"))
        inner = _view(node.value, value_path, spec, is_leaf, slots, slots, owner)
        state.extend(slots)
        return lambda: State(inner())
    if has_layout(node):
        fields = equinox_fields(node)
        name = type(node).__name__
        parts = [
            (k, _view(v, (*path, jtu.GetAttrKey(k)), spec, is_leaf, model, state, name))
            for k, v in fields.items()
        ]
        return lambda: from_equinox_fields(node, {k: build() for k, build in parts})

    def stop(x: Any) -> bool:
        return x is not node and (
            isinstance(x, State) or has_layout(x) or (is_leaf is not None and is_leaf(x))
        )

    pairs, treedef = jtu.tree_flatten_with_path(node, is_leaf=stop)
    builders = []
    for p, x in pairs:
        where = (*path, *p)
        if x is not node and (isinstance(x, State) or has_layout(x)):
            builders.append(_view(x, where, spec, is_leaf, model, state, owner))
        else:
            slot = Slot(where, x, spec, owner)
            model.append(slot)
            builders.append(slot.get)
    return lambda: jtu.tree_unflatten(treedef, [b() for b in builders])


def plan(tree: Any, filter_spec: Any, is_leaf: Any) -> tuple[list[Slot], Callable[[], Any]]:
    """All slots of `tree` in file order (model, then state) and the tree's rebuilder."""
    spec_pairs, spec_def_ = jtu.tree_flatten_with_path(filter_spec)
    spec_def: Any = spec_def_
    try:
        subtrees = spec_def.flatten_up_to(tree)
    except (ValueError, TypeError) as e:
        raise ValueError(
            "filter_spec must be a function, or a tree of functions whose structure is a prefix "
            f"of the tree's: {e}"
        ) from None
    model: list[Slot] = []
    state: list[Slot] = []
    builders = [
        _view(sub, tuple(p), spec, is_leaf, model, state)
        for (p, spec), sub in zip(spec_pairs, subtrees, strict=True)
    ]
    return model + state, lambda: jtu.tree_unflatten(spec_def, [b() for b in builders])
