"""Partial: functools.partial as a module whose bound arrays are pytree leaves."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod as tm


def _f(a: Any, b: Any, c: Any = 0, *, d: Any = 1) -> tuple[Any, Any, Any, Any]:
    return a, b, c, d


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(), max_size=3),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.sampled_from(["c", "d"]), st.integers(), max_size=2),
    st.dictionaries(st.sampled_from(["d"]), st.integers(), max_size=1),
)
def test_calls_like_functools_partial(
    bound: list[int], given_args: list[int], bound_kw: dict[str, int], given_kw: dict[str, int]
) -> None:
    expected = functools.partial(_f, *bound, **bound_kw)
    got = tm.Partial(_f, *bound, **bound_kw)
    try:
        want = expected(*given_args, **given_kw)
    except TypeError:
        with pytest.raises(TypeError):
            got(*given_args, **given_kw)
        return
    assert got(*given_args, **given_kw) == want


def test_bound_arrays_are_leaves_traced_and_differentiated() -> None:
    w = jnp.asarray([1.0, -2.0])
    scale = tm.Partial(lambda w, x: jnp.sum(jnp.tanh(w * x)), w)
    assert [leaf for leaf in jax.tree_util.tree_leaves(scale) if tm.is_array(leaf)] == [w]

    @tm.filter_jit
    @tm.debug.assert_max_traces(max_traces=1)
    def apply(f: tm.Partial, x: jax.Array) -> jax.Array:
        return f(x)

    x = jnp.asarray([0.5, 0.25])
    apply(scale, x)
    rebuilt = tm.Partial(scale.func, w * 3)  # new arrays, same function: no retrace
    np.testing.assert_allclose(apply(rebuilt, x), jnp.sum(jnp.tanh(3 * w * x)), rtol=1e-6)
    grads = tm.filter_grad(lambda f: f(x))(scale)
    expected = jax.grad(lambda w: jnp.sum(jnp.tanh(w * x)))(w)
    np.testing.assert_allclose(grads.args[0], expected, rtol=1e-6)


def test_non_callable_is_an_error_naming_partial() -> None:
    with pytest.raises(TypeError, match=r"Partial: `func` must be callable; got int"):
        tm.Partial(3)  # type: ignore[arg-type]
