"""filter_make_jaxpr: against jax.make_jaxpr, with static leaves and abstract inputs."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import treemod as tm
import treemod.nn as nn


def test_equals_jax_make_jaxpr_on_arrays() -> None:
    def f(x: jax.Array, y: dict[str, jax.Array]) -> Any:
        return {"a": jnp.sin(x) * y["w"], "b": [x.sum(), y["w"] @ y["w"]]}

    x, y = jnp.ones(3), {"w": jnp.arange(3.0)}
    expected, expected_shape = jax.make_jaxpr(f, return_shape=True)(x, y)
    jaxpr, out_struct, out_static = tm.filter_make_jaxpr(f)(x, y)
    assert str(jaxpr) == str(expected)
    assert out_struct == expected_shape
    assert jax.tree_util.tree_leaves(out_static) == []


def test_static_leaves_are_fixed_and_abstract_inputs_accepted() -> None:
    linear = nn.Linear(4, 2, key=jax.random.key(0))

    def f(model: nn.Linear, x: jax.Array, act: Any, tag: str) -> Any:
        return {"y": act(model(x)), "tag": tag, "act": act}

    x = jax.ShapeDtypeStruct((5, 4), jnp.float32)
    jaxpr, out_struct, out_static = tm.filter_make_jaxpr(f)(linear, x, jax.nn.relu, "t")
    # Inputs: the weight, the bias and x; the function and the tag are not.
    assert [v.aval.shape for v in jaxpr.jaxpr.invars] == [(2, 4), (2,), (5, 4)]
    assert out_struct == {"y": jax.ShapeDtypeStruct((5, 2), jnp.float32), "tag": None, "act": None}
    assert out_static == {"y": None, "tag": "t", "act": jax.nn.relu}
    assert tm.combine(out_struct, out_static)["tag"] == "t"
    # The jaxpr computes what the function computes.
    xs = jnp.asarray(np.random.default_rng(0).standard_normal((5, 4)), jnp.float32)
    (y,) = jax.core.eval_jaxpr(jaxpr.jaxpr, jaxpr.consts, linear.weight, linear.bias, xs)
    np.testing.assert_allclose(y, jax.nn.relu(xs @ linear.weight.T + linear.bias[None]), rtol=1e-6)


def test_keyword_arguments_are_traced_too() -> None:
    jaxpr, out_struct, _ = tm.filter_make_jaxpr(lambda *, x, n: x * n)(x=jnp.ones(2), n=3.0)
    assert len(jaxpr.jaxpr.invars) == 1 and out_struct.shape == (2,)
