"""Transformed functions pickle by reference (module and name), and modules pickle by value.

The reference for every result is the plain function (or `jax.grad`/`jax.vmap` of it) run in
this process; the pickled transformed function runs in a spawned interpreter.
"""

from __future__ import annotations

import functools
import multiprocessing
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pickle_targets as targets
import pytest

import treemod as tm

TRANSFORMED = [
    targets.jitted,
    targets.grad_of_loss,
    targets.value_and_grad_of_loss,
    targets.mapped,
    targets.rematerialised,
    targets.scaled_tanh,
    targets.Affine.jitted_method,
    targets.jitted_grad,
    targets.jacobian_forward,
    targets.jacobian_reverse,
    targets.hessian_of_loss,
    targets.clipped_sin,
    targets.doubled,
]


@pytest.mark.parametrize("function", TRANSFORMED, ids=lambda f: f.__qualname__)
def test_module_level_transformed_functions_pickle_by_reference(function) -> None:
    data = pickle.dumps(function)
    assert b"pickle_targets" in data and len(data) < 200  # a name, not the function's state
    assert pickle.loads(data) is function


def test_modules_pickle_by_value() -> None:
    model = targets.make_model()
    restored = pickle.loads(pickle.dumps(model))
    assert type(restored) is targets.Affine and tm.tree_equal(restored, model)


def test_a_sequential_of_layers_and_jax_functions_crosses_processes() -> None:
    # jax.nn.relu (a custom_jvp) and jnp.tanh (jit-wrapped) do not pickle by themselves; inside
    # a module they go by name, also within a field's tuple (Sequential's layers).
    model = targets.make_sequential()
    x = jnp.array([[0.5, -1.0], [2.0, 0.25]])
    restored = pickle.loads(pickle.dumps(model))
    assert restored.layers[2] is jax.nn.relu and restored.layers[3] is jnp.tanh
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        result = pool.apply(targets.infer, (model, x))
    # Reference: the same computation written out with plain JAX on the model's arrays.
    first, norm, last = model.layers[0], model.layers[1], model.layers[4]
    h = x @ first.weight.T + first.bias[None]
    h = (h - norm.running_mean.value[None]) / jnp.sqrt(norm.running_var.value[None] + norm.eps)
    h = jnp.tanh(jax.nn.relu(h * norm.weight[None] + norm.bias[None]))
    expected = h @ last.weight.T + last.bias[None]
    np.testing.assert_allclose(result, expected, rtol=1e-6, atol=1e-6)


def _expected(model: targets.Affine, x: jax.Array, xs: jax.Array) -> list:
    grads = jax.grad(targets.loss)(model, x)
    return [
        model(x),
        grads,
        (targets.loss(model, x), grads),
        jax.vmap(model)(xs),
        model(x),
        jnp.tanh(x),
        model(x),
        grads,
        jax.jacfwd(lambda m: m(x))(model),
        jax.jacrev(lambda m: m(x))(model),
        jax.hessian(targets.loss)(model, x),
        jnp.clip(jnp.cos(x), -0.5, 0.5),  # the custom backward pass, not sin's derivative
        2 * x[None],
    ]


def test_transformed_functions_and_modules_cross_processes() -> None:
    model, x = targets.make_model(), jnp.array([0.5, -1.0])
    xs = jnp.stack([x, 2 * x, -x])
    calls = [
        (targets.jitted, model, x),
        (targets.grad_of_loss, model, x),
        (targets.value_and_grad_of_loss, model, x),
        (targets.mapped, model, xs),
        (targets.rematerialised, model, x),
        (targets.scaled_tanh, x),
        (targets.Affine.jitted_method, model, x),
        (targets.jitted_grad, model, x),
        (targets.jacobian_forward, model, x),
        (targets.jacobian_reverse, model, x),
        (targets.hessian_of_loss, model, x),
        (targets.clipped_sin, x),
        (targets.doubled, x[None]),
    ]
    context = multiprocessing.get_context("spawn")  # a fresh interpreter, as job launchers use
    with context.Pool(1) as pool:
        results = pool.starmap(targets.call, calls)
        # The custom backward pass arrives too: the spawned process differentiates through it.
        results[-2] = pool.apply(targets.grad_through, (targets.clipped_sin, x))
    for result, expected in zip(results, _expected(model, x, xs), strict=True):
        if isinstance(expected, jax.Array):
            expected = [expected]
            result = [result]
        for got, want in zip(
            jax.tree_util.tree_leaves(result), jax.tree_util.tree_leaves(expected), strict=True
        ):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
        # The gradient came back as a model: the same class, found by name in this process.
        if isinstance(expected, targets.Affine):
            assert type(result) is targets.Affine


# ----- what cannot be pickled, and says why -----


def test_a_transformed_local_function_is_a_clear_error() -> None:
    @tm.filter_jit
    def local(x: jax.Array) -> jax.Array:
        return x

    with pytest.raises(
        pickle.PicklingError,
        match=r"test_pickling\..*<locals>\.local is defined inside a function.*top level",
    ):
        pickle.dumps(local)
    with pytest.raises(pickle.PicklingError, match=r"inside a function \(or is a lambda\)"):
        pickle.dumps(tm.filter_grad(lambda m: m))


def test_a_function_transformed_under_another_name_is_a_clear_error() -> None:
    with pytest.raises(
        pickle.PicklingError,
        match=r"pickle_targets\.plain is another object \(function\).*`plain = filter_jit\(plain",
    ):
        pickle.dumps(targets.jitted_plain_under_another_name)


def test_a_transformed_callable_object_is_a_clear_error() -> None:
    with pytest.raises(pickle.PicklingError, match=r"wraps a Affine object.*no importable name"):
        pickle.dumps(tm.filter_jit(targets.make_model()))
    with pytest.raises(pickle.PicklingError, match=r"wraps a partial object"):
        pickle.dumps(tm.filter_jit(functools.partial(targets.plain)))
