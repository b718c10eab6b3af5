"""The three meanings of "array", one per place (docs: "What counts as an array").

- The public predicates (`tm.is_array`, ...): arrays with values and `jax.ShapeDtypeStruct`s.
- The filtered transforms: arrays with values only (`is_traceable_array`); a
  `jax.ShapeDtypeStruct` is static, as in Equinox.
- `treemod.compat.equinox.is_array`: Equinox's own (checked against real Equinox).
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm
import treemod.compat.equinox as teqx
from treemod._tree.filters import IS_ARRAY_TYPE, is_traceable_array

LEAVES = {
    "jax array": jnp.ones(3),
    "numpy array": np.ones(3, np.float32),
    "numpy scalar": np.float32(1.0),
    "ShapeDtypeStruct": jax.ShapeDtypeStruct((3,), jnp.float32),
    "python float": 1.5,
    "python int": 2,
    "string": "relu",
}
# (public predicates, the transforms) per leaf.
EXPECTED = {
    "jax array": (True, True),
    "numpy array": (True, True),
    "numpy scalar": (True, True),
    "ShapeDtypeStruct": (True, False),
    "python float": (False, False),
    "python int": (False, False),
    "string": (False, False),
}


@tm.filter_jit
def _traced(leaf: Any) -> bool:
    return isinstance(leaf, jax.core.Tracer)


def _differentiated(leaf: Any) -> bool:
    """Whether `filter_grad` gives `leaf` a gradient (it must be floating point to get one)."""

    def loss(tree: tuple[Any, jax.Array]) -> jax.Array:
        return jnp.sum(tree[1])

    grads = tm.filter_grad(loss)((leaf, jnp.ones(())))
    return grads[0] is not None


@pytest.mark.parametrize("name", sorted(LEAVES))
def test_each_place_has_one_meaning(name: str) -> None:
    leaf, (public, transforms) = LEAVES[name], EXPECTED[name]
    assert tm.is_array(leaf) is public
    assert is_traceable_array(leaf) is transforms is IS_ARRAY_TYPE[type(leaf)]
    # The transforms' meaning is what they do: trace the leaf, and differentiate it (all the
    # arrays here are floating point).
    assert bool(_traced(leaf)) is transforms
    assert _differentiated(leaf) is transforms
    # The compat namespace's predicate is Equinox's, leaf by leaf.
    assert teqx.is_array(leaf) is eqx.is_array(leaf)
    assert teqx.is_inexact_array(leaf) is eqx.is_inexact_array(leaf)


def test_traced_values_count_as_arrays_everywhere() -> None:
    seen = []

    @jax.jit
    def inside(x: jax.Array) -> jax.Array:
        seen.append((tm.is_array(x), is_traceable_array(x), teqx.is_array(x), eqx.is_array(x)))
        return x

    inside(jnp.ones(2))
    assert seen == [(True, True, True, True)]
