"""Helpers the Equinox checkpoint-format tests share: byte strings of both writers, test data,
and layers built under `filter_eval_shape` with random values. Equinox is imported at the first
call, so a test file can skip before needing it."""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

import treemod.compat.equinox as ceqx

from helpers import close

KEY = jax.random.PRNGKey(0)


def eqx_bytes(tree: Any, **kwargs: Any) -> bytes:
    """`tree` as real Equinox's `tree_serialise_leaves` writes it."""
    import equinox as eqx

    buf = io.BytesIO()
    eqx.tree_serialise_leaves(buf, tree, **kwargs)
    return buf.getvalue()


def tm_bytes(tree: Any, **kwargs: Any) -> bytes:
    """`tree` as `treemod.compat.equinox.tree_serialise_leaves` writes it."""
    buf = io.BytesIO()
    ceqx.tree_serialise_leaves(buf, tree, **kwargs)
    return buf.getvalue()


def noisy(tree: Any, seed: int) -> Any:
    """`tree` with every float array moved by random noise (so ones/zeros inits are not trivial)."""
    leaves, treedef = jtu.tree_flatten(tree)
    rng = np.random.default_rng(seed)
    out = []
    for leaf in leaves:
        if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jnp.floating):
            leaf = leaf + jnp.asarray(rng.normal(size=leaf.shape), leaf.dtype)
        out.append(leaf)
    return jtu.tree_unflatten(treedef, out)


def prng(seed: int) -> jax.Array:
    return jax.random.key(seed)


def sample(*shape: int, seed: int = 3) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def filled(abstract: Any, seed: int) -> Any:
    """`abstract` (from a filter_eval_shape) with every float array drawn from a normal."""
    rng = np.random.default_rng(seed)

    def fill(leaf: Any) -> Any:
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            return leaf
        assert jnp.issubdtype(leaf.dtype, jnp.floating), leaf
        return jnp.asarray(rng.normal(size=leaf.shape), leaf.dtype)

    return jtu.tree_map(fill, abstract)


def built(make: Callable[[], Any], seed: int = 0) -> Any:
    """`make()`'s layer, built under filter_eval_shape and `filled`."""
    import equinox as eqx

    return filled(eqx.filter_eval_shape(make), seed)


# Leaf by leaf: the two libraries' outputs may be different containers.
close_leaves = functools.partial(close, rtol=2e-5, atol=2e-5, check_structure=False)
