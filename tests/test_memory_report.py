"""`tm.debug.memory_report`: per-path bytes against hand arithmetic, totals against XLA's own
`memory_analysis()` of the same step compiled by plain JAX."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

import treemod as tm

OPT = optax.adam(1e-3)


def step(model: tm.nn.MLP, state: Any, x: jax.Array) -> tuple[Any, Any]:
    grads = tm.filter_grad(lambda m: jnp.sum(m(x) ** 2))(model)
    with jax.numpy_dtype_promotion("standard"):
        updates, state = OPT.update(grads, state, tm.filter(model, tm.is_array))
    return tm.apply_updates(model, updates), state


def test_rows_and_totals_of_a_training_step() -> None:
    mlp = tm.nn.MLP(16, 4, 128, 2, key=jax.random.key(0))
    state = OPT.init(tm.filter(mlp, tm.is_array))
    x = jnp.ones((32, 16))
    report = tm.debug.memory_report(step, mlp, state, x)
    rows = {r.path: r for r in report.rows}
    first = (16 * 128 + 128) * 4
    assert rows["model.layers[0]"].param_bytes == first
    assert rows["model.layers[0]"].grad_bytes == first  # the step differentiates through it
    assert rows["model"].param_bytes == (16 * 128 + 128 + 128 * 128 + 128 + 128 * 4 + 4) * 4
    # Adam keeps mu and nu per parameter.
    assert rows["model.layers[0]"].optimiser_bytes == 2 * first
    assert rows["model"].optimiser_bytes == 2 * rows["model"].param_bytes
    # The first layer's forward values include its (32, 128) output.
    assert rows["model.layers[0]"].activation_bytes >= 32 * 128 * 4
    compiled = tm.filter_jit(step).lower(mlp, state, x).compile().memory_analysis()
    assert report.argument_bytes == compiled.argument_size_in_bytes
    assert report.temp_bytes == compiled.temp_size_in_bytes
    assert report.output_bytes == compiled.output_size_in_bytes
    text = str(report)
    assert "model.layers[0]" in text and "XLA: arguments" in text


def test_a_forward_step_has_no_gradients() -> None:
    mlp = tm.nn.MLP(16, 4, 128, 2, key=jax.random.key(0))
    report = tm.debug.memory_report(lambda m, x: m(x).sum(), mlp, jnp.ones((32, 16)))
    assert all(r.grad_bytes == 0 for r in report.rows)


def test_a_step_over_a_partitioned_model_keeps_the_module_paths() -> None:
    # The LoRA recipe: the trainable part is the argument, the frozen part closed over, and the
    # step calls `tm.combine(trainable, frozen)`, a rebuilt model. Its modules take the paths
    # of the partitioned argument's (their outline), so each layer's forward values are the
    # ones a step over the whole model reports.
    mlp = tm.nn.MLP(16, 4, 128, 2, key=jax.random.key(0))
    x = jnp.ones((32, 16))
    spec = jax.tree.map(lambda _: False, mlp)
    spec = tm.tree_at(lambda m: m.layers[-1].weight, spec, True)
    trainable, frozen = tm.partition(mlp, spec)

    def partial_step(trainable: Any, x: jax.Array) -> Any:
        return tm.filter_grad(lambda t: jnp.sum(tm.combine(t, frozen)(x) ** 2))(trainable)

    whole = {
        r.path: r
        for r in tm.debug.memory_report(step, mlp, OPT.init(tm.filter(mlp, tm.is_array)), x).rows
    }
    rows = {r.path: r for r in tm.debug.memory_report(partial_step, trainable, x).rows}
    for i in range(3):
        got = rows[f"trainable.layers[{i}]"].activation_bytes
        assert got == whole[f"model.layers[{i}]"].activation_bytes > 0, i
    assert rows["trainable.layers[2]"].param_bytes == 128 * 4 * 4  # the trainable weight alone


def test_a_stacks_layers_count_once_per_layer() -> None:
    # The same three blocks run by an `nn.Stack`'s scan and one after another: the Stack's
    # layer path holds the values of all three, each block's modules their own.
    blocks = [tm.nn.MLP(16, 16, 32, 1, key=jax.random.key(i)) for i in range(3)]
    x = jnp.ones((8, 16))

    def loss(model: Any, x: jax.Array) -> Any:
        return tm.filter_grad(lambda m: jnp.sum(m(x) ** 2))(model)

    stacked = tm.nn.Stack.from_layers(blocks)
    rows = {r.path: r for r in tm.debug.memory_report(loss, stacked, x).rows}
    one_by_one = {r.path: r for r in tm.debug.memory_report(loss, tm.nn.Sequential(blocks), x).rows}
    for j in range(2):
        got = rows[f"model.layers.layers[{j}]"].activation_bytes
        want = sum(one_by_one[f"model.layers[{i}].layers[{j}]"].activation_bytes for i in range(3))
        assert got == want > 0, j
    assert rows["model.layers.layers[0]"].grad_bytes == rows["model.layers.layers[0]"].param_bytes
