"""The rest of Equinox's public API in treemod.compat.equinox, against real Equinox."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm
import treemod.compat.equinox as teqx

eqx = pytest.importorskip("equinox")


def _same_type(a: object, b: object) -> bool:
    return type(a) is type(b) and bool(a == b)


@pytest.mark.parametrize(
    ("x", "y", "kwargs"),
    [
        (jnp.ones(2), jnp.ones(2), {}),
        (jnp.ones(2), jnp.zeros(2), {}),
        (jnp.ones(2), jnp.ones(3), {}),
        (np.ones(2), np.ones(2), {}),
        (np.ones(2), jnp.ones(2), {}),
        (np.ones(2), jnp.ones(2), {"typematch": True}),
        (jnp.ones(2), jnp.ones(2) + 1e-4, {"atol": 1e-3}),
        ({"a": 1, "b": jnp.ones(())}, {"a": 1, "b": jnp.ones(())}, {}),
        ({"a": 1, "b": jnp.ones(())}, {"a": 2, "b": jnp.ones(())}, {}),
        ([1.0, "s"], [1.0, "s"], {}),
        (1.0, jnp.float32(1.0), {}),
    ],
)
def test_tree_equal_gives_equinox_result_types(x: object, y: object, kwargs: dict) -> None:
    ours, theirs = teqx.tree_equal(x, y, **kwargs), eqx.tree_equal(x, y, **kwargs)
    assert _same_type(ours, theirs), (ours, theirs)
    assert bool(tm.tree_equal(x, y, **kwargs)) == bool(theirs)  # treemod proper: same answer


def test_tree_equal_under_jit_is_traced_as_in_equinox() -> None:
    out = jax.jit(lambda a, b: teqx.tree_equal(a, b))(jnp.ones(2), jnp.ones(2))
    assert isinstance(out, jax.Array) and out.dtype == jnp.bool_ and bool(out)


def test_runtime_error_names() -> None:
    assert teqx.EquinoxRuntimeError is tm.RuntimeCheckError
    assert teqx.EquinoxTracetimeError is tm.RuntimeCheckError
    with pytest.raises(teqx.EquinoxRuntimeError, match="negative"):
        teqx.error_if(jnp.ones(()), jnp.array(True), "negative")


def test_debug_namespace_matches_equinox() -> None:
    assert set(teqx.debug.__all__) >= {
        n for n in dir(eqx.debug) if not n.startswith("_") and n != "announce_transform"
    }
