"""The per-signature check cache: a signature that passed skips the checks, and every check
that fails still fails, with jaxtyping's reason, whatever passed before."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float, Int

import treemod as tm


@pytest.fixture(autouse=True)
def _checks_on(shape_checks_on: Any) -> None:
    """Shape checks on for each test (the conftest fixture restores the setting)."""


class Affine(tm.Module):
    weight: Float[Array, "out in"]
    bias: Float[Array, " out"]

    def __call__(self, x: Float[Array, "n in"]) -> Float[Array, "n out"]:
        return x @ self.weight.T + self.bias[None, :]


def _affine(out: int, inp: int) -> Affine:
    return Affine(jnp.ones((out, inp)), jnp.zeros(out))


def test_a_seen_signature_still_computes() -> None:
    layer = _affine(4, 3)
    x = jnp.arange(6.0).reshape(2, 3)
    for _ in range(3):
        np.testing.assert_allclose(
            np.asarray(layer(x)), np.arange(6.0).reshape(2, 3) @ np.ones((3, 4))
        )


def test_new_argument_shapes_are_checked_after_good_ones() -> None:
    layer = _affine(4, 3)
    layer(jnp.ones((2, 3)))
    with pytest.raises(tm.ShapeCheckError, match=r"Affine.__call__ argument x: expected .*in=3"):
        layer(jnp.ones((2, 5)))


def test_fields_are_part_of_the_signature() -> None:
    _affine(4, 3)(jnp.ones((2, 3)))
    wide = tm.tree_at(lambda m: m.weight, _affine(4, 3), jnp.ones((4, 5)))
    with pytest.raises(tm.ShapeCheckError, match=r"Affine.__call__ argument x"):
        wide(jnp.ones((2, 3)))


def test_dtypes_are_part_of_the_signature() -> None:
    @tm.shapecheck
    def double(x: Float[Array, " n"]) -> Float[Array, " n"]:
        return x * 2

    double(jnp.ones(3))
    with pytest.raises(tm.ShapeCheckError, match=r"double argument x"):
        double(jnp.ones(3, jnp.int32))


def test_dimensions_shared_between_arguments() -> None:
    @tm.shapecheck
    def add(x: Float[Array, " n"], y: Float[Array, " n"]) -> Float[Array, " n"]:
        return x + y

    add(jnp.ones(3), jnp.ones(3))
    add(jnp.ones(3), y=jnp.ones(3))
    with pytest.raises(tm.ShapeCheckError, match=r"add argument y: expected .*n=3"):
        add(jnp.ones(3), jnp.ones(4))
    with pytest.raises(tm.ShapeCheckError, match=r"add argument y"):
        add(jnp.ones(3), y=jnp.ones(4))


def test_a_bad_return_value_fails_after_the_same_arguments_passed() -> None:
    bad = {"now": False}

    @tm.shapecheck
    def same(x: Float[Array, " n"]) -> Float[Array, " n"]:
        return x[:-1] if bad["now"] else x

    same(jnp.ones(3))
    same(jnp.ones(3))
    bad["now"] = True
    with pytest.raises(tm.ShapeCheckError, match=r"same return value: expected .*n=3"):
        same(jnp.ones(3))


def test_non_array_values_take_the_full_check() -> None:
    @tm.shapecheck
    def count(x: Int[Array, " n"] | None) -> Int[Array, ""]:
        return jnp.asarray(0 if x is None else x.shape[0])

    assert int(count(None)) == 0
    assert int(count(jnp.ones(3, jnp.int32))) == 3
    with pytest.raises(tm.ShapeCheckError, match=r"count argument x"):
        count([1, 2, 3])  # type: ignore[arg-type]


def test_tracers_are_checked_once_per_signature() -> None:
    layer = _affine(4, 3)
    f = jax.jit(lambda m, x: m(x))
    np.testing.assert_allclose(np.asarray(f(layer, jnp.ones((2, 3)))), 3 * np.ones((2, 4)))
    with pytest.raises(tm.ShapeCheckError, match=r"Affine.__call__ argument x"):
        f(layer, jnp.ones((2, 4)))
