"""filter_jacfwd / filter_jacrev / filter_hessian: against jax.jacfwd / jacrev / hessian and
central finite differences."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

import treemod as tm
import treemod.nn as nn

from strategies import float_trees

jtu = jax.tree_util


def _outputs(tree: Any, x: jax.Array) -> dict[str, jax.Array]:
    """Two outputs mixing every leaf nonlinearly."""
    total = sum((jnp.sum(jnp.sin(leaf) * x) for leaf in jtu.tree_leaves(tree)), jnp.float32(0))
    return {"pair": jnp.stack([total, total**2]), "scalar": jnp.cos(total)}


def _assert_trees_close(ours: Any, theirs: Any, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert jtu.tree_structure(ours) == jtu.tree_structure(theirs)
    for a, b in zip(jtu.tree_leaves(ours), jtu.tree_leaves(theirs), strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


@settings(max_examples=10, deadline=None)
@given(float_trees(2))
def test_jacobians_equal_jax_on_array_trees(tree: Any) -> None:
    tree = jtu.tree_map(jnp.asarray, tree)
    x = jnp.float32(0.7)
    scalar = lambda t, x: _outputs(t, x)["scalar"]  # noqa: E731
    pairs = [
        (tm.filter_jacfwd(_outputs), jax.jacfwd(_outputs)),
        (tm.filter_jacrev(_outputs), jax.jacrev(_outputs)),
        (tm.filter_hessian(scalar), jax.hessian(scalar)),
    ]
    # Every side under one jax.jit: one compilation per example instead of one per op and shape.
    results = jax.jit(lambda t, x: [(ours(t, x), theirs(t, x)) for ours, theirs in pairs])(tree, x)
    for ours, theirs in results:
        _assert_trees_close(ours, theirs)


class _Net(tm.Module):
    linear: nn.Linear
    count: tm.State
    steps: jax.Array  # an integer array: not differentiated
    act: Any = tm.field(static=True, default=jnp.tanh)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.act(self.linear(x)) * self.steps


def _net() -> _Net:
    linear = nn.Linear(3, 2, key=jax.random.key(0), dtype=jnp.float64)
    return _Net(linear, tm.State(jnp.zeros((), jnp.float64)), jnp.array(2))


def _with(model: _Net, name: str, value: jax.Array) -> _Net:
    """`model` with `model.linear.<name>` replaced."""
    return tm.tree_at(lambda m: getattr(m.linear, name), model, value)


def test_a_module_gets_none_outside_its_parameters_and_matches_finite_differences() -> None:
    with jax.enable_x64(True):
        model, x = _net(), jnp.array([0.3, -0.2, 0.5])
        for transform in (tm.filter_jacfwd, tm.filter_jacrev):
            jac = transform(lambda m, x: m(x))(model, x)
            assert jac.count is None and jac.steps is None and jac.act is jnp.tanh
            assert jac.linear.weight.shape == (2, 2, 3) and jac.linear.bias.shape == (2, 2)
            eps = 1e-6
            for name in ("weight", "bias"):
                leaf = getattr(model.linear, name)
                for index in np.ndindex(leaf.shape):
                    bump = jnp.zeros_like(leaf).at[index].set(eps)
                    up, down = _with(model, name, leaf + bump), _with(model, name, leaf - bump)
                    numeric = (up(x) - down(x)) / (2 * eps)
                    got = getattr(jac.linear, name)[(slice(None), *index)]
                    np.testing.assert_allclose(got, numeric, rtol=1e-7, atol=1e-9)


def test_hessian_matches_finite_differences_of_the_gradient() -> None:
    with jax.enable_x64(True):
        model, x = _net(), jnp.array([0.3, -0.2, 0.5])
        loss = lambda m, x: jnp.sum(m(x) ** 2)  # noqa: E731
        hess = tm.filter_hessian(loss)(model, x)
        eps, bias = 1e-6, model.linear.bias
        for i in range(bias.shape[0]):
            bump = jnp.zeros_like(bias).at[i].set(eps)
            up = tm.filter_grad(loss)(_with(model, "bias", bias + bump), x)
            down = tm.filter_grad(loss)(_with(model, "bias", bias - bump), x)
            for name in ("weight", "bias"):
                numeric = (getattr(up.linear, name) - getattr(down.linear, name)) / (2 * eps)
                # hess.linear.<name> is d(gradient of <name>) / d(parameters), a tree of them
                got = getattr(hess.linear, name).linear.bias[..., i]
                np.testing.assert_allclose(got, numeric, rtol=1e-6, atol=1e-8)
            assert hess.linear.weight.count is None


def test_has_aux_returns_the_aux_unchanged() -> None:
    def f(p: dict, x: jax.Array) -> tuple[jax.Array, dict]:
        return p["w"] * x, {"note": "kept", "x": x}

    p, x = {"w": jnp.array([1.0, 2.0])}, jnp.array([3.0, 4.0])
    for transform in (tm.filter_jacfwd, tm.filter_jacrev):
        jac, aux = transform(f, has_aux=True)(p, x)
        np.testing.assert_allclose(jac["w"], jnp.diag(x))
        assert aux["note"] == "kept"
    hess, aux = tm.filter_hessian(lambda p: ((p["w"] ** 3).sum(), "aux"), has_aux=True)(p)
    np.testing.assert_allclose(hess["w"]["w"], jnp.diag(6 * p["w"]))
    assert aux == "aux"


def test_decorator_form_and_jit() -> None:
    @tm.filter_jit
    @tm.filter_jacrev
    def jac(p: dict) -> jax.Array:
        return jnp.stack([p["w"].sum(), (p["w"] ** 2).sum()])

    np.testing.assert_allclose(jac({"w": jnp.array([1.0, 2.0])})["w"], [[1, 1], [2, 4]])


@pytest.mark.parametrize("name", ["filter_jacfwd", "filter_jacrev", "filter_hessian"])
def test_calling_without_the_first_argument_names_the_transform(name: str) -> None:
    wrapped = getattr(tm, name)(lambda p: p)
    with pytest.raises(TypeError, match=rf"with {name} must be called with their first .* \(p\)"):
        wrapped(p=jnp.ones(2))
