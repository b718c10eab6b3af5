"""`Embedding`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Inexact, Integer, PRNGKeyArray

from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names

from . import init as _init
from ._utils import check_size, default_dtype, require_key

__all__ = ["Embedding"]


@axis_names({"weight": ("vocab", "embed")})
class Embedding(Module):
    """A lookup table: integer indices to vectors (PyTorch's `nn.Embedding`).

    The weight is drawn from N(0, 1) like PyTorch, with the key unsplit (it is the only
    parameter). Indices of any shape `(*batch,)` give `(*batch, embedding_size)`.

    Every index must lie in `[0, num_embeddings)`; negative indices do not count from the end.
    Called eagerly, an index outside that range raises an `IndexError` (as in PyTorch). Inside
    a transform (`filter_jit`, `filter_grad`, ...) the values are not known while tracing, so
    an out-of-range index gives a row of NaN instead, which shows up in the loss, and adds
    nothing to the gradient.

    Arguments:
        num_embeddings: number of rows (vocabulary size).
        embedding_size: size of each vector.
        weight: an existing `(num_embeddings, embedding_size)` table instead of a random one.
        dtype: parameter dtype (float32 by default; floating or complex).
        weight_init: initialiser (default N(0, 1)).
        key: the PRNG key (not needed when `weight` is given).

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> emb = nn.Embedding(10, 4, key=jax.random.key(0))
        >>> emb(jnp.array([[1, 2, 3]])).shape
        (1, 3, 4)
    """

    weight: Inexact[Array, "num_embeddings embedding_size"]
    num_embeddings: int = field(static=True)
    embedding_size: int = field(static=True)

    def __init__(
        self,
        num_embeddings: int | None = None,
        embedding_size: int | None = None,
        weight: Inexact[Array, "num_embeddings embedding_size"] | None = None,
        dtype: Any = None,
        *,
        weight_init: _init.Initializer | None = None,
        key: PRNGKeyArray | None = None,
    ) -> None:
        if num_embeddings is not None:
            check_size("Embedding", "num_embeddings", num_embeddings)
        if embedding_size is not None:
            check_size("Embedding", "embedding_size", embedding_size)
        if weight is None:
            if num_embeddings is None or embedding_size is None:
                raise ValueError(
                    "Embedding: give `num_embeddings` and `embedding_size` (and a key), or "
                    "an existing `weight` table."
                )
            require_key("Embedding", key)
            assert key is not None
            weight_init = _init.normal(1.0) if weight_init is None else weight_init
            dtype = default_dtype("Embedding", dtype, complex_ok=True)
            weight = weight_init(key, (num_embeddings, embedding_size), dtype)
        elif jnp.ndim(weight) != 2:
            raise ValueError(
                f"Embedding: `weight` must be 2-d (num_embeddings, embedding_size); got shape "
                f"{np.shape(weight)}."
            )
        self.weight = weight
        self.num_embeddings, self.embedding_size = np.shape(weight)

    def __call__(
        self, x: Integer[Array, "*batch"], *, key: PRNGKeyArray | None = None
    ) -> Inexact[Array, "*batch embedding_size"]:
        """Look up rows.

        Arguments:
            x: integer indices of any shape, each in `[0, num_embeddings)`.
            key: ignored.

        Returns:
            `(*x.shape, embedding_size)`.

        Raises:
            IndexError: called eagerly with an index outside `[0, num_embeddings)`.
        """
        if not jnp.issubdtype(jnp.result_type(x), jnp.integer):
            raise TypeError(
                f"Embedding: indices must be integers; got dtype {jnp.result_type(x)}. Cast "
                "them with `.astype(jnp.int32)`."
            )
        if not isinstance(x, jax.core.Tracer):
            self._check_range(np.asarray(x))
        return self.weight.at[x].get(mode="fill", wrap_negative_indices=False)

    def _check_range(self, x: np.ndarray) -> None:
        bad = np.argwhere((x < 0) | (x >= self.num_embeddings))
        if len(bad):
            where = tuple(int(i) for i in bad[0])
            raise IndexError(
                f"Embedding: index {int(x[where])} at position {where} of `x` is out of range "
                f"for num_embeddings={self.num_embeddings}; indices must lie in "
                f"[0, {self.num_embeddings}) ({len(bad)} of {x.size} are outside)."
            )
