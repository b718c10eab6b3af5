"""Eager layer calls (one compiled program per layer and input signature) against the traced
path, NumPy and PyTorch-style references, with the same errors."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm
import treemod.nn as nn


def _traced(layer: Any, x: Any) -> Any:
    return jax.jit(lambda m, x: m(x))(layer, x)


@pytest.mark.parametrize("shape", [(3,), (2, 3), (4, 2, 3)])
def test_linear_eager_matches_numpy_and_the_traced_call(shape: tuple[int, ...]) -> None:
    layer = nn.Linear(3, 5, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), shape)
    expected = np.asarray(x) @ np.asarray(layer.weight).T + np.asarray(layer.bias)
    np.testing.assert_allclose(np.asarray(layer(x)), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(_traced(layer, x)), expected, rtol=1e-5, atol=1e-6)


def test_conv_and_norm_eager_match_the_traced_call() -> None:
    conv = nn.Conv2d(3, 4, 3, padding=1, key=jax.random.key(0))
    norm = nn.LayerNorm(8)
    xi = jax.random.normal(jax.random.key(1), (2, 3, 8, 8))
    xn = jax.random.normal(jax.random.key(2), (5, 8))
    for layer, x in ((conv, xi), (conv, xi[0]), (norm, xn), (norm, xn[0])):
        np.testing.assert_allclose(
            np.asarray(layer(x)), np.asarray(_traced(layer, x)), rtol=1e-5, atol=1e-5
        )


def test_eager_errors_are_unchanged() -> None:
    layer = nn.Linear(3, 5, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"Linear: `x` must have shape \(\*batch, in_features=3\)"):
        layer(jnp.ones((2, 4)))
    with pytest.raises(ValueError, match=r"Linear: `x` must have shape"):
        jax.jit(lambda m, x: m(x))(layer, jnp.ones((2, 4)))


def test_numpy_inputs_eager_with_checks_off() -> None:
    layer = nn.Linear(3, 2, key=jax.random.key(0))
    x = np.ones((4, 3), np.float32)
    expected = x @ np.asarray(layer.weight).T + np.asarray(layer.bias)
    with tm.shape_checks(False):  # on, the annotation asks for a jax.Array
        np.testing.assert_allclose(np.asarray(layer(x)), expected, rtol=1e-5, atol=1e-6)
