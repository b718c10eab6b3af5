"""Equinox's `SpectralNorm`: the singular-vector estimates live in a `State`, passed in and out.

The power iteration and the initial estimates are treemod's (`treemod.nn._spectral_norm`).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import jax
import jax.numpy as jnp
from jax import lax

from treemod import field, tree_at
from treemod._compat_api import power_iteration
from treemod.nn import SpectralNorm as _TreemodSpectralNorm

from ._stateful import State, StatefulLayer, StateIndex

__all__ = ["SpectralNorm"]

_Layer = TypeVar("_Layer")


class SpectralNorm(StatefulLayer, Generic[_Layer]):
    """Spectral normalisation as Equinox's `nn.SpectralNorm`: `y, state = sn(x, state)`.

    The wrapped layer runs with its weight divided by `u @ W @ v`, where `u`, `v` estimate the
    leading singular vectors of the weight read as a matrix `(shape[0], -1)`. In training each
    call runs `num_power_iterations` steps of the power method (without gradient) and stores the
    new estimates in the state; in inference the stored ones are used. Build it with
    `make_with_state`.

    Arguments:
        layer: the layer to wrap.
        weight_name: the name of its weight field.
        num_power_iterations: power-method steps per training call.
        eps: the smallest norm a vector is divided by.
        inference: start in inference mode.
        key: for the random initial vectors.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> linear = eqx.nn.Linear(4, 3, key=jax.random.key(0))
        >>> sn, state = eqx.nn.make_with_state(eqx.nn.SpectralNorm)(
        ...     linear, "weight", key=jax.random.key(1))
        >>> y, state = sn(jnp.ones(4), state)
        >>> y.shape
        (3,)
    """

    layer: _Layer
    weight_name: str = field(static=True)
    uv_index: StateIndex[tuple[jax.Array, jax.Array]]
    num_power_iterations: int = field(static=True)
    eps: float = field(static=True)
    inference: bool

    def __init__(
        self,
        layer: _Layer,
        weight_name: str,
        num_power_iterations: int = 1,
        eps: float = 1e-12,
        inference: bool = False,
        *,
        key: Any,
    ) -> None:
        # treemod's layer validates the arguments and draws the initial estimates.
        core = _TreemodSpectralNorm(
            layer, weight_name, num_power_iterations, eps, inference, key=key
        )
        self.layer = layer
        self.weight_name = weight_name
        self.uv_index = StateIndex((core.u.value, core.v.value))
        self.num_power_iterations = num_power_iterations
        self.eps = eps
        self.inference = inference

    def __call__(
        self,
        x: Any,
        state: State,
        *,
        key: Any = None,
        inference: bool | None = None,
    ) -> tuple[Any, State]:
        """Call the wrapped layer with the normalised weight and return the updated state.

        Arguments:
            x: the layer's input.
            state: the model's `State`.
            key: ignored, as in Equinox (the wrapped layer is called as `layer(x)`).
            inference: overrides the `inference` field for this call.

        Returns:
            `(layer output, state)`.
        """
        del key
        u, v = state.get(self.uv_index)
        weight: jax.Array = getattr(self.layer, self.weight_name)
        matrix = jnp.reshape(weight, (weight.shape[0], -1))
        if inference is None:
            inference = self.inference
        if not inference:
            frozen = lax.stop_gradient(matrix)
            for _ in range(self.num_power_iterations):
                u, v = power_iteration(frozen, u, v, self.eps)
            state = state.set(self.uv_index, (u, v))
        sigma = u @ matrix @ v
        normalised = jnp.reshape(matrix / sigma, weight.shape)
        layer: Any = tree_at(lambda m: getattr(m, self.weight_name), self.layer, normalised)
        return layer(x), state
