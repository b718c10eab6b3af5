"""filter_vmap with a dict in_axes (Equinox's form), against Equinox and plain jax.vmap."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm


def _f(x: jax.Array, y: jax.Array) -> jax.Array:
    return x * 2 + y


def test_dict_in_axes_names_positional_parameters_as_equinox() -> None:
    eqx = pytest.importorskip("equinox")
    x, y = jnp.arange(6.0).reshape(3, 2), jnp.ones(2)
    ours = tm.filter_vmap(_f, in_axes={"y": None})(x, y)
    np.testing.assert_array_equal(ours, eqx.filter_vmap(_f, in_axes={"y": None})(x, y))
    np.testing.assert_array_equal(ours, jax.vmap(_f, in_axes=(0, None))(x, y))


def test_dict_in_axes_names_keyword_arguments() -> None:
    def g(x: jax.Array, *, scale: jax.Array, offset: jax.Array) -> jax.Array:
        return x * scale + offset

    x = jnp.arange(3.0)
    out = tm.filter_vmap(g, in_axes={"x": None, "offset": None})(
        x, scale=jnp.arange(4.0), offset=jnp.ones(())
    )
    np.testing.assert_array_equal(out, np.arange(4.0)[:, None] * np.arange(3.0) + 1)


def test_a_name_that_is_not_an_argument_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"filter_vmap\(_f\): in_axes names \['z'\]"):
        tm.filter_vmap(_f, in_axes={"z": 0})(jnp.ones(2), jnp.ones(2))
