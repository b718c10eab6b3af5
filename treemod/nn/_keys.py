"""Key helpers: `KeySeq` (fresh subkeys on demand) and `split_like` (one key per leaf)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.tree_util as jtu
from jaxtyping import PRNGKeyArray

__all__ = ["KeySeq", "split_like"]


class KeySeq(Iterator[PRNGKeyArray]):
    """An iterator of fresh, never repeated subkeys drawn from one key.

    `next(keys)` costs one `jax.random.fold_in`; `keys.split(n)` returns `n` keys with one
    `jax.random.split`, which is what layer constructors use (one split per layer). Two keys
    given out by one `KeySeq` are always different, so model constructors become one-liners
    that cannot reuse a key by accident.

    Arguments:
        key: the key to draw from (a `jax.random.key` or a legacy `PRNGKey`).

    Example:
        >>> import jax, treemod.nn as nn
        >>> keys = nn.KeySeq(jax.random.key(0))
        >>> a, b = next(keys), next(keys)
        >>> bool((jax.random.key_data(a) != jax.random.key_data(b)).any())
        True
        >>> keys.split(3).shape
        (3,)
    """

    def __init__(self, key: PRNGKeyArray) -> None:
        if key is None:
            raise TypeError("KeySeq needs a key, e.g. KeySeq(jax.random.key(0)); got None.")
        self._key = key
        self._count = 0

    def __next__(self) -> PRNGKeyArray:
        self._count += 1
        return jax.random.fold_in(self._key, self._count)

    def __iter__(self) -> KeySeq:
        return self

    def split(self, num: int) -> PRNGKeyArray:
        """Return `num` fresh keys as one array of keys (one `jax.random.split`).

        Arguments:
            num: how many keys.

        Returns:
            An array of `num` keys.
        """
        return jax.random.split(next(self), num)

    def __repr__(self) -> str:
        return f"KeySeq(drawn={self._count})"


def split_like(key: PRNGKeyArray, tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """Return a tree of the structure of `tree` holding one distinct key per leaf.

    The keys come from a single `jax.random.split(key, num_leaves)`.

    Arguments:
        key: the key to split.
        tree: any pytree; only its structure is used.
        is_leaf: as in `jax.tree_util`.

    Returns:
        A tree of keys.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> keys = nn.split_like(jax.random.key(0), {"w": jnp.zeros(3), "b": jnp.zeros(2)})
        >>> sorted(keys)
        ['b', 'w']
    """
    leaves, treedef = jtu.tree_flatten(tree, is_leaf=is_leaf)
    if not leaves:
        return jtu.tree_unflatten(treedef, [])
    keys = jax.random.split(key, len(leaves))
    return jtu.tree_unflatten(treedef, list(keys))
