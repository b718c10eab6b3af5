"""filter_custom_jvp: against jax.custom_jvp and the function's true derivative."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod as tm

seen: list[Any] = []


@tm.filter_custom_jvp
def scaled_power(params: dict, x: jax.Array, power: int, *, offset: jax.Array) -> jax.Array:
    return params["w"] * x**power + offset + params["steps"].astype(x.dtype)


@scaled_power.def_jvp
def scaled_power_jvp(primals: tuple, tangents: tuple, *, offset: jax.Array) -> tuple:
    params, x, power = primals
    t_params, t_x, t_power = tangents
    seen.append((t_params["steps"], t_power, t_x is None))
    out = scaled_power(params, x, power, offset=offset)
    t_out = 0.0 * out  # built up from the tangents that are there
    if t_params["w"] is not None:
        t_out = t_out + t_params["w"] * x**power
    if t_x is not None:
        t_out = t_out + params["w"] * power * x ** (power - 1) * t_x
    return out, t_out


def _plain(w: jax.Array, x: jax.Array) -> jax.Array:
    return w * x**3 + 0.5 + 2


@settings(max_examples=15, deadline=None)
@given(w=st.floats(-3, 3, width=32), x=st.floats(-2, 2, width=32))
def test_derivatives_equal_those_of_the_plain_function(w: float, x: float) -> None:
    w_, x_ = jnp.float32(w), jnp.float32(x)
    params = {"w": w_, "steps": jnp.int32(2)}

    def ours(w: jax.Array, x: jax.Array) -> jax.Array:
        return scaled_power({"w": w, "steps": params["steps"]}, x, 3, offset=jnp.float32(0.5))

    for argnums in (0, 1, (0, 1)):
        got = jax.jit(jax.grad(ours, argnums=argnums))(w_, x_)
        want = jax.grad(_plain, argnums=argnums)(w_, x_)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    _, t = jax.jvp(ours, (w_, x_), (jnp.float32(1.0), jnp.float32(0.0)))
    _, want = jax.jvp(_plain, (w_, x_), (jnp.float32(1.0), jnp.float32(0.0)))
    np.testing.assert_allclose(t, want, rtol=1e-5, atol=1e-5)


def test_the_rule_is_used_and_sees_none_where_there_is_no_tangent() -> None:
    seen.clear()
    params = {"w": jnp.float32(2.0), "steps": jnp.int32(1)}
    grads = tm.filter_grad(lambda p: scaled_power(p, jnp.float32(3.0), 2, offset=jnp.zeros(())))(
        params
    )
    assert float(grads["w"]) == 9.0 and grads["steps"] is None
    # the integer leaf, the static power and x (not differentiated: a symbolic zero) get None
    assert seen == [(None, None, True)]


def test_a_rule_that_replaces_the_derivative_is_what_grad_returns() -> None:
    @tm.filter_custom_jvp
    def straight_through(x: jax.Array) -> jax.Array:
        return jnp.round(x)

    @straight_through.def_jvp
    def _(primals: tuple, tangents: tuple) -> tuple:
        return straight_through(*primals), tangents[0]  # identity derivative

    x = jnp.array([0.2, 1.7])
    np.testing.assert_array_equal(jax.grad(lambda x: straight_through(x).sum())(x), [1.0, 1.0])
    np.testing.assert_array_equal(jax.grad(lambda x: jnp.round(x).sum())(x), [0.0, 0.0])


def test_none_in_the_output_tangent_means_zero() -> None:
    @tm.filter_custom_jvp
    def pair(x: jax.Array) -> dict:
        return {"kept": x * 2, "frozen": x + 1}

    @pair.def_jvp
    def _(primals: tuple, tangents: tuple) -> tuple:
        (x,), (tx,) = primals, tangents
        return pair(x), {"kept": 2 * tx, "frozen": None}

    out, t = jax.jvp(pair, (jnp.float32(1.0),), (jnp.float32(1.0),))
    assert float(t["kept"]) == 2.0 and float(t["frozen"]) == 0.0


def test_calling_before_def_jvp_names_the_function() -> None:
    @tm.filter_custom_jvp
    def lonely(x: jax.Array) -> jax.Array:
        return x

    with pytest.raises(RuntimeError, match=r"filter_custom_jvp\(.*lonely\): define the JVP"):
        lonely(jnp.ones(2))
