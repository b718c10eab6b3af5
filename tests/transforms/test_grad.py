"""filter_grad / filter_value_and_grad: against jax.grad, finite differences, optax."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings

import treemod as tm

from strategies import float_trees

_trees = float_trees(3)


def _loss(tree: Any, scale: jax.Array) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(tree)
    return sum((jnp.sum(jnp.sin(x) * scale) for x in leaves), jnp.float32(0))


@settings(max_examples=10, deadline=None)
@given(_trees)
def test_equals_jax_grad_on_array_trees(tree: Any) -> None:
    tree = jax.tree_util.tree_map(jnp.asarray, tree)
    scale = jnp.float32(1.5)
    expected_value, expected = jax.value_and_grad(_loss)(tree, scale)
    value, grads = tm.filter_value_and_grad(_loss)(tree, scale)
    np.testing.assert_allclose(value, expected_value, rtol=1e-6)
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(expected)
    leaves = jax.tree_util.tree_leaves
    for g, e in zip(leaves(grads), leaves(expected), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-6)
    grads_only = tm.filter_grad(_loss)(tree, scale)
    assert jax.tree_util.tree_structure(grads_only) == jax.tree_util.tree_structure(expected)


class Model(tm.Module):
    weight: jax.Array
    bias: jax.Array
    count: tm.State
    steps: jax.Array  # an integer array: not differentiable
    act: Any = jnp.tanh
    name: str = tm.field(static=True, default="m")

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.act(self.weight @ x + self.bias)


def _model() -> Model:
    kw, kb = jax.random.split(jax.random.key(0))
    return Model(
        jax.random.normal(kw, (2, 3)),
        jax.random.normal(kb, (2,)),
        tm.State(jnp.zeros(())),
        jnp.array(5, jnp.int32),
    )


def _model_loss(m: Model, x: jax.Array) -> jax.Array:
    return jnp.sum(m(x) ** 2) + 0.0 * m.count.value


def test_structure_is_filter_is_param_and_skips_state() -> None:
    model, x = _model(), jnp.array([0.5, -1.0, 2.0])
    grads = tm.filter_grad(_model_loss)(model, x)
    params = tm.filter(model, tm.is_param)
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(params)
    assert grads.count is None and grads.steps is None and grads.act is None
    assert grads.name == "m"


def test_matches_finite_differences() -> None:
    model, x = _model(), jnp.array([0.5, -1.0, 2.0])
    grads = tm.filter_grad(_model_loss)(model, x)
    w = np.asarray(model.weight, np.float64)
    b = np.asarray(model.bias, np.float64)
    xs = np.asarray(x, np.float64)

    def f(w: np.ndarray, b: np.ndarray) -> float:
        return float(np.sum(np.tanh(w @ xs + b) ** 2))

    eps = 1e-6
    fd_w = np.zeros_like(w)
    for i in np.ndindex(w.shape):
        d = np.zeros_like(w)
        d[i] = eps
        fd_w[i] = (f(w + d, b) - f(w - d, b)) / (2 * eps)
    fd_b = np.array([(f(w, b + e) - f(w, b - e)) / (2 * eps) for e in np.eye(2) * eps])
    np.testing.assert_allclose(grads.weight, fd_w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads.bias, fd_b, rtol=1e-4, atol=1e-5)


def test_has_aux() -> None:
    def loss(m: Model, x: jax.Array) -> tuple[jax.Array, dict]:
        out = m(x)
        return jnp.sum(out), {"out": out, "tag": "aux"}

    model, x = _model(), jnp.ones(3)
    (value, aux), grads = tm.filter_value_and_grad(loss, has_aux=True)(model, x)
    grads2, aux2 = tm.filter_grad(has_aux=True)(loss)(model, x)
    np.testing.assert_allclose(value, jnp.sum(model(x)))
    assert aux["tag"] == aux2["tag"] == "aux"
    np.testing.assert_allclose(grads.weight, grads2.weight)


def test_optax_with_weight_decay_under_filter_jit() -> None:
    model, x = _model(), jnp.array([0.5, -1.0, 2.0])
    # (adam's bias correction mixes int and float, which the strict promotion of the test
    # suite rejects; decayed weights + momentum SGD exercise the same tree handling.)
    optimiser = optax.chain(optax.add_decayed_weights(1e-1), optax.sgd(1e-2, momentum=0.9))
    opt_state = optimiser.init(tm.filter(model, tm.is_param))

    @tm.filter_jit
    def step(m: Model, opt_state: Any, x: jax.Array) -> tuple[Model, Any, jax.Array]:
        loss, grads = tm.filter_value_and_grad(_model_loss)(m, x)
        updates, opt_state = optimiser.update(grads, opt_state, tm.filter(m, tm.is_param))
        return tm.apply_updates(m, updates), opt_state, loss

    losses = []
    for _ in range(5):
        model, opt_state, loss = step(model, opt_state, x)
        losses.append(float(loss))
    assert losses[-1] < losses[0]
    assert int(model.steps) == 5 and model.name == "m"
    assert tm.debug.get_num_traces(step) == 1


def test_other_arguments_are_not_differentiated() -> None:
    grads = tm.filter_grad(lambda a, b: jnp.sum(a * b))(jnp.ones(2), jnp.full(2, 3.0))
    np.testing.assert_allclose(grads, [3.0, 3.0])


def test_as_method_decorator() -> None:
    class Scaled(tm.Module):
        w: jax.Array

        @tm.filter_grad
        def grad_of_square(self, x: jax.Array) -> jax.Array:
            return jnp.sum((self.w * x) ** 2)

    g = Scaled(jnp.array([1.0, 2.0])).grad_of_square(jnp.array([3.0, 1.0]))
    np.testing.assert_allclose(g.w, [18.0, 4.0])


def test_first_argument_required() -> None:
    want = r"wrapped with filter_grad must be called with their first.*filter_grad\(<lambda>\)"
    with pytest.raises(TypeError, match=want):
        tm.filter_grad(lambda m: 0.0)(m=1.0)


def test_filter_custom_vjp_against_the_true_gradient() -> None:
    # A custom VJP equal to the analytic one must match jax.grad of the plain function.
    def plain(params: dict, x: jax.Array, label: str) -> jax.Array:
        return jnp.sum(jnp.sin(params["w"] * x)) + params["n"]

    @tm.filter_custom_vjp
    def f(params: dict, x: jax.Array, label: str) -> jax.Array:
        return plain(params, x, label)

    @f.def_fwd
    def f_fwd(perturbed: Any, params: dict, x: jax.Array, label: str) -> tuple:
        assert perturbed == {"n": False, "w": True} and label == "tag"
        return plain(params, x, label), jnp.cos(params["w"] * x)

    @f.def_bwd
    def f_bwd(cos: jax.Array, g: jax.Array, perturbed: Any, params: dict, x: jax.Array, label: str):
        return {"w": g * cos * x, "n": None}

    params = {"w": jnp.array([0.3, -1.2]), "n": 2}
    x = jnp.array([1.5, 0.5])
    expected = jax.grad(lambda w: plain({"w": w, "n": 2}, x, "tag"))(params["w"])
    grads = tm.filter_grad(lambda p: f(p, x, "tag"))(params)
    np.testing.assert_allclose(grads["w"], expected, rtol=1e-6)
    assert grads["n"] is None
    np.testing.assert_allclose(tm.filter_jit(f)(params, x, "tag"), plain(params, x, "tag"))
    # only the first argument has a custom gradient: differentiating another is an error
    with pytest.raises(RuntimeError, match=r"filter_custom_vjp\(f\): args\[0\] is being diff"):
        jax.grad(lambda x: jnp.sum(f(params, x, "tag")))(x)


def test_filter_custom_vjp_errors() -> None:
    @tm.filter_custom_vjp
    def f(x: dict) -> jax.Array:
        return x["a"]

    with pytest.raises(RuntimeError, match=r"define both passes with `@f.def_fwd`"):
        f({"a": jnp.ones(1)})
    f.def_fwd(lambda perturbed, x: (x["a"], None))
    f.def_bwd(lambda res, g, perturbed, x: [g])  # not the structure of x
    with pytest.raises(ValueError, match=r"filter_custom_vjp\(f\): fn_bwd must return a gradient"):
        jax.grad(lambda x: jnp.sum(f(x)))({"a": jnp.ones(1)})
