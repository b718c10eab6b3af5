"""Per-layer-type hooks that name a layer's tensors the way PyTorch does.

A hook pair is registered per class (and found along the MRO, so subclasses share it):

- `to_torch(layer) -> Mapping[str, Any]`: the layer's entries under its prefix, each an array
  (a tensor, named `prefix.key`) or a sub-tree (named `prefix.key.<its own names>` by the
  general rule and by its own hooks). It must be a pure function of the layer's arrays: it also
  runs on abstract layers under `filter_eval_shape`, to learn the names and shapes cheaply.
- `from_torch(layer, entries) -> layer`: the layer rebuilt from the same keys, with each array
  replaced by the loaded one and each sub-tree by the loaded sub-tree.

The native layers' hooks are in `layers.py` (`NATIVE_HOOKS`); a user's own layer declares its
pair with `register_state_dict_hooks`, which takes precedence over the native table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["StateDictHooks", "find_hooks", "register_state_dict_hooks"]

_L = TypeVar("_L")


@dataclasses.dataclass(frozen=True)
class StateDictHooks(Generic[_L]):
    """A layer type's two-way mapping to PyTorch's names (see the module docstring)."""

    to_torch: Callable[[_L], Mapping[str, Any]]
    from_torch: Callable[[_L, Mapping[str, Any]], _L]


# Filled only by explicit calls of `register_state_dict_hooks` (a user's own layers).
_USER_HOOKS: dict[type, StateDictHooks[Any]] = {}


def register_state_dict_hooks(
    cls: type[_L],
    *,
    to_torch: Callable[[_L], Mapping[str, Any]],
    from_torch: Callable[[_L, Mapping[str, Any]], _L],
) -> None:
    """Declare how a layer class of your own maps to PyTorch's tensor names.

    Without hooks, `treemod.state_dict` names a layer's arrays by the general rule (fields by
    name, list and tuple items by index, dict entries by key). Hooks replace the rule for one
    class (and its subclasses) where the PyTorch twin stores its tensors differently.

    Arguments:
        cls: the layer class (a `treemod.Module` subclass, or any pytree node type).
        to_torch: `layer -> {key: entry}`; each entry is an array (the tensor `prefix.key`) or
            a sub-tree (named below `prefix.key` by the general rule). It must be a pure
            function of the layer's arrays (no NumPy conversions): it also runs on abstract
            layers to learn the names and shapes.
        from_torch: `(layer, {key: loaded entry}) -> layer`: the layer rebuilt from the same
            keys, with arrays (JAX arrays in the layer's dtypes) and sub-trees loaded. Raise
            `treemod.CheckpointError` for values it cannot take; the message is prefixed
            with the layer's name.

    Returns:
        None. Registering a class again replaces its hooks.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np, treemod as tm
        >>> class Scale(tm.Module):          # PyTorch's twin stores `log_scale`
        ...     scale: jax.Array
        ...     def __call__(self, x):
        ...         return x * self.scale
        >>> tm.register_state_dict_hooks(
        ...     Scale,
        ...     to_torch=lambda m: {"log_scale": jnp.log(m.scale)},
        ...     from_torch=lambda m, t: tm.tree_at(lambda m: m.scale, m, jnp.exp(t["log_scale"])),
        ... )
        >>> sorted(tm.state_dict({"norm": Scale(jnp.ones(3))}))
        ['norm.log_scale']
    """
    if not isinstance(cls, type):
        raise TypeError(
            f"register_state_dict_hooks: `cls` must be a class, got {type(cls).__name__}."
        )
    for name, fn in (("to_torch", to_torch), ("from_torch", from_torch)):
        if not callable(fn):
            raise TypeError(
                f"register_state_dict_hooks({cls.__name__}): `{name}` must be callable, got "
                f"{type(fn).__name__}."
            )
    _USER_HOOKS[cls] = StateDictHooks(to_torch, from_torch)


def find_hooks(cls: type, native: Mapping[type, StateDictHooks[Any]]) -> StateDictHooks[Any] | None:
    """The hooks of `cls`: the nearest class along its MRO with a user's or a native pair (a
    user's pair wins at the same class)."""
    for base in cls.__mro__:
        hooks = _USER_HOOKS.get(base) or native.get(base)
        if hooks is not None:
            return hooks
    return None
