"""`RotaryPositionalEmbedding`: rotary position encoding (RoFormer), Equinox's convention."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Num, PRNGKeyArray

from treemod._module.module import Module, field

from ._batching import Core, batch_apply
from ._utils import check_number, check_size, lead, promote_input

__all__ = ["RotaryPositionalEmbedding"]


class RotaryPositionalEmbedding(Module):
    """Rotary position encoding (Su et al., RoFormer) of `(*batch, seq_length, embedding_size)`.

    Feature `i` and feature `i + embedding_size / 2` of position `p` are rotated as a pair by
    the angle `p * theta ** (-2i / embedding_size)`, the "rotate half" layout of Equinox's
    `nn.RotaryPositionalEmbedding` (and GPT-NeoX), so weights and results carry over. The
    angles are computed in float64 when the program is traced and enter it as constants. To
    encode each attention head, put the heads in front: `(*batch, heads, seq, head_size)`.

    Arguments:
        embedding_size: the size of the last axis; must be even.
        theta: the base of the rotation frequencies (a positive number).
        dtype: the dtype of the sine and cosine tables (default: the input's dtype); the
            result's dtype follows JAX's promotion of the input with it.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> rope = nn.RotaryPositionalEmbedding(4)
        >>> rope(jnp.ones((8, 3, 4))).shape
        (8, 3, 4)
        >>> rope(jnp.ones((1, 4)))  # position 0 is not rotated
        Array([[1., 1., 1., 1.]], dtype=float32)
    """

    embedding_size: int = field(static=True)
    theta: float = field(static=True)
    dtype: Any = field(static=True)

    def __init__(self, embedding_size: int, theta: float = 10_000.0, dtype: Any = None) -> None:
        check_size("RotaryPositionalEmbedding", "embedding_size", embedding_size)
        if embedding_size % 2:
            raise ValueError(
                "RotaryPositionalEmbedding: `embedding_size` must be a positive even number; "
                f"got {embedding_size}."
            )
        self.embedding_size = embedding_size
        note = " It is the base of the rotation frequencies (10000.0 is usual)."
        self.theta = check_number(
            "RotaryPositionalEmbedding", "theta", theta, 0, low_open=True, note=note
        )
        self.dtype = None if dtype is None else jnp.dtype(dtype)

    def __call__(
        self, x: Num[Array, "*batch seq_length size"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "*batch seq_length size"]:
        """Encode positions `0 .. seq_length - 1` into `x`.

        Arguments:
            x: `(*batch, seq_length, embedding_size)`.
            key: ignored.

        Returns:
            An array of the shape of `x`.
        """
        x = promote_input(x, self.dtype)
        core = [Core("x", x, (("seq_length", None), ("embedding_size", self.embedding_size)))]
        return batch_apply("RotaryPositionalEmbedding", self._flat, core)

    def _flat(self, x: Array) -> Array:
        seq, size = x.shape[-2:]
        half = size // 2
        inv_freq = self.theta ** (-np.arange(0, size, 2, dtype=np.float64) / size)
        angles = np.outer(np.arange(seq, dtype=np.float64), inv_freq)  # (seq, half)
        dtype = x.dtype if self.dtype is None else self.dtype
        cos = lead(jnp.asarray(np.tile(np.cos(angles), (1, 2)), dtype), x.ndim)
        sin = lead(jnp.asarray(np.tile(np.sin(angles), (1, 2)), dtype), x.ndim)
        rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rotated * sin
