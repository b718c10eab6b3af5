"""`inference_mode`: switch every layer of a model between training and inference in one call."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import jax.tree_util as jtu

from treemod._module.module import Module

__all__ = ["inference_mode"]

_T = TypeVar("_T")


def _has_inference_field(node: Any) -> bool:
    return isinstance(node, Module) and any(f.name == "inference" for f in dataclasses.fields(node))


def _switch(node: Any, value: bool) -> Any:
    """`node` (a module with an `inference` field) with its subtrees switched and its flag set."""
    children, treedef = jtu.tree_flatten(node, is_leaf=lambda x: x is not node)
    children = [_switch_tree(c, value) for c in children]
    new = jtu.tree_unflatten(treedef, children)
    if new.inference is not value:
        # Copy without calling `__init__` (as unflattening does), with the one field changed.
        copy = object.__new__(type(new))
        copy.__dict__.update(new.__dict__)
        copy.__dict__["inference"] = value
        new = copy
    return new


def _switch_tree(tree: _T, value: bool) -> _T:
    # Each module is replaced by a copy of its own type: the tree keeps its type.
    switched: _T = jtu.tree_map(
        lambda x: _switch(x, value) if _has_inference_field(x) else x,
        tree,
        is_leaf=_has_inference_field,
    )
    return switched


def inference_mode(model: _T, value: bool = True) -> _T:
    """Switch every layer of `model` that has an `inference` field to inference (or training).

    In inference mode `BatchNorm` normalises with its running statistics (so an example gives
    the same output alone as inside a batch, and no state is updated) and `Dropout` stops
    dropping. The model is not changed; a copy is returned. Works on any pytree of modules,
    including user-defined layers with an `inference: bool` field (static or not).

    Arguments:
        model: a model, or any pytree containing modules.
        value: `True` for inference, `False` to switch back to training.

    Returns:
        A copy of `model` with every `inference` field set to `value`.

    Example:
        >>> import jax, treemod as tm
        >>> model = [tm.nn.BatchNorm(3), {"norm": tm.nn.BatchNorm(3)}]
        >>> evaluation = tm.nn.inference_mode(model)
        >>> first, rest = evaluation
        >>> first.inference, rest["norm"].inference
        (True, True)
        >>> tm.nn.inference_mode(evaluation, False)[0].inference
        False
    """
    if not isinstance(value, bool):
        raise TypeError(f"inference_mode: value must be True or False, got {value!r}.")
    return _switch_tree(model, value)
