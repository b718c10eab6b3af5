"""The state mechanism: State, update_state, stateful, is_param, with user-defined layers."""

import pickle
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod as tm


class Counter(tm.Module):
    count: tm.State

    def __call__(self, x):
        tm.update_state(self.count, self.count.value + 1)
        return x


class EMA(tm.Module):
    """Exponential moving average of the inputs it has seen (PyTorch-style momentum)."""

    average: tm.State
    momentum: float = tm.field(static=True, default=0.1)

    def __call__(self, x):
        new = (1 - self.momentum) * self.average.value + self.momentum * x
        tm.update_state(self.average, new)
        return x - self.average.value


class PowerIteration(tm.Module):
    """Spectral-norm style power iteration: one step per call, u kept as state."""

    weight: jax.Array
    u: tm.State

    def __call__(self, x):
        w = jax.lax.stop_gradient(self.weight)
        v = w.T @ self.u.value
        v = v / jnp.linalg.norm(v)
        u = w @ v
        u = u / jnp.linalg.norm(u)
        tm.update_state(self.u, u)
        sigma = u @ self.weight @ v
        return (self.weight / sigma) @ x


def _counter():
    return Counter(tm.State(jnp.array(0, jnp.int32)))


def test_stateful_returns_updated_model_and_leaves_original() -> None:
    model = _counter()
    out, new = tm.stateful(model)(jnp.ones(2))
    np.testing.assert_array_equal(out, jnp.ones(2))
    assert int(new.count.value) == 1
    assert int(model.count.value) == 0  # pure: the input model is unchanged
    _, new = tm.stateful(new)(jnp.ones(2))
    assert int(new.count.value) == 2


def test_untouched_state_and_leaves_keep_identity() -> None:
    model = {"ema": EMA(tm.State(jnp.zeros(3))), "other": tm.State(jnp.ones(2)), "w": jnp.ones(4)}
    _, new = tm.stateful(lambda m, x: m["ema"](x))(model, jnp.ones(3))
    assert new["other"] is model["other"]
    assert new["w"] is model["w"]
    assert new["ema"].average is not model["ema"].average


def test_ema_matches_numpy_over_several_steps() -> None:
    rng = np.random.default_rng(0)
    model = EMA(tm.State(jnp.zeros(4)), momentum=0.25)
    expected = np.zeros(4, np.float32)
    for _ in range(5):
        x = rng.normal(size=4).astype(np.float32)
        out, model = tm.stateful(model)(jnp.asarray(x))
        np.testing.assert_allclose(out, x - expected, rtol=1e-6)
        expected = 0.75 * expected + 0.25 * x
        np.testing.assert_allclose(model.average.value, expected, rtol=1e-6)


def test_power_iteration_finds_the_spectral_norm() -> None:
    w = jax.random.normal(jax.random.key(0), (5, 3))
    u0 = jax.random.normal(jax.random.key(1), (5,))
    model = PowerIteration(w, tm.State(u0 / jnp.linalg.norm(u0)))
    step = jax.jit(lambda m, x: tm.stateful(m)(x))
    for _ in range(50):
        y, model = step(model, jnp.ones(3))
    sigma = np.linalg.svd(np.asarray(w), compute_uv=False)[0]
    np.testing.assert_allclose(y, np.asarray(w) @ np.ones(3) / sigma, rtol=1e-4)
    # Gradients skip the State (u gets none) and reach the weight.
    params, rest = tm.partition(model, tm.is_param)

    def loss(p):
        return jnp.sum(tm.stateful(tm.combine(p, rest))(jnp.ones(3))[0])

    grads = jax.grad(loss)(params)
    assert grads.u is None and params.u is None
    assert grads.weight.shape == (5, 3)


def test_bound_method_and_plain_function() -> None:
    class Net(tm.Module):
        ema: EMA

        def loss(self, x):
            return jnp.sum(self.ema(x))

    net = Net(EMA(tm.State(jnp.zeros(2))))
    loss, new = tm.stateful(net.loss)(jnp.ones(2))
    assert isinstance(new, Net) and float(loss) == 2.0
    np.testing.assert_allclose(new.ema.average.value, [0.1, 0.1])

    def run(model, x):
        return model.ema(x)

    _, new = tm.stateful(run)(net, jnp.ones(2))
    np.testing.assert_allclose(new.ema.average.value, [0.1, 0.1])
    with pytest.raises(TypeError, match="first positional argument"):
        tm.stateful(run)()
    with pytest.raises(TypeError, match="stateful expects a model or a function"):
        tm.stateful(3)  # type: ignore[arg-type]


def test_update_outside_stateful_is_an_error() -> None:
    with pytest.raises(RuntimeError, match=r"outside treemod.stateful.*inference_mode"):
        _counter()(1.0)


def test_update_with_changed_shape_or_dtype_is_an_error() -> None:
    class Bad(tm.Module):
        s: tm.State
        new: jax.Array

        def __call__(self, x):
            tm.update_state(self.s, self.new)
            return x

    with pytest.raises(ValueError, match=r"new value is f32\[4\] but the state holds "):
        tm.stateful(Bad(tm.State(jnp.zeros(3)), jnp.zeros(4)))(1.0)
    with pytest.raises(ValueError, match=r"i32\[3\] but the state holds f32\[3\]"):
        tm.stateful(Bad(tm.State(jnp.zeros(3)), jnp.zeros(3, jnp.int32)))(1.0)


def test_update_of_a_non_state_is_an_error() -> None:
    class Bad(tm.Module):
        s: jax.Array

        def __call__(self, x):
            tm.update_state(self.s, self.s + 1)  # type: ignore[arg-type]
            return x

    with pytest.raises(TypeError, match="expects a State node.*got ArrayImpl"):
        tm.stateful(Bad(jnp.zeros(3)))(1.0)


def test_second_update_of_the_same_state_is_an_error() -> None:
    class Twice(tm.Module):
        counter: Counter

        def __call__(self, x):
            return self.counter(self.counter(x))

    with pytest.raises(RuntimeError, match=r"State \(i32\[\]\) was already updated.*applied twice"):
        tm.stateful(Twice(_counter()))(1.0)


def test_update_of_a_state_outside_the_model_is_an_error() -> None:
    other = _counter()

    class Calls(tm.Module):
        w: jax.Array

        def __call__(self, x):
            return other(x)

    with pytest.raises(ValueError, match="not part of the model being run"):
        tm.stateful(Calls(jnp.ones(1)))(1.0)


def test_nested_stateful_passes_updates_to_the_enclosing_call() -> None:
    class Outer(tm.Module):
        inner: EMA

        def __call__(self, x):
            y, _ = tm.stateful(self.inner)(x)  # the sublayer's new state is not kept here...
            return y

    model = Outer(EMA(tm.State(jnp.zeros(2))))
    _, new = tm.stateful(model)(jnp.ones(2))
    np.testing.assert_allclose(new.inner.average.value, [0.1, 0.1])  # ...but reaches the model

    other = EMA(tm.State(jnp.zeros(2)))

    class UsesAnother(tm.Module):
        w: jax.Array

        def __call__(self, x):
            y, updated = tm.stateful(other)(x)  # a separate model: its caller keeps its state
            np.testing.assert_allclose(updated.average.value, [0.1, 0.1])
            return y

    holder = UsesAnother(jnp.ones(1))
    _, same = tm.stateful(holder)(jnp.ones(2))
    assert tm.tree_equal(same, holder)

    class Both(tm.Module):
        inner: EMA

        def __call__(self, x):
            tm.stateful(self.inner)(x)
            return self.inner(x)  # a second update of the same State

    with pytest.raises(RuntimeError, match="already updated"):
        tm.stateful(Both(EMA(tm.State(jnp.zeros(2)))))(jnp.ones(2))


@pytest.mark.parametrize(
    "transform, shape",
    [
        (lambda f: jax.jit(f), (3,)),
        (lambda f: jax.vmap(f), ()),
        (lambda f: jax.checkpoint(f), (3,)),
        (lambda f: lambda x: jax.lax.scan(lambda c, xi: (c, f(xi)), 0, x)[1], ()),
    ],
    ids=["jit", "vmap", "checkpoint", "scan"],
)
def test_transform_started_inside_stateful_is_a_clear_error(transform, shape) -> None:
    class Inner(tm.Module):
        ema: EMA

        def __call__(self, x):
            return transform(lambda xi: self.ema(xi))(x)

    model = Inner(EMA(tm.State(jnp.zeros(shape))))
    with pytest.raises(RuntimeError, match=r"under a JAX transform.*started inside.*outside"):
        tm.stateful(model)(jnp.ones(3))


def test_transforms_outside_stateful() -> None:
    model = EMA(tm.State(jnp.zeros(3)))
    x = jnp.arange(3.0)
    _, expected = tm.stateful(model)(x)
    _, by_jit = jax.jit(lambda m, x: tm.stateful(m)(x))(model, x)
    _, by_jit_of_wrapper = jax.jit(tm.stateful(model))(x)
    assert tm.tree_equal(by_jit, expected, rtol=1e-6)
    assert tm.tree_equal(by_jit_of_wrapper, expected, rtol=1e-6)
    # Under vmap the model is shared: average the update over the mapped axis.

    class MeanEMA(EMA):
        def __call__(self, x):
            new = (1 - self.momentum) * self.average.value + self.momentum * x
            tm.update_state(self.average, jax.lax.pmean(new, "batch"))
            return x

    xs = jnp.arange(12.0).reshape(4, 3)
    out, new = jax.vmap(
        tm.stateful(MeanEMA(tm.State(jnp.zeros(3)))), axis_name="batch", out_axes=(0, None)
    )(xs)
    np.testing.assert_allclose(new.average.value, 0.1 * np.asarray(xs).mean(0), rtol=1e-6)
    assert out.shape == (4, 3)


def test_state_is_in_the_tree_but_not_a_param() -> None:
    model = EMA(tm.State(jnp.zeros(3)))
    assert "average=State(value=f32[3])" in repr(model)
    moved = tm.tree_at(lambda m: m.average.value, model, jnp.ones(3))
    np.testing.assert_array_equal(moved.average.value, jnp.ones(3))
    params = tm.filter(model, tm.is_param)
    assert params.average is None
    assert jax.tree_util.tree_leaves(params) == []
    assert len(jax.tree_util.tree_leaves(model)) == 1
    restored = pickle.loads(pickle.dumps(model))
    assert tm.tree_equal(restored, model)
    assert tm.is_state(model.average) and not tm.is_state(model.average.value)
    # A float array inside a State is still not a parameter.
    assert not tm.is_param(tm.State(jnp.zeros(2)))
    assert tm.is_param(jnp.zeros(2)) and not tm.is_param(jnp.zeros(2, jnp.int32))


class ScaledEMA(tm.Module):
    scale: jax.Array
    ema: EMA
    steps: jax.Array  # an integer array: an array, but no parameter

    def __call__(self, x):
        return self.scale * self.ema(x)


def test_optimiser_state_of_an_abstract_skeleton_is_that_of_the_model() -> None:
    optax = pytest.importorskip("optax")
    optimiser = optax.adam(1e-3)

    def make() -> ScaledEMA:
        return ScaledEMA(jnp.ones((2, 3)), EMA(tm.State(jnp.zeros(3))), jnp.zeros((), jnp.int32))

    skeleton = jax.eval_shape(make)
    # ShapeDtypeStructs count as arrays: the skeleton keeps its parameter, drops the State.
    assert tm.is_param(skeleton.scale) and not tm.is_param(skeleton.ema.average)
    assert not tm.is_param(skeleton.steps)
    abstract = jax.eval_shape(optimiser.init, tm.filter(skeleton, tm.is_param))
    # The reference: optax run on the concrete model's parameters, then abstracted.
    reference = jax.eval_shape(lambda: optimiser.init(tm.filter(make(), tm.is_param)))
    assert jax.tree_util.tree_structure(abstract) == jax.tree_util.tree_structure(reference)
    assert jax.tree_util.tree_leaves(abstract) == jax.tree_util.tree_leaves(reference)
    mu = abstract[0].mu
    assert mu.scale.shape == (2, 3) and mu.ema.average is None and mu.steps is None


def test_collectors_are_per_thread() -> None:
    errors: list[BaseException] = []
    inside = threading.Event()
    release = threading.Event()

    class Waits(tm.Module):
        counter: Counter

        def __call__(self, x):
            inside.set()
            release.wait(5)
            return self.counter(x)

    def other_thread():
        inside.wait(5)
        try:
            _counter()(1.0)  # not inside this thread's stateful call
        except RuntimeError as e:
            errors.append(e)
        finally:
            release.set()

    t = threading.Thread(target=other_thread)
    t.start()
    _, new = tm.stateful(Waits(_counter()))(1.0)
    t.join()
    assert int(new.counter.count.value) == 1
    assert len(errors) == 1 and "outside treemod.stateful" in str(errors[0])


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(-10, 10, width=32), min_size=1, max_size=6),
    st.floats(0, 1, width=32),
)
def test_ema_law_closed_form(xs: list[float], momentum: float) -> None:
    """After k steps the average is sum_i m (1-m)^(k-1-i) x_i, and the original is untouched."""
    model = EMA(tm.State(jnp.zeros(())), momentum=momentum)
    current = model
    for x in xs:
        _, current = tm.stateful(current)(jnp.float32(x))
    k = len(xs)
    m = np.float64(momentum)
    expected = sum(m * (1 - m) ** (k - 1 - i) * x for i, x in enumerate(xs))
    np.testing.assert_allclose(current.average.value, expected, rtol=1e-4, atol=1e-4)
    assert float(model.average.value) == 0.0


class _Noise(tm.Module):
    key: tm.State

    def __call__(self, x):
        key, sub = jax.random.split(self.key.value)
        tm.update_state(self.key, key)
        return x + jax.random.normal(sub, x.shape)


def test_state_can_hold_a_prng_key_that_advances_each_call():
    model = _Noise(tm.State(jax.random.key(3)))
    key, x = jax.random.key(3), jnp.zeros(4)
    step = tm.filter_jit(lambda m, x: tm.stateful(m)(x))
    for run in (tm.stateful(model), None, None):  # eagerly once, then compiled
        out, model = run(x) if run else step(model, x)
        key, sub = jax.random.split(key)  # the same draws, by hand
        np.testing.assert_array_equal(out, jax.random.normal(sub, (4,)))
        assert jnp.array_equal(jax.random.key_data(model.key.value), jax.random.key_data(key))
    assert tm.filter(model, tm.is_param).key is None  # not trained


def test_a_prng_key_state_refuses_a_non_key_value():
    class Overwrite(tm.Module):
        key: tm.State

        def __call__(self, x):
            tm.update_state(self.key, jnp.zeros(2))
            return x

    with pytest.raises(ValueError, match=r"new value is f32\[2\] but the state holds key<fry>\[\]"):
        tm.stateful(Overwrite(tm.State(jax.random.key(0))))(1.0)
