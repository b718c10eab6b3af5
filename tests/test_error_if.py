"""error_if: raises at run time with its message, eagerly, compiled, under vmap and grad."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm


def _checked(x: jax.Array) -> jax.Array:
    return tm.error_if(x, x < 0, "negative input") * 2


@pytest.mark.parametrize(
    "run",
    [
        lambda x: _checked(x),
        lambda x: tm.filter_jit(_checked)(x),
        lambda x: jax.jit(jax.vmap(_checked))(x[:, None]),
        lambda x: tm.filter_jit(tm.filter_grad(lambda x: _checked(x).sum()))(x),
    ],
    ids=["eager", "filter_jit", "vmap", "grad"],
)
def test_raises_with_the_message_only_when_pred_holds(run) -> None:
    good, bad = jnp.array([1.0, 2.0, 3.0]), jnp.array([1.0, -2.0, 3.0])
    jax.block_until_ready(run(good))
    with pytest.raises(RuntimeError, match="negative input"):
        jax.block_until_ready(run(bad))


def test_returns_x_and_passes_the_derivative_through() -> None:
    tree = {"w": jnp.array([1.0, 2.0]), "act": "relu"}
    assert tm.error_if(tree, jnp.array(False), "never") is tree
    x = jnp.array([0.5, 1.5])
    ours = jax.grad(lambda x: jnp.sum(jnp.sin(tm.error_if(x, x > 10, "too big"))))(x)
    np.testing.assert_allclose(ours, jnp.cos(x), rtol=1e-6)
    assert tm.filter_jit(lambda x: tm.error_if(x, False, "never"))(x) is not None


def test_pred_must_be_boolean_and_the_error_names_it() -> None:
    with pytest.raises(TypeError, match=r"error_if: `pred` must be a boolean .* got f32\[2\]"):
        tm.error_if(jnp.ones(2), jnp.ones(2), "msg")
