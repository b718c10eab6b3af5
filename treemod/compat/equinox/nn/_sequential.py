"""Equinox's `Sequential` (threading a `State` through stateful layers) and `Lambda`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from treemod._compat_api import accepts_key
from treemod.nn import Lambda as _TreemodLambda
from treemod.nn import Sequential as _TreemodSequential

from ._stateful import State, StatefulLayer

__all__ = ["Sequential", "Lambda"]

_NO_STATE: Any = object()


class Sequential(_TreemodSequential, StatefulLayer, shapecheck=False):
    """Layers applied in order, as Equinox's `nn.Sequential`; passes a `State` along if given.

    `seq(x, key=key)` returns the output; `seq(x, state, key=key)` returns `(output, state)`,
    calling each `StatefulLayer` (e.g. `BatchNorm`) as `x, state = layer(x, state=state)` and
    the others as `x = layer(x)`. A key is split into one per layer.

    Arguments:
        layers: the layers (modules or callables).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> model, state = eqx.nn.make_with_state(eqx.nn.Sequential)([
        ...     eqx.nn.Linear(2, 3, key=jax.random.key(0)),
        ...     eqx.nn.BatchNorm(3, "batch", mode="batch"),
        ... ])
        >>> run = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
        >>> y, state = run(jnp.ones((4, 2)), state)
        >>> y.shape
        (4, 3)
    """

    def is_stateful(self) -> bool:
        """Whether any layer is stateful (then the call takes and returns a `State`)."""
        return any(isinstance(x, StatefulLayer) and x.is_stateful() for x in self.layers)

    def __call__(self, x: Any, state: State = _NO_STATE, *, key: Any = None) -> Any:
        """Apply each layer in turn.

        Arguments:
            x: the input of the first layer.
            state: the model's `State`, for stateful layers (optional).
            key: optional PRNG key, split among the layers.

        Returns:
            The last output, or `(output, state)` if a state was given.
        """
        keys: Any = [None] * len(self.layers)
        if key is not None and self.layers:
            keys = jax.random.split(key, len(self.layers))
        for i, (layer, k) in enumerate(zip(self.layers, keys, strict=True)):
            if isinstance(layer, StatefulLayer) and layer.is_stateful():
                if state is _NO_STATE:
                    raise TypeError(
                        f"Sequential: layers[{i}] ({type(layer).__name__}) is stateful, so call "
                        "the Sequential as `y, state = seq(x, state)` with the State from "
                        "`eqx.nn.make_with_state`."
                    )
                # A StatefulLayer is a layer, so callable; the protocol class declares no call.
                x, state = layer(x, state=state, key=k)  # type: ignore[operator]
            elif accepts_key(layer):
                x = layer(x, key=k)
            else:
                x = layer(x)
        return x if state is _NO_STATE else (x, state)

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return Sequential(self.layers[i])
        return self.layers[i]


class Lambda(_TreemodLambda, shapecheck=False):
    """Wrap a function as a layer (Equinox's `nn.Lambda`): the key is accepted and ignored.

    As in Equinox, `fn` is a pytree node rather than static, so a module or `Partial` holding
    arrays can be wrapped and its arrays are seen by transforms.

    Arguments:
        fn: the function of one argument.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.nn.Lambda(jax.nn.relu)(jnp.array([-1.0, 2.0]))
        Array([0., 2.], dtype=float32)
    """

    fn: Callable[..., Any]
