"""Position embeddings resized for other image sizes, as the ViT family's `transformers` models
resize them: PyTorch's bicubic interpolation (`F.interpolate(mode="bicubic",
align_corners=False)`: the cubic convolution kernel with `A = -0.75`, source positions
`(i + 0.5) * in / out - 0.5`, border indices clamped), computed as two interpolation matrices
built in float32 as PyTorch builds its weights, applied to the square grid of positions.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

__all__ = ["bicubic_weights", "resize_grid"]

_A = np.float32(-0.75)


def _near(x: np.float32) -> np.float32:  # |x| <= 1
    return np.float32(((_A + 2) * x - (_A + 3)) * x * x + 1)


def _far(x: np.float32) -> np.float32:  # 1 < |x| < 2
    return np.float32(((_A * x - 5 * _A) * x + 8 * _A) * x - 4 * _A)


@functools.cache
def bicubic_weights(n_in: int, n_out: int) -> np.ndarray:
    """The `(n_out, n_in)` matrix of PyTorch's bicubic resize of one axis from `n_in` to `n_out`.

    Example:
        >>> from treemod.models._vit_interpolate import bicubic_weights
        >>> bicubic_weights(3, 3)   # the same size: the identity
        array([[1., 0., 0.],
               [0., 1., 0.],
               [0., 0., 1.]], dtype=float32)
    """
    f = np.float32
    weights = np.zeros((n_out, n_in), np.float32)
    scale = f(n_in) / f(n_out)
    for i in range(n_out):
        real = scale * (f(i) + f(0.5)) - f(0.5)
        first = int(np.floor(real))
        t = f(real - f(first))
        for k, c in enumerate((_far(t + f(1)), _near(t), _near(f(1) - t), _far(f(2) - t))):
            weights[i, min(max(first - 1 + k, 0), n_in - 1)] += c
    return weights


def resize_grid(table: Array, size: tuple[int, int]) -> Array:
    """A square grid of position embeddings `(side * side, dim)` resized to `(h * w, dim)`.

    Arguments:
        table: the embeddings of a `side x side` grid, row-major.
        size: the new grid `(h, w)`.

    Returns:
        `(h * w, dim)` in `table`'s dtype (interpolated in float32 at least).
    """
    side = int(round(table.shape[0] ** 0.5))
    grid = table.reshape(side, side, -1)
    dtype = jnp.promote_types(table.dtype, jnp.float32)
    wy = jnp.asarray(bicubic_weights(side, size[0]), dtype)
    wx = jnp.asarray(bicubic_weights(side, size[1]), dtype)
    out = jnp.einsum(
        "oh,pw,hwd->opd", wy, wx, grid.astype(dtype), precision=jax.lax.Precision.HIGHEST
    )
    return out.reshape(size[0] * size[1], -1).astype(table.dtype)
