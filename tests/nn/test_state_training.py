"""A BatchNorm CNN's training step: state is updated functionally and never by the optimiser."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import treemod as tm
import treemod.nn as nn


@pytest.fixture(autouse=True)
def _standard_promotion():
    # optax's Adam mixes a Python float and an int32 step count, which strict promotion refuses.
    with jax.numpy_dtype_promotion("standard"):
        yield


_run = tm.filter_jit(lambda m, x: tm.stateful(m)(x))


def _flatten(x):
    return x.reshape(x.shape[0], -1)


def _cnn(key):
    k1, k2, k3 = jax.random.split(key, 3)
    return nn.Sequential(
        [
            nn.Conv2d(1, 4, 3, padding=1, key=k1),
            nn.BatchNorm(4),
            nn.Lambda(jax.nn.relu),
            nn.Conv2d(4, 4, 3, key=k2),
            nn.BatchNorm(4),
            nn.Lambda(jax.nn.relu),
            nn.Lambda(_flatten),
            nn.Linear(4 * 4 * 4, 3, key=k3),
        ]
    )


def cross_entropy(logits, y):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


opt = optax.adamw(1e-2, weight_decay=0.5)


# The documented pattern (docs/concepts/state.md), verbatim.
@tm.filter_jit
def step(model, opt_state, x, y):
    def loss_fn(model):
        logits, model = tm.stateful(model)(x)
        return cross_entropy(logits, y), model

    (loss, new_model), grads = tm.filter_value_and_grad(loss_fn, has_aux=True)(model)
    updates, opt_state = opt.update(grads, opt_state, tm.filter(model, tm.is_param))
    return tm.apply_updates(new_model, updates), opt_state, loss


def _data(seed, n=16):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 1, 6, 6)).astype(np.float32) * 2 + 1
    y = rng.integers(0, 3, size=n).astype(np.int32)
    return jnp.asarray(x), jnp.asarray(y)


def test_training_step_updates_state_functionally_and_optimiser_skips_it() -> None:
    model = _cnn(jax.random.key(0))
    opt_state = opt.init(tm.filter(model, tm.is_param))
    losses = []
    for i in range(3):
        x, y = _data(i)
        _, expected = _run(model, x)
        new_model, opt_state, loss = step(model, opt_state, x, y)
        losses.append(float(loss))
        for j in (1, 4):
            # The running statistics are exactly the stateful update: weight decay (0.5) and
            # Adam never touched them.
            for name in ("running_mean", "running_var"):
                got = getattr(new_model[j], name).value
                want = getattr(expected[j], name).value
                np.testing.assert_array_equal(got, want)
        # The parameters did move.
        assert not np.allclose(new_model[0].weight, model[0].weight)
        assert not np.allclose(new_model[1].weight, model[1].weight)
        model = new_model
    assert np.isfinite(losses).all()
    # The optimiser state holds nothing for the State nodes.
    counted = sum(x.size for x in jax.tree_util.tree_leaves(tm.filter(model, tm.is_param)))
    mu = opt_state[0].mu
    assert sum(x.size for x in jax.tree_util.tree_leaves(mu)) == counted
    assert mu[1].running_mean is None


def test_gradient_of_state_is_none() -> None:
    model = _cnn(jax.random.key(1))
    x, y = _data(5)

    def loss_fn(model):
        logits, model = tm.stateful(model)(x)
        return cross_entropy(logits, y), model

    @tm.filter_jit
    def both(model):
        (_, _), grads = tm.filter_value_and_grad(loss_fn, has_aux=True)(model)
        return grads, tm.filter_grad(lambda m: loss_fn(m)[0])(model)

    grads, grads_only = both(model)
    assert grads[1].running_mean is None and grads[1].running_var is None
    assert grads[1].weight.shape == (4,)
    assert grads_only[4].running_var is None


def test_saved_model_includes_running_statistics(tmp_path) -> None:
    model = _cnn(jax.random.key(2))
    _, model = _run(model, _data(0)[0])
    tm.save(tmp_path / "model.safetensors", model)
    loaded = tm.load(tmp_path / "model.safetensors", _cnn(jax.random.key(3)))
    np.testing.assert_array_equal(loaded[1].running_var.value, model[1].running_var.value)
    assert tm.tree_equal(loaded, model)


class Block(tm.Module):
    linear: nn.Linear
    norm: nn.BatchNorm

    def __call__(self, x, *, key=None):
        return x + jax.nn.relu(self.norm(self.linear(x)))


def test_batch_norm_inside_stack_equals_the_unrolled_loop() -> None:
    stack = nn.Stack(
        lambda k: Block(nn.Linear(5, 5, key=k), nn.BatchNorm(5)), 3, key=jax.random.key(4)
    )
    assert stack.layers.norm.running_mean.value.shape == (3, 5)
    x = jax.random.normal(jax.random.key(5), (8, 5))
    run = _run
    out, new_stack = run(stack, x)
    h = x
    for i in range(3):
        h, layer = run(stack[i], h)
        np.testing.assert_allclose(
            new_stack[i].norm.running_mean.value,
            layer.norm.running_mean.value,
            rtol=1e-5,
            atol=1e-6,
        )
        np.testing.assert_allclose(
            new_stack[i].norm.running_var.value, layer.norm.running_var.value, rtol=1e-5
        )
    np.testing.assert_allclose(out, h, rtol=1e-5, atol=1e-5)
    # One call switches the whole stack to inference; no state is then updated.
    evaluation = nn.inference_mode(new_stack)
    assert evaluation.layers.norm.inference
    y, same = run(evaluation, x)
    assert tm.tree_equal(same, evaluation)
    h = x
    for i in range(3):
        h = evaluation[i](h)
    np.testing.assert_allclose(y, h, rtol=1e-5, atol=1e-5)


def test_equinox_style_vmapped_training_step() -> None:
    """The Equinox layout (single examples under vmap with an axis name) trains the same way."""

    def make(axis_name):
        k1, k2 = jax.random.split(jax.random.key(6))
        return nn.Sequential(
            [nn.Linear(3, 4, key=k1), nn.BatchNorm(4, axis_name=axis_name), nn.Linear(4, 3, key=k2)]
        )

    x = jax.random.normal(jax.random.key(7), (8, 3))
    y = jnp.arange(8, dtype=jnp.int32) % 3

    @tm.filter_jit
    def vmapped_step(model, opt_state):
        def loss_fn(model):
            run = tm.filter_vmap(tm.stateful(model), axis_name="batch", out_axes=(0, None))
            logits, model = run(x)
            return cross_entropy(logits, y), model

        (loss, new_model), grads = tm.filter_value_and_grad(loss_fn, has_aux=True)(model)
        updates, opt_state = opt.update(grads, opt_state, tm.filter(model, tm.is_param))
        return tm.apply_updates(new_model, updates), opt_state, loss

    batched, mapped = make(None), make("batch")
    state_b = opt.init(tm.filter(batched, tm.is_param))
    state_m = opt.init(tm.filter(mapped, tm.is_param))
    for _ in range(2):
        batched, state_b, loss_b = step(batched, state_b, x, y)
        mapped, state_m, loss_m = vmapped_step(mapped, state_m)
        np.testing.assert_allclose(loss_m, loss_b, rtol=1e-5)
    np.testing.assert_allclose(mapped[1].running_var.value, batched[1].running_var.value, rtol=1e-5)
    np.testing.assert_allclose(mapped[2].weight, batched[2].weight, rtol=1e-4, atol=1e-6)
