"""`Sequential` and `Lambda`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
from jaxtyping import PRNGKeyArray

from treemod._module.module import Module, field

from ._utils import accepts_key

__all__ = ["Sequential", "Lambda"]


class Sequential(Module):
    """Apply layers one after the other.

    With a `key`, it is split once into `len(layers)` keys and layer `i` gets `key=keys[i]`
    (layers whose `__call__` takes no `key`, and plain functions, are called without one).
    State needs nothing special: run the whole model under `treemod.stateful`.

    Arguments:
        layers: a sequence of modules or callables.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> k1, k2 = jax.random.split(jax.random.key(0))
        >>> model = nn.Sequential([nn.Linear(2, 8, key=k1), jax.nn.relu, nn.Dropout(0.1),
        ...                        nn.Linear(8, 1, key=k2)])
        >>> model(jnp.ones((4, 2)), key=jax.random.key(1)).shape
        (4, 1)
        >>> len(model), type(model[0]).__name__
        (4, 'Linear')
    """

    layers: tuple[Any, ...]

    def __init__(self, layers: Sequence[Callable[..., Any]]) -> None:
        self.layers = tuple(layers)
        for i, layer in enumerate(self.layers):
            if not callable(layer):
                raise TypeError(
                    f"Sequential: layers[{i}] is a {type(layer).__name__}, which is not callable."
                )

    def __call__(self, x: Any, *, key: PRNGKeyArray | None = None) -> Any:
        """Apply each layer in turn.

        Arguments:
            x: the input of the first layer.
            key: optional PRNG key, split among the layers.

        Returns:
            The output of the last layer.
        """
        keys: Any = [None] * len(self.layers)
        if key is not None and self.layers:
            keys = jax.random.split(key, len(self.layers))
        for layer, k in zip(self.layers, keys, strict=True):
            x = layer(x, key=k) if accepts_key(layer) else layer(x)
        return x

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return Sequential(self.layers[i])
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.layers)


class Lambda(Module):
    """Wrap a function (an activation, a reshape) as a layer, e.g. inside `Sequential`.

    The function is a static field: it is part of the tree structure, not a leaf.

    Arguments:
        fn: the function of one argument.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> nn.Lambda(jax.nn.relu)(jnp.array([-1.0, 2.0]))
        Array([0., 2.], dtype=float32)
    """

    fn: Callable[..., Any] = field(static=True)

    def __call__(self, x: Any, *, key: PRNGKeyArray | None = None) -> Any:
        """Return `fn(x)`.

        Arguments:
            x: the argument of `fn`.
            key: ignored (accepted so that containers can pass keys to every layer).

        Returns:
            `fn(x)`.
        """
        return self.fn(x)
