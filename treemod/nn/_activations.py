"""Activation layers with parameters: `PReLU`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from treemod._module.module import Module

from ._utils import lead

__all__ = ["PReLU"]


class PReLU(Module):
    """Parametric ReLU: `x` where `x >= 0`, else `negative_slope * x`, with a learnt slope.

    As Equinox's `nn.PReLU`: one slope for every element by default. For one slope per
    channel of channels-first input, give an array that lines up with the trailing dimensions,
    e.g. `jnp.full((channels, 1, 1), 0.25)` for images `(*batch, channels, height, width)`
    (PyTorch's `nn.PReLU(num_parameters=channels)`).

    Arguments:
        init_alpha: the initial slope: a number, or an array broadcastable against the
            trailing dimensions of the inputs.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.PReLU(0.1)(jnp.array([-2.0, 3.0]))
        Array([-0.2,  3. ], dtype=float32)
    """

    negative_slope: Float[Array, "..."]

    def __init__(self, init_alpha: Any = 0.25) -> None:
        if isinstance(init_alpha, bool) or not isinstance(init_alpha, int | float | jax.Array):
            raise TypeError(
                "PReLU: `init_alpha` must be a number or a JAX array; got "
                f"{type(init_alpha).__name__}."
            )
        slope = jnp.asarray(
            init_alpha, jnp.float32 if isinstance(init_alpha, int | float) else None
        )
        self.negative_slope = slope.reshape(1) if slope.ndim == 0 else slope

    def __call__(
        self, x: Float[Array, "*shape"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "*shape"]:
        """Apply to `x` of any shape whose trailing dimensions the slope broadcasts against.

        Arguments:
            x: the input.
            key: ignored.

        Returns:
            An array of the shape of `x`.
        """
        slope = self.negative_slope
        if slope.ndim > x.ndim:
            raise ValueError(
                f"PReLU: the slope has shape {slope.shape}, more dimensions than the input "
                f"{x.shape}; it must line up with the input's trailing dimensions."
            )
        slope = lead(slope.astype(x.dtype), x.ndim)
        return jnp.where(x >= 0, x, slope * x)
