"""Equinox's `inference_mode` (and the older `tree_inference`): treemod's, which already matches."""

from __future__ import annotations

from typing import TypeVar

from treemod.nn import inference_mode

__all__ = ["inference_mode", "tree_inference"]

_T = TypeVar("_T")


def tree_inference(pytree: _T, value: bool) -> _T:
    """Equinox's older name for `inference_mode(pytree, value)`.

    Arguments:
        pytree: a model or any pytree of modules.
        value: `True` for inference, `False` for training.

    Returns:
        A copy with every `inference` field set to `value`.

    Example:
        >>> import treemod.compat.equinox as eqx
        >>> eqx.tree_inference(eqx.nn.Dropout(0.5), True).inference
        True
    """
    return inference_mode(pytree, value)
