"""`SpectralNorm`: divide a layer's weight by its largest singular value (power iteration)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, PRNGKeyArray

from treemod._module.module import Module, field
from treemod._module.state import State, in_stateful_call, update_state
from treemod._tree.tree_at import tree_at

from ._utils import accepts_key, check_number, check_size, require_key

__all__ = ["SpectralNorm", "power_iteration"]

_Layer = TypeVar("_Layer")


def power_iteration(w: Array, u: Array, v: Array, eps: float) -> tuple[Array, Array]:
    """One step of the power method on the matrix `w`: PyTorch's order and normalisation."""
    u = w @ v
    u = u / jnp.maximum(jnp.sqrt(jnp.sum(jnp.square(u))), eps)
    v = w.T @ u
    v = v / jnp.maximum(jnp.sqrt(jnp.sum(jnp.square(v))), eps)
    return u, v


class SpectralNorm(Module, Generic[_Layer]):
    """Spectral normalisation (Miyato et al., 2018) of a wrapped layer, as Equinox's.

    The layer is called with its weight divided by `sigma`, an estimate of the weight's largest
    singular value (the weight is read as a matrix `(shape[0], -1)`). `sigma = u @ W @ v` comes
    from singular-vector estimates `u`, `v` kept as `State`: in training mode each call runs
    `num_power_iterations` steps of the power method from them (without gradient) and records
    the new estimates, so the model runs as `y, model = treemod.stateful(model)(x)`, like
    BatchNorm. In inference mode (`treemod.nn.inference_mode`) the stored estimates are used
    as they are. The estimates start from 15 power iterations on random vectors, as in PyTorch's
    `nn.utils.parametrizations.spectral_norm` and Equinox's `nn.SpectralNorm`.

    Arguments:
        layer: the layer to wrap (e.g. a `Linear` or a `Conv2d`).
        weight_name: the name of the layer's weight field.
        num_power_iterations: power-method steps per training call.
        eps: the smallest norm a vector is divided by (a positive number).
        inference: start in inference mode.
        key: for the random initial vectors.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm, treemod.nn as nn
        >>> sn = nn.SpectralNorm(nn.Linear(4, 3, key=jax.random.key(0)), key=jax.random.key(1))
        >>> y, sn = tm.stateful(sn)(jnp.ones(4))
        >>> s = jnp.linalg.svd(sn.weight, compute_uv=False)[0]  # the normalised weight
        >>> bool(jnp.allclose(s, 1.0, atol=1e-3))
        True
    """

    layer: _Layer
    u: State
    v: State
    weight_name: str = field(static=True)
    num_power_iterations: int = field(static=True)
    eps: float = field(static=True)
    inference: bool = field(static=True)

    def __init__(
        self,
        layer: _Layer,
        weight_name: str = "weight",
        num_power_iterations: int = 1,
        eps: float = 1e-12,
        inference: bool = False,
        *,
        key: PRNGKeyArray,
    ) -> None:
        weight: Any = getattr(layer, weight_name, None)
        if not hasattr(weight, "ndim") or weight.ndim < 2:
            found = "no array" if not hasattr(weight, "ndim") else f"shape {weight.shape}"
            raise ValueError(
                f"SpectralNorm: {type(layer).__name__}.{weight_name} must be an array of at "
                f"least two dimensions; found {found}. Pass `weight_name=` the layer's weight."
            )
        check_size("SpectralNorm", "num_power_iterations", num_power_iterations, minimum=0)
        note = " It is the smallest norm a vector is divided by (1e-12 is usual)."
        eps = check_number("SpectralNorm", "eps", eps, 0, low_open=True, note=note)
        require_key("SpectralNorm", key)
        matrix = jnp.reshape(weight, (weight.shape[0], -1))
        ukey, vkey = jax.random.split(key)
        u = jax.random.normal(ukey, (matrix.shape[0],), matrix.dtype)
        v = jax.random.normal(vkey, (matrix.shape[1],), matrix.dtype)
        for _ in range(15):
            u, v = power_iteration(matrix, u, v, eps)
        self.layer = layer
        self.u = State(u)
        self.v = State(v)
        self.weight_name = weight_name
        self.num_power_iterations = num_power_iterations
        self.eps = eps
        self.inference = inference

    @property
    def weight(self) -> Array:
        """The normalised weight, from the stored estimates (what inference mode uses)."""
        return self._normalised(self.u.value, self.v.value)

    def _normalised(self, u: Array, v: Array) -> Array:
        w: Array = getattr(self.layer, self.weight_name)
        sigma = u @ jnp.reshape(w, (w.shape[0], -1)) @ v
        return w / sigma

    def __call__(
        self, x: Array, *, key: PRNGKeyArray | None = None, inference: bool | None = None
    ) -> Any:
        """Call the wrapped layer with the spectrally normalised weight.

        Arguments:
            x: the layer's input.
            key: passed on if the layer takes one.
            inference: override the `inference` field for this call.

        Returns:
            The layer's output.
        """
        if inference is None:
            inference = self.inference
        u, v = self.u.value, self.v.value
        if not inference and self.num_power_iterations:
            if not in_stateful_call():
                raise RuntimeError(
                    "SpectralNorm is in training mode, which updates its singular-vector "
                    "estimates, so the model must run as `out, model = "
                    "treemod.stateful(model)(x)` (keep the returned model). To use the stored "
                    "estimates, switch it with `treemod.nn.inference_mode(model)`."
                )
            w = lax.stop_gradient(getattr(self.layer, self.weight_name))
            matrix = jnp.reshape(w, (w.shape[0], -1))
            for _ in range(self.num_power_iterations):
                u, v = power_iteration(matrix, u, v, self.eps)
            update_state(self.u, u)
            update_state(self.v, v)
        weight = self._normalised(u, v)
        layer: Any = tree_at(lambda m: getattr(m, self.weight_name), self.layer, weight)
        return layer(x, key=key) if accepts_key(layer) else layer(x)
