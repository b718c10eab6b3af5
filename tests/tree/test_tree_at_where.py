"""`tree_at`'s `where` must return nodes; computing with a leaf gets an error that says so,
naming the leaf's key path and what to do instead (never the internal stand-in's class)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm
from treemod import nn


@pytest.fixture
def model() -> Any:
    return {"layer": nn.Linear(3, 4, key=jax.random.key(0)), "scale": 2.0}


@pytest.mark.parametrize(
    "where, what",
    [
        (lambda m: m["layer"].weight.T, "used `.T` on the leaf at ['layer'].weight"),
        (
            lambda m: m["layer"].weight.reshape(-1),
            "used `.reshape` on the leaf at ['layer'].weight",
        ),
        (lambda m: m["layer"].bias[0], "used `[0]` on the leaf at ['layer'].bias"),
        (lambda m: m["scale"].real, "used `.real` on the leaf at ['scale']"),
    ],
)
def test_where_that_computes_with_a_leaf(model: Any, where: Any, what: str) -> None:
    with pytest.raises(TypeError) as e:
        tm.tree_at(where, model, jnp.zeros((3, 4)))
    msg = str(e.value)
    assert msg.startswith(f"tree_at: `where` {what}.") and "_Marker" not in msg
    assert "replace_fn=lambda w: w.T" in msg


@pytest.mark.parametrize(
    "where", [lambda m: jnp.sum(m["scale"]), lambda m: jnp.transpose(m["layer"].weight)]
)  # JAX's conversion cannot be hooked: the message names no path (operators do, below)
def test_where_that_does_arithmetic_or_calls_jax(model: Any, where: Any) -> None:
    with pytest.raises(TypeError, match="^tree_at: `where` computed with a leaf of the tree") as e:
        tm.tree_at(where, model, 0.0)
    assert "_Marker" not in str(e.value)


def test_the_suggested_fix_works(model: Any) -> None:
    new = tm.tree_at(lambda m: m["layer"].weight, model, replace_fn=lambda w: w * 2)
    assert jnp.array_equal(new["layer"].weight, model["layer"].weight * 2)


def test_errors_of_where_itself_are_left_alone(model: Any) -> None:
    with pytest.raises(AttributeError, match="'Linear' object has no attribute 'nope'"):
        tm.tree_at(lambda m: m["layer"].nope, model, 0.0)
    with pytest.raises(KeyError):
        tm.tree_at(lambda m: m["missing"], model, 0.0)


@pytest.mark.parametrize(
    "where, what",
    [
        (lambda m: m["layer"].weight + 1, "used `+` on the leaf at ['layer'].weight"),
        (lambda m: 2 * m["scale"], "used `*` on the leaf at ['scale']"),
        (lambda m: m["layer"].weight @ m["layer"].weight, "used `@` on the leaf at ['layer']"),
        (lambda m: -m["layer"].bias, "used unary `-` on the leaf at ['layer'].bias"),
        (lambda m: m["layer"].bias > 0, "used a comparison on the leaf at ['layer'].bias"),
        (lambda m: len(m["layer"].bias), "used `len()` on the leaf at ['layer'].bias"),
        (lambda m: list(m["layer"].bias), "used iteration on the leaf at ['layer'].bias"),
        (lambda m: float(m["scale"]), "used `float()` on the leaf at ['scale']"),
        (lambda m: np.asarray(m["layer"].weight), "used a NumPy function (np.asarray, ...)"),
    ],
)
def test_operators_on_a_leaf_name_it(model: Any, where: Any, what: str) -> None:
    with pytest.raises(TypeError) as e:
        tm.tree_at(where, model, 0.0)
    assert str(e.value).startswith(f"tree_at: `where` {what}"), str(e.value)


def test_a_leaf_is_still_true_and_found_by_identity(model: Any) -> None:
    # `bool` keeps Python's default (not len(), which now raises), so `or` still selects.
    new = tm.tree_at(lambda m: m["layer"].bias or m["layer"].weight, model, replace_fn=abs)
    assert jnp.array_equal(new["layer"].bias, abs(model["layer"].bias))
    pair = tm.tree_at(lambda m: (m["scale"], m["layer"].bias), model, (3.0, None))
    assert pair["scale"] == 3.0 and pair["layer"].bias is None
