"""`Dropout`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Num, PRNGKeyArray

from treemod._module.module import Module

from ._utils import check_number, promote_input

__all__ = ["Dropout"]

_P_NOTE = " It is the probability of zeroing an element (0.5 is usual; 0 switches dropout off)."


class Dropout(Module):
    """Zero each element with probability `p` and scale the rest by `1/(1-p)` (training only).

    Elementwise, so any input shape works, batched or not; one mask is drawn for the whole
    input from the call's key. In inference mode (`inference=True` here, at call time, or via
    `treemod.nn.inference_mode`) it is the identity.

    Arguments:
        p: the drop probability, in [0, 1] (a number, or a scalar array).
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
        p = self.p
        if isinstance(p, jax.Array | np.ndarray):
            if isinstance(p, jax.core.Tracer):
                return  # a traced probability (built under a transform): checked by its source
            values = np.asarray(p)
            if values.ndim == 0:
                p = values.item()  # a concrete scalar array is checked as its value
            elif values.dtype.kind not in "iuf" or not ((values >= 0) & (values <= 1)).all():
                raise ValueError(
                    f"Dropout: `p` must be in [0, 1]; got an array of shape {values.shape} and "
                    f"dtype {values.dtype} with values outside [0, 1].{_P_NOTE}"
                )
            else:
                return  # probabilities broadcast against the input, each in [0, 1]
        check_number("Dropout", "p", p, 0, 1, note=_P_NOTE)

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
        keep = jax.random.bernoulli(key, q, np.shape(x))
        scaled = x / q.astype(x.dtype)
        return jnp.where(keep, scaled, jnp.zeros_like(scaled))
