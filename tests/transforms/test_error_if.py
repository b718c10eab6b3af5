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


def test_branched_error_if_raises_the_message_of_the_first_true_element() -> None:
    def check(x: jax.Array) -> jax.Array:
        bad = ~jnp.isfinite(x)
        return tm.branched_error_if(x, bad, jnp.isnan(x).astype(jnp.int32), ["inf", "nan"])

    jax.block_until_ready(tm.filter_jit(check)(jnp.array([1.0, 2.0])))
    for run in (check, tm.filter_jit(check)):
        with pytest.raises(RuntimeError, match="nan"):
            jax.block_until_ready(run(jnp.array([1.0, jnp.nan, jnp.inf])))
        with pytest.raises(RuntimeError, match="inf"):
            jax.block_until_ready(run(jnp.array([jnp.inf, jnp.nan])))
    batch = jnp.array([[1.0, 2.0], [3.0, jnp.inf], [jnp.nan, 1.0]])  # example 1 is first
    with pytest.raises(RuntimeError, match="inf"):
        jax.block_until_ready(jax.jit(jax.vmap(check))(batch))


@pytest.mark.parametrize("bad_at", [(0, 1, 2), (1, 0, 0), (1, 2, 1), (2, 2, 2)])
def test_branched_error_if_under_nested_vmap_names_the_first_bad_example(
    bad_at: tuple[int, int, int],
) -> None:
    # Message k for element k of a (3, 3, 3) batch; every element after `bad_at` in row-major
    # order is bad too, so only a check that takes the first in example order names `bad_at`.
    order = np.arange(27).reshape(3, 3, 3)
    x = jnp.where(order >= order[bad_at], jnp.inf, 1.0)
    msgs = [f"element {k}" for k in range(27)]

    def check(x: jax.Array, k: jax.Array) -> jax.Array:
        return tm.branched_error_if(x, ~jnp.isfinite(x), k, msgs)

    run = jax.jit(jax.vmap(jax.vmap(check)))
    with pytest.raises(RuntimeError, match=rf"element {order[bad_at]}\b"):
        jax.block_until_ready(run(x, jnp.asarray(order)))


def test_branched_error_if_index_must_be_integer_and_the_error_names_it() -> None:
    with pytest.raises(TypeError, match=r"branched_error_if: `index` must be an integer .* f32"):
        tm.branched_error_if(jnp.ones(2), jnp.ones(2) > 0, jnp.ones(2), ["a"])
    with pytest.raises(TypeError, match=r"branched_error_if: `pred` must be a boolean"):
        tm.branched_error_if(jnp.ones(2), jnp.ones(2), 0, ["a"])
