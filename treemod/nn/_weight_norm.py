"""`WeightNorm`: reparametrise a layer's weight as a direction times a learnt norm."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from treemod._module.module import Module, field
from treemod._tree.tree_at import tree_at

from ._utils import accepts_key

__all__ = ["WeightNorm"]

_Layer = TypeVar("_Layer")


def _norm_except(w: Array, axis: int | None) -> Array:
    """The 2-norm over every axis but `axis` (over all of them for `None`), keeping dims."""
    if axis is None:
        axes: tuple[int, ...] = tuple(range(w.ndim))
    else:
        axes = tuple(i for i in range(w.ndim) if i != axis % w.ndim)
    return jnp.sqrt(jnp.sum(jnp.square(w), axis=axes, keepdims=True))


class WeightNorm(Module, Generic[_Layer]):
    """Weight normalisation (Salimans & Kingma, 2016) of a wrapped layer, as Equinox's.

    The layer's weight `v` is used as `g * v / ||v||`, the norm taken over every axis except
    `axis` (output channels, for treemod's layers), so the direction and the length are
    learnt separately. `g` starts at `||v||`: the wrapped layer computes the same function as
    before. PyTorch's `nn.utils.parametrizations.weight_norm(layer, dim=axis)`.

    Arguments:
        layer: the layer to wrap (e.g. a `Linear` or a `Conv2d`).
        weight_name: the name of the layer's weight field.
        axis: the axis kept by the norm (`None`: one norm over the whole weight).

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> linear = nn.Linear(3, 2, key=jax.random.key(0))
        >>> wn = nn.WeightNorm(linear)
        >>> wn.g.shape
        (2, 1)
        >>> bool(jnp.allclose(wn(jnp.ones(3)), linear(jnp.ones(3))))
        True
    """

    layer: _Layer
    g: Array
    weight_name: str = field(static=True)
    axis: int | None = field(static=True)

    def __init__(self, layer: _Layer, weight_name: str = "weight", axis: int | None = 0) -> None:
        weight: Any = getattr(layer, weight_name, None)
        if not hasattr(weight, "ndim"):
            raise ValueError(
                f"WeightNorm: {type(layer).__name__} has no array field {weight_name!r} to "
                "normalise; pass `weight_name=` the name of its weight."
            )
        if axis is not None and (isinstance(axis, bool) or not isinstance(axis, int)):
            raise ValueError(
                f"WeightNorm: `axis` must be an int (the axis the norm keeps) or None; got "
                f"{axis!r}{' (a bool is not an axis)' if isinstance(axis, bool) else ''}."
            )
        if axis is not None and not -weight.ndim <= axis < weight.ndim:
            raise ValueError(
                f"WeightNorm: `axis={axis}` is out of range for the weight "
                f"{type(layer).__name__}.{weight_name} of shape {weight.shape}."
            )
        self.layer = layer
        self.weight_name = weight_name
        self.axis = axis
        self.g = _norm_except(weight, axis)

    @property
    def weight(self) -> Array:
        """The normalised weight `g * v / ||v||` the layer is called with."""
        v: Array = getattr(self.layer, self.weight_name)
        return v * (self.g / _norm_except(v, self.axis))

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Any:
        """Call the wrapped layer with the normalised weight.

        Arguments:
            x: the layer's input.
            key: passed on if the layer takes one.

        Returns:
            The layer's output.
        """
        layer: Any = tree_at(lambda m: getattr(m, self.weight_name), self.layer, self.weight)
        return layer(x, key=key) if accepts_key(layer) else layer(x)
