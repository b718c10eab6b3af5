"""filter_pmap against jax.pmap on the 8 fake CPU devices (tests/conftest.py)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm


def test_matches_jax_pmap_with_static_and_broadcast_leaves() -> None:
    x = jnp.arange(8.0 * 3).reshape(8, 3)
    w = jnp.array([1.0, 2.0, 3.0])

    def f(x: jax.Array, w: jax.Array, act: Any) -> tuple[jax.Array, str]:
        return act(x * w), "done"

    out, tag = tm.filter_pmap(f, in_axes=(0, None, None))(x, w, jnp.tanh)
    ref = jax.pmap(lambda x, w: jnp.tanh(x * w), in_axes=(0, None))(x, w)
    np.testing.assert_allclose(out, ref)
    assert tag == "done"


def test_collectives_dict_in_axes_and_kwargs() -> None:
    f = tm.filter_pmap(lambda x, y: jax.lax.psum(x, "i") + y, axis_name="i", in_axes={"y": None})
    x = jnp.arange(8.0)
    np.testing.assert_allclose(f(x, jnp.ones(())), np.full(8, x.sum() + 1))
    g = tm.filter_pmap(lambda x, *, scale: x * scale)
    np.testing.assert_allclose(g(x, scale=jnp.full(8, 2.0)), 2 * x)


def test_compiles_once_per_static_value() -> None:
    calls = []

    def f(x: jax.Array, n: int) -> jax.Array:
        calls.append(n)
        return x * n

    p = tm.filter_pmap(f)
    x = jnp.ones((8, 2))
    p(x, 2)
    p(x, 2)
    p(x, 3)
    assert calls == [2, 3]  # one trace per new static value


def test_axis_size_without_mapped_inputs_and_unmapped_outputs() -> None:
    f = tm.filter_pmap(
        lambda x: (x + 1, jnp.ones(2)), in_axes=None, out_axes=(0, None), axis_size=8
    )
    mapped, unmapped = f(jnp.array(1.0))
    np.testing.assert_array_equal(mapped, np.full(8, 2.0))
    np.testing.assert_array_equal(unmapped, np.ones(2))
    g = tm.filter_pmap(lambda x: x * 2, out_axes=1)
    np.testing.assert_array_equal(g(jnp.ones((8, 3))), np.full((3, 8), 2.0))


def test_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="donate must be one of"):
        tm.filter_pmap(lambda x: x, donate="some")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="static_broadcasted_argnums is not accepted"):
        tm.filter_pmap(lambda x: x, static_broadcasted_argnums=(0,))
    with pytest.raises(ValueError, match="no argument is mapped"):
        tm.filter_pmap(lambda n: n)(3)
    with pytest.raises(
        ValueError, match=r"args\[0\] \(parameter 'x'\), of shape \(\), has no axis"
    ):
        tm.filter_pmap(lambda x: x)(jnp.array(3.0))
    with pytest.raises(ValueError, match="in_axes maps axis 0 of"):
        tm.filter_pmap(lambda x, n: x, in_axes=(0, 0))(jnp.ones((8, 1)), 3)
