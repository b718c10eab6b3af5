"""filter_vmap: against jax.vmap and NumPy loops; axes specs, ensembles, errors."""

from __future__ import annotations

from typing import Any

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod as tm

_batched = st.integers(1, 3).flatmap(
    lambda n: st.lists(
        hnp.array_shapes(min_dims=0, max_dims=2, max_side=3).flatmap(
            lambda s: hnp.arrays(np.float32, (n, *s), elements=st.floats(-5, 5, width=32))
        ),
        min_size=1,
        max_size=3,
    )
)


def _f(xs: list) -> dict:
    return {"sum": sum((jnp.sum(x) for x in xs), jnp.float32(0)), "sq": [x * x for x in xs]}


@settings(max_examples=10, deadline=None)
@given(_batched)
def test_equals_jax_vmap_on_arrays(xs: list) -> None:
    xs = [jnp.asarray(x) for x in xs]
    expected = jax.vmap(_f)(xs)
    got = tm.filter_vmap(_f)(xs)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(expected)
    for a, b in zip(
        jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(expected), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-6)


class Affine(tm.Module):
    w: jax.Array
    b: jax.Array
    act: Any = jnp.tanh

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.act(self.w @ x + self.b)


def _make(key: jax.Array) -> Affine:
    kw, kb = jax.random.split(key)
    return Affine(jax.random.normal(kw, (2, 3)), jax.random.normal(kb, (2,)))


def test_ensemble_of_models() -> None:
    keys = jax.random.split(jax.random.key(0), 4)
    ensemble = tm.filter_vmap(_make)(keys)
    assert ensemble.w.shape == (4, 2, 3) and ensemble.b.shape == (4, 2)
    assert ensemble.act is jnp.tanh
    x = jnp.arange(3.0)
    out = tm.filter_vmap(lambda m, x: m(x), in_axes=(tm.if_array(0), None))(ensemble, x)
    for i, key in enumerate(keys):  # each member equals the model built alone
        np.testing.assert_allclose(out[i], _make(key)(x), rtol=1e-5)


def test_module_as_function_is_broadcast() -> None:
    model = _make(jax.random.key(1))
    xs = jnp.arange(12.0).reshape(4, 3)
    out = tm.filter_vmap(model)(xs)
    expected = np.stack([np.tanh(np.asarray(model.w) @ np.asarray(x) + model.b) for x in xs])
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_non_array_arguments_and_outputs_are_static() -> None:
    def f(x: jax.Array, name: str, power: int) -> tuple[jax.Array, str]:
        return x**power, name * 2

    out, name = tm.filter_vmap(f)(jnp.arange(3.0), "ab", 2)
    np.testing.assert_allclose(out, [0.0, 1.0, 4.0])
    assert name == "abab"


def test_in_axes_and_out_axes() -> None:
    x = jnp.arange(6.0).reshape(2, 3)
    y = jnp.ones(3)

    def f(x: jax.Array, y: jax.Array) -> dict:
        return {"outer": x[:, None] * y[None, :], "y": y}

    out = tm.filter_vmap(f, in_axes=(1, None), out_axes={"outer": 2, "y": None})(x, y)
    expected = np.stack([np.outer(np.asarray(x)[:, i], y) for i in range(3)], axis=2)
    np.testing.assert_allclose(out["outer"], expected)
    np.testing.assert_allclose(out["y"], y)
    assert tm.filter_vmap(lambda x: x, in_axes=tm.if_array(1))(x).shape == (3, 2)
    assert tm.filter_vmap(lambda x: x, out_axes=-1)(x).shape == (3, 2)


def test_keyword_arguments_are_batched_on_axis_0() -> None:
    out = tm.filter_vmap(lambda x, *, y: x + y, in_axes=(None,))(jnp.ones(2), y=jnp.arange(3.0))
    assert out.shape == (3, 2)


def test_axis_name_and_axis_size() -> None:
    x = jnp.arange(4.0)
    out = tm.filter_vmap(lambda x: x / jax.lax.psum(x, "batch"), axis_name="batch")(x)
    np.testing.assert_allclose(out, x / 6.0)
    models = tm.filter_vmap(lambda: Affine(jnp.zeros((2, 3)), jnp.ones(2)), axis_size=5)()
    assert models.w.shape == (5, 2, 3)


def test_composes_with_filter_jit_and_grad() -> None:
    ensemble = tm.filter_vmap(_make)(jax.random.split(jax.random.key(0), 3))
    x = jnp.arange(3.0)

    @tm.filter_jit
    def loss(m: Affine) -> jax.Array:
        return jnp.sum(tm.filter_vmap(lambda m: m(x))(m))

    grads = tm.filter_grad(loss)(ensemble)
    assert grads.w.shape == (3, 2, 3)


def test_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match=r"in_axes maps axis 0 of args\[1\], which is a str"):
        tm.filter_vmap(lambda x, s: x, in_axes=0)(jnp.ones(2), "a")
    with pytest.raises(ValueError, match="in_axes has 1 entries but .* 2 positional"):
        tm.filter_vmap(lambda x, y: x, in_axes=(0,))(jnp.ones(2), jnp.ones(2))
    with pytest.raises(ValueError, match="no argument is batched"):
        tm.filter_vmap(lambda s: s)("a")
    with pytest.raises(TypeError, match="in_axes must be an int, None, a callable"):
        tm.filter_vmap(lambda x: x, in_axes=[0])(jnp.ones(2))
    with pytest.raises(TypeError, match="expects a callable"):
        tm.filter_vmap(3)  # type: ignore[arg-type]
