"""Helpers shared by the framework modules (imports JAX: load only inside a worker)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .spec import LEARNING_RATE


def optimiser() -> optax.GradientTransformation:
    """The optimiser every framework uses."""
    return optax.adam(LEARNING_RATE)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy with integer labels."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def count_params(tree: Any) -> int:
    """The number of elements in the floating-point arrays of `tree`."""
    return int(
        sum(
            np.size(x)
            for x in jax.tree_util.tree_leaves(tree)
            if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)
        )
    )


def wait(tree: Any) -> None:
    """Block until every array in `tree` is ready."""
    jax.block_until_ready(jax.tree_util.tree_leaves(tree))
