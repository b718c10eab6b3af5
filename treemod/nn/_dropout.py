"""`Dropout`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Num, PRNGKeyArray

from treemod._module.module import Module

from ._utils import promote_input

__all__ = ["Dropout"]


class Dropout(Module):
    """Zero each element with probability `p` and scale the rest by `1/(1-p)` (training only).

    Elementwise, so any input shape works, batched or not; one mask is drawn for the whole
    input from the call's key. In inference mode (`inference=True` here, at call time, or via
    `treemod.nn.inference_mode`) it is the identity.

    Arguments:
        p: the drop probability.
        inference: start in inference mode (identity).

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> dropout = nn.Dropout(0.5)
        >>> y = dropout(jnp.ones(1000), key=jax.random.key(0))
        >>> sorted(set(y.tolist()))
        [0.0, 2.0]
        >>> dropout(jnp.ones(3), inference=True)
        Array([1., 1., 1.], dtype=float32)
    """

    p: float = 0.5
    inference: bool = False

    def __check_init__(self) -> None:
        if isinstance(self.p, int | float) and not 0.0 <= self.p <= 1.0:
            raise ValueError(f"Dropout: `p` must be in [0, 1]; got {self.p}.")

    @property
    def deterministic(self) -> bool:
        """Equinox's deprecated name for `inference`."""
        return self.inference

    def __call__(
        self,
        x: Num[Array, "*shape"],
        *,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
        deterministic: bool | None = None,
    ) -> Num[Array, "*shape"]:
        """Apply dropout.

        Arguments:
            x: any shape; in training, integers are promoted to the default float dtype (in
                inference the input is returned as it is).
            key: PRNG key for the mask; needed unless in inference mode or `p == 0`.
            inference: overrides the field for this call.
            deterministic: deprecated Equinox alias of `inference`.

        Returns:
            An array of the shape of `x`.
        """
        if inference is None:
            inference = deterministic
        if inference is None:
            inference = self.inference
        if isinstance(self.p, int | float) and self.p == 0:
            inference = True
        if inference:
            return x
        if key is None:
            raise RuntimeError(
                "Dropout needs a `key` in training mode: call `dropout(x, key=key)`, or switch it "
                "off with `inference=True` (or `treemod.nn.inference_mode(model)`)."
            )
        x = promote_input(x)
        q = 1 - lax.stop_gradient(jnp.asarray(self.p, jnp.float32))
        keep = jax.random.bernoulli(key, q, jnp.shape(x))
        scaled = x / q.astype(x.dtype)
        return jnp.where(keep, scaled, jnp.zeros_like(scaled))
