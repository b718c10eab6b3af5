"""Equinox's `Embedding` indexing (negative indices count from the end) and RoPE helper."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from treemod.nn import Embedding as _Embedding
from treemod.nn import RotaryPositionalEmbedding as _RotaryPositionalEmbedding

from ._alias import CompatLayerMeta
from ._init import equinox_normal

__all__ = ["Embedding", "RotaryPositionalEmbedding"]


class Embedding(_Embedding, metaclass=CompatLayerMeta, shapecheck=False):
    """`treemod.nn.Embedding` whose negative indices count from the end, as in Equinox.

    The weight is Equinox's for the same key in every dtype (drawn in that dtype).

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> emb = eqx.nn.Embedding(weight=jnp.arange(6.0).reshape(3, 2))
        >>> emb(jnp.array(-1))
        Array([4., 5.], dtype=float32)
    """

    _treemod_layer = _Embedding

    def __init__(
        self,
        num_embeddings: int | None = None,
        embedding_size: int | None = None,
        weight: Any = None,
        dtype: Any = None,
        *,
        key: Any = None,
    ) -> None:
        """Equinox's arguments; the weight is drawn N(0, 1) in `dtype`, as Equinox draws it."""
        super().__init__(
            num_embeddings, embedding_size, weight, dtype, weight_init=equinox_normal, key=key
        )

    def __call__(self, x: Any, *, key: Any = None) -> Any:
        """Look up rows; `-1` is the last one. Indices outside `[-n, n)` are an error."""
        x = jnp.asarray(x)
        if jnp.issubdtype(x.dtype, jnp.signedinteger):
            x = jnp.where(x < 0, x + self.num_embeddings, x)
        return super().__call__(x)


class RotaryPositionalEmbedding(
    _RotaryPositionalEmbedding, metaclass=CompatLayerMeta, shapecheck=False
):
    """`treemod.nn.RotaryPositionalEmbedding` with Equinox's `precompute_freqs_cis` helper.

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> cos, sin = eqx.nn.RotaryPositionalEmbedding.precompute_freqs_cis(4, 3, 10000.0)
        >>> cos.shape
        (3, 2)
    """

    _treemod_layer = _RotaryPositionalEmbedding

    @staticmethod
    def precompute_freqs_cis(
        embedding_size: int, end: int, theta: float = 10000.0, dtype: Any = jnp.float32
    ) -> tuple[Any, Any]:
        """The rotation of each position: `(cos, sin)` of `position * theta**(-2i/size)`.

        Arguments:
            embedding_size: the (even) size of the embedded vectors.
            end: the number of positions.
            theta: the base of the frequencies.
            dtype: of the result.

        Returns:
            `(cos, sin)`, each `(end, embedding_size // 2)`.
        """
        inv_freq = theta ** (-np.arange(0, embedding_size, 2, dtype=np.float64) / embedding_size)
        angles = np.outer(np.arange(end, dtype=np.float64), inv_freq[: embedding_size // 2])
        return jnp.asarray(np.cos(angles), dtype), jnp.asarray(np.sin(angles), dtype)
