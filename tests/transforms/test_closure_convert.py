"""filter_closure_convert: closed-over arrays become leaves; values and gradients unchanged."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm


def test_closed_over_tracers_become_leaves_with_the_same_gradient() -> None:
    def loss(w: jax.Array) -> jax.Array:
        g = tm.filter_closure_convert(lambda x, act: act(w * x).sum(), jnp.ones(3), jnp.sin)
        assert len(jax.tree_util.tree_leaves(g)) == 1  # `w`, a tracer of grad
        return g(jnp.arange(3.0), jnp.sin)

    w = jnp.array([0.5, -1.0, 2.0])
    reference = jax.grad(lambda w: jnp.sin(w * jnp.arange(3.0)).sum())(w)
    np.testing.assert_allclose(jax.grad(loss)(w), reference, rtol=1e-6)


def test_matches_jax_closure_convert_and_keeps_non_array_outputs() -> None:
    w = jnp.array(3.0)
    ours = tm.filter_closure_convert(lambda x: (x * w, "label"), jnp.ones(()))
    theirs, consts = jax.closure_convert(lambda x: x * w, jnp.ones(()))
    assert ours(jnp.array(2.0)) == (theirs(jnp.array(2.0), *consts), "label")
    assert tm.filter_jit(lambda g, x: g(x)[0])(ours, jnp.array(4.0)) == 12.0


def test_other_arguments_are_an_error() -> None:
    g = tm.filter_closure_convert(lambda x, n: x * n, jnp.ones(2), 2)
    with pytest.raises(ValueError, match="filter_closure_convert.*differ from the example"):
        g(jnp.ones(3), 2)
    with pytest.raises(ValueError, match="differ from the example"):
        g(jnp.ones(2), 3)
