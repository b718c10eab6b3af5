"""The general rule: a model's attribute paths as PyTorch's dotted names, and back.

Fields are named by their attribute name, list and tuple items by index, dict entries by key;
a `State` adds no name of its own (its value takes the field's name); `None` and non-array
leaves (flags, functions) produce no name. A node whose type has hooks (`hooks.py`) is named by
its `to_torch` instead, and rebuilt by its `from_torch`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np

from treemod._module.state import State
from treemod._saving.errors import CheckpointError
from treemod._transforms.eval_shape import filter_eval_shape

from .hooks import StateDictHooks, find_hooks

__all__ = [
    "children",
    "entries_of",
    "expected_tensors",
    "from_entries",
    "is_tensor",
    "join",
    "name_tensors",
    "rebuild",
]

Natives = Mapping[type, StateDictHooks[Any]]


def is_tensor(x: Any) -> bool:
    """An array, or an abstract one (`jax.ShapeDtypeStruct`): what becomes a named tensor."""
    return isinstance(x, jax.Array | np.ndarray | jax.ShapeDtypeStruct)


def join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _key_name(key: Any) -> str:
    if isinstance(key, jtu.GetAttrKey):
        return str(key.name)
    if isinstance(key, jtu.SequenceKey):
        return str(key.idx)
    if isinstance(key, jtu.DictKey):
        return str(key.key)
    if isinstance(key, jtu.FlattenedIndexKey):
        return str(key.key)
    return str(key)


def _one_level(node: Any) -> tuple[list[tuple[str, Any]], Any]:
    """The node's children with their names, and its treedef (to rebuild it)."""
    pairs, treedef = jtu.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    return [(_key_name(path[0]), child) for path, child in pairs], treedef


def children(node: Any) -> dict[str, Any]:
    """The general rule's entries of one node (fields, items or dict entries by name)."""
    return dict(_one_level(node)[0])


def _hook_error(prefix: str, node: Any, error: CheckpointError) -> CheckpointError:
    where = repr(prefix) if prefix else "the model's root"
    return CheckpointError(f"{type(node).__name__} at {where}: {error}")


def name_tensors(node: Any, natives: Natives, prefix: str = "") -> dict[str, Any]:
    """Every tensor of `node` by its PyTorch name (arrays as they are; hooks run concretely)."""
    out: dict[str, Any] = {}
    _name_into(node, natives, prefix, out)
    return out


def _name_into(node: Any, natives: Natives, prefix: str, out: dict[str, Any]) -> None:
    if is_tensor(node):
        if not prefix:
            raise ValueError("state_dict: the model is a bare array; it has no name to give.")
        if prefix in out:
            raise ValueError(
                f"state_dict: two tensors of the model are named {prefix!r} (a dict key or a "
                "hook's entry repeats another name); rename one of them."
            )
        out[prefix] = node
        return
    if isinstance(node, State):
        _name_into(node.value, natives, prefix, out)
        return
    hooks = find_hooks(type(node), natives)
    if hooks is not None:
        try:
            entries = hooks.to_torch(node)
        except CheckpointError as e:
            raise _hook_error(prefix, node, e) from None
        for key, child in entries.items():
            _name_into(child, natives, join(prefix, key), out)
        return
    if _is_leaf(node):
        return
    for key, child in _one_level(node)[0]:
        _name_into(child, natives, join(prefix, key), out)


def _is_leaf(node: Any) -> bool:
    """A leaf that is not a tensor (None, a flag, a function): it has no name."""
    if node is None:
        return True
    leaves = jtu.tree_leaves(node, is_leaf=lambda x: x is not node)
    return len(leaves) == 1 and leaves[0] is node


def rebuild(node: Any, values: Mapping[str, Any], natives: Natives, prefix: str = "") -> Any:
    """`node` with each tensor replaced by `values[its name]` (hooks' `from_torch` rebuild the
    nodes they name). Hooked nodes' entries are learnt abstractly (`filter_eval_shape`), so a
    hook that slices or packs arrays runs once, on the loaded values only."""
    if is_tensor(node):
        return values[prefix]
    if isinstance(node, State):
        return State(rebuild(node.value, values, natives, prefix))
    hooks = find_hooks(type(node), natives)
    if hooks is not None:
        entries = _abstract_entries(hooks.to_torch, node, prefix)
        loaded = {
            key: rebuild(child, values, natives, join(prefix, key))
            for key, child in entries.items()
        }
        try:
            return hooks.from_torch(node, loaded)
        except CheckpointError as e:
            raise _hook_error(prefix, node, e) from None
    if _is_leaf(node):
        return node
    pairs, treedef = _one_level(node)
    new = [rebuild(child, values, natives, join(prefix, key)) for key, child in pairs]
    return jtu.tree_unflatten(treedef, new)


def _abstract_entries(to_torch: Callable[[Any], Mapping[str, Any]], node: Any, prefix: str) -> Any:
    try:
        return filter_eval_shape(lambda n: dict(to_torch(n)), node)
    except CheckpointError as e:
        raise _hook_error(prefix, node, e) from None


def entries_of(node: Any, natives: Natives) -> dict[str, Any]:
    """A node's entries: its hooks' `to_torch`, or the general rule's children."""
    hooks = find_hooks(type(node), natives)
    return dict(hooks.to_torch(node)) if hooks is not None else children(node)


def from_entries(node: Any, loaded: Mapping[str, Any], natives: Natives) -> Any:
    """The inverse of `entries_of`: `node` rebuilt from loaded entries under the same keys."""
    hooks = find_hooks(type(node), natives)
    if hooks is not None:
        return hooks.from_torch(node, loaded)
    pairs, treedef = _one_level(node)
    return jtu.tree_unflatten(treedef, [loaded[key] for key, _ in pairs])


def expected_tensors(model: Any, natives: Natives) -> dict[str, jax.ShapeDtypeStruct]:
    """Every tensor name of `model` with its shape and dtype, computed abstractly."""
    shapes: dict[str, jax.ShapeDtypeStruct] = filter_eval_shape(
        lambda m: name_tensors(m, natives), model
    )
    return shapes
