"""Equinox's state API in the compat namespace, against real Equinox on the same inputs.

Each test builds the Equinox layer and the compat layer with the same arguments and keys, runs
both on the same data, and compares outputs, states and tree structures.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import pytest

import treemod.compat.equinox as teqx

from helpers import close, normal

eqx = pytest.importorskip("equinox")


def _vmapped(model, state, x):
    run = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
    return run(x, state)


# Leaf by leaf (two libraries' State types), equal dtypes, and NumPy's default rtol.
_close = functools.partial(close, rtol=1e-7, atol=1e-6, check_dtype=True, check_structure=False)


def _describe(tree):
    return [
        (type(x).__name__, getattr(x, "shape", x) if not isinstance(x, str) else x)
        for x in jtu.tree_leaves(tree)
    ]


# Each mode with each momentum and with and without the affine parameters (pairs of the three
# settings; momentum and affine are independent of each other in both modes).
@pytest.mark.parametrize(
    ("mode", "momentum", "affine"),
    [("batch", 0.99, True), ("batch", 0.5, False), ("ema", 0.5, True), ("ema", 0.99, False)],
)
def test_batch_norm_matches_equinox_over_steps(mode, momentum, affine):
    ours, s1 = teqx.nn.make_with_state(teqx.nn.BatchNorm)(
        3, "batch", momentum=momentum, channelwise_affine=affine, mode=mode, eps=1e-3
    )
    theirs, s2 = eqx.nn.make_with_state(eqx.nn.BatchNorm)(
        3, "batch", momentum=momentum, channelwise_affine=affine, mode=mode, eps=1e-3
    )
    # Same leaves (types, shapes, order): (model, state) save alike in Equinox's format.
    assert _describe((ours, s1)) == _describe((theirs, s2))
    for step in range(3):
        x = 2.0 * normal((6, 3, 4), step) + step
        y1, s1 = _vmapped(ours, s1, x)
        y2, s2 = _vmapped(theirs, s2, x)
        _close(y1, y2, atol=1e-5)
        _close(s1, s2)
    # Inference: the running statistics (debiased in "batch" mode), no update.
    x = normal((5, 3, 4), 9)
    y1, t1 = _vmapped(teqx.nn.inference_mode(ours), s1, x)
    y2, t2 = _vmapped(eqx.nn.inference_mode(theirs), s2, x)
    _close(y1, y2, atol=1e-5)
    _close(t1, t2)


def test_batch_norm_call_time_inference_and_single_example():
    ours, s1 = teqx.nn.make_with_state(teqx.nn.BatchNorm)(2, "batch", mode="batch")
    theirs, s2 = eqx.nn.make_with_state(eqx.nn.BatchNorm)(2, "batch", mode="batch")
    x = jnp.arange(10.0).reshape(2, 5)
    # Inference needs no named axis: one example at a time.
    y1, _ = ours(x, s1, inference=True)
    y2, _ = theirs(x, s2, inference=True)
    _close(y1, y2)


def test_batch_norm_under_filter_jit_filter_vmap_and_grad():
    ours, s1 = teqx.nn.make_with_state(teqx.nn.BatchNorm)(3, "b", mode="batch")
    theirs, s2 = eqx.nn.make_with_state(eqx.nn.BatchNorm)(3, "b", mode="batch")
    x = normal((4, 3, 2), 0)

    def make_loss(lib):
        def loss(model, state, x):
            run = lib.filter_vmap(model, in_axes=(0, None), out_axes=(0, None), axis_name="b")
            y, state = run(x, state)
            return jnp.sum(y * jnp.arange(2.0)[None, None, :]), state

        return loss

    g1, n1 = teqx.filter_jit(teqx.filter_grad(make_loss(teqx), has_aux=True))(ours, s1, x)
    g2, n2 = eqx.filter_jit(eqx.filter_grad(make_loss(eqx), has_aux=True))(theirs, s2, x)
    _close((g1.weight, g1.bias), (g2.weight, g2.bias), atol=1e-5)
    _close(n1, n2)


def test_batch_norm_axis_name_list_and_tuple():
    ours, s1 = teqx.nn.make_with_state(teqx.nn.BatchNorm)(2, ["i", "j"], mode="batch")
    x = normal((3, 4, 2, 5), 1)
    inner = jax.vmap(ours, axis_name="j", in_axes=(0, None), out_axes=(0, None))
    y, _ = jax.vmap(inner, axis_name="i", in_axes=(0, None), out_axes=(0, None))(x, s1)
    # Statistics over both mapped axes and the spatial axis, per channel.
    flat = jnp.moveaxis(x, 2, 0).reshape(2, -1)
    mean, var = flat.mean(1), flat.var(1)
    expected = (x - mean[None, None, :, None]) / jnp.sqrt(var[None, None, :, None] + 1e-5)
    _close(y, expected, atol=1e-5)


def test_batch_norm_errors():
    with pytest.warns(UserWarning, match="mode"):
        teqx.nn.BatchNorm(3, "batch")
    with pytest.raises(ValueError, match="mode must be 'ema' or 'batch'"):
        teqx.nn.BatchNorm(3, "batch", mode="running")
    with pytest.raises(ValueError, match="momentum must be in"):
        teqx.nn.BatchNorm(3, "batch", momentum=1.5, mode="batch")
    bn, state = teqx.nn.make_with_state(teqx.nn.BatchNorm)(3, "batch", mode="batch")
    with pytest.raises(NameError, match=r"axis_name='batch'.*jax.vmap"):
        bn(jnp.ones((3, 4)), state)
    with pytest.raises(ValueError, match=r"input_size=3.*\(4, 3\)"):
        bn(jnp.ones((4, 3)), state, inference=True)


def test_make_with_state_markers_and_structure_match_equinox():
    def build(lib):
        return lib.nn.Sequential(
            [
                lib.nn.Linear(2, 3, key=jax.random.key(0)),
                lib.nn.BatchNorm(3, "batch", mode="ema"),
                lib.nn.BatchNorm(3, "batch", mode="batch"),
            ]
        )

    m1, s1 = teqx.nn.make_with_state(build)(teqx)
    m2, s2 = eqx.nn.make_with_state(build)(eqx)
    assert [k for k in s1._values] == [k for k in s2._state]
    assert _describe((m1, s1)) == _describe((m2, s2))
    # Two builds give states of one tree structure (so jit caches and checkpoints match).
    assert jtu.tree_structure(s1) == jtu.tree_structure(teqx.nn.make_with_state(build)(teqx)[1])


def test_sequential_threads_state_like_equinox():
    def build(lib):
        keys = jax.random.split(jax.random.key(3), 2)
        return lib.nn.Sequential(
            [
                lib.nn.Linear(4, 3, key=keys[0]),
                lib.nn.Lambda(jax.nn.relu),
                lib.nn.BatchNorm(3, "batch", mode="batch"),
                lib.nn.LayerNorm(3),
                lib.nn.Linear(3, 2, key=keys[1]),
            ]
        )

    m1, s1 = teqx.nn.make_with_state(build)(teqx)
    m2, s2 = eqx.nn.make_with_state(build)(eqx)
    assert m1.is_stateful() and m2.is_stateful()
    x = normal((5, 4), 4)
    for _ in range(2):
        y1, s1 = _vmapped(m1, s1, x)
        y2, s2 = _vmapped(m2, s2, x)
        _close(y1, y2, atol=1e-5)
        _close(s1, s2)
    with pytest.raises(TypeError, match=r"layers\[2\] \(BatchNorm\) is stateful"):
        m1(x[0])


@pytest.mark.parametrize("inference", [False, True])
def test_spectral_norm_matches_equinox(inference):
    def build(lib):
        linear = lib.nn.Linear(5, 4, key=jax.random.key(0))
        return lib.nn.SpectralNorm(linear, "weight", num_power_iterations=2, key=jax.random.key(1))

    m1, s1 = teqx.nn.make_with_state(build)(teqx)
    m2, s2 = eqx.nn.make_with_state(build)(eqx)
    _close(s1, s2)
    assert _describe((m1, s1)) == _describe((m2, s2))
    if inference:
        m1, m2 = teqx.nn.inference_mode(m1), eqx.nn.inference_mode(m2)
    x = normal((5,), 2)
    for _ in range(2):
        y1, s1 = m1(x, s1)
        y2, s2 = m2(x, s2)
        _close(y1, y2, atol=1e-5)
        _close(s1, s2, atol=1e-6)


def test_state_index_user_layer_and_state_methods():
    class Counter(teqx.Module):
        index: teqx.nn.StateIndex

        def __init__(self):
            self.index = teqx.nn.StateIndex(jnp.array(0))

        def __call__(self, x, state):
            count = state.get(self.index)
            return x + count, state.set(self.index, count + 1)

    model, state = teqx.nn.make_with_state(lambda: [Counter(), Counter()])()
    assert list(state._values) == ["list[0].index", "list[1].index"]
    _, state = model[0](1, state)
    sub = state.substate(model[1])
    _, sub = model[1](1, sub)
    _, sub = model[1](1, sub)
    state = state.update(sub)
    assert [int(v) for v in jtu.tree_leaves(state)] == [1, 2]
    # jit sees the state as a pytree of arrays.
    y, state = jax.jit(lambda s: model[0](jnp.array(10), s))(state)
    assert int(y) == 11 and int(state.get(model[0].index)) == 2


def test_state_errors_name_what_is_wrong():
    bn, state = teqx.nn.make_with_state(teqx.nn.BatchNorm)(2, "batch", mode="batch")
    new = state.set(bn.batch_counter, jnp.array(1))
    with pytest.raises(ValueError, match="already used"):
        state.get(bn.batch_counter)
    with pytest.raises(ValueError, match="already used"):
        jtu.tree_leaves(state)
    with pytest.raises(ValueError, match=r"BatchNorm.batch_counter.*f32\[\].*i32\[\]"):
        new.set(bn.batch_counter, jnp.array(1.0))
    with pytest.raises(ValueError, match="as state keys.*got str"):
        new.get("batch_counter")
    other, _ = teqx.nn.make_with_state(teqx.nn.SpectralNorm)(
        teqx.nn.Linear(2, 2, key=jax.random.key(0)), "weight", key=jax.random.key(1)
    )
    with pytest.raises(KeyError, match="no entry for the StateIndex 'SpectralNorm.uv_index'"):
        new.get(other.uv_index)
    with pytest.raises(ValueError, match="make_with_state"):
        teqx.nn.State(bn)
    with pytest.raises(ValueError, match="not a function"):
        teqx.nn.StateIndex(lambda: jnp.zeros(2))
    with pytest.raises(ValueError, match="is not part of this State"):
        new.update(teqx.nn.State(teqx.nn.BatchNorm(2, "b", mode="ema")))
    assert "retired" in repr(state)


def test_inference_mode_and_tree_inference_switch_compat_layers():
    model = teqx.nn.Sequential([teqx.nn.Dropout(0.5), teqx.nn.BatchNorm(2, "batch", mode="batch")])
    switched = teqx.tree_inference(model, True)
    assert switched[0].inference and switched[1].inference
    assert not teqx.nn.inference_mode(switched, False)[1].inference


def _message(nn: Any, trigger: Callable[[Any], Any]) -> str:
    with pytest.raises(ValueError) as info:
        trigger(nn)
    return str(info.value)


def _reuse(nn: Any) -> Any:
    bn, state = nn.make_with_state(nn.BatchNorm)(2, "b", mode="batch")
    state.set(bn.batch_counter, jnp.array(1))
    return state.get(bn.batch_counter)


def _bad_key(nn: Any) -> Any:
    return nn.make_with_state(nn.BatchNorm)(2, "b", mode="batch")[1].get("batch_counter")


def _bad_value(nn: Any) -> Any:
    bn, state = nn.make_with_state(nn.BatchNorm)(2, "b", mode="batch")
    return state.set(bn.batch_counter, jnp.array(1.0))


def _state_of_built(nn: Any) -> Any:
    return nn.State(nn.make_with_state(nn.BatchNorm)(2, "b", mode="batch")[0])


def _update_not_state(nn: Any) -> Any:
    return nn.make_with_state(nn.BatchNorm)(2, "b", mode="batch")[1].update(0)


def _update_foreign(nn: Any) -> Any:
    state = nn.make_with_state(nn.BatchNorm)(2, "b", mode="batch")[1]
    return state.update(nn.make_with_state(nn.BatchNorm)(2, "c", mode="ema")[1])


@pytest.mark.parametrize(
    "trigger",
    [_reuse, _bad_key, _bad_value, _state_of_built, _update_not_state, _update_foreign],
)
def test_state_errors_open_with_equinox_words(trigger: Callable[[Any], Any]) -> None:
    # Code written for Equinox may match its messages: ours start with Equinox's first sentence.
    first_sentence = _message(eqx.nn, trigger).split(". ")[0].split(".\n")[0].rstrip(".")
    assert first_sentence in _message(teqx.nn, trigger)


def test_state_index_of_a_function_says_to_pass_the_value() -> None:
    for nn in (eqx.nn, teqx.nn):
        with pytest.raises(ValueError, match="accepts the value of the initial state directly"):
            nn.StateIndex(lambda: jnp.zeros(2))


def test_a_fresh_batch_norm_saves_the_same_bytes_every_time(tmp_path: Any) -> None:
    # Equinox fills the running statistics with `jnp.empty` (uninitialised memory from JAX
    # 0.11): the compat layer's are zeros until the first batch overwrites them, so a saved
    # fresh model is the same file each time.
    files = []
    for i in range(2):
        _ = jnp.full((4096,), 7.0) * i  # memory a fresh `jnp.empty` could be handed
        model, state = teqx.nn.make_with_state(teqx.nn.BatchNorm)(5, axis_name="batch", mode="ema")
        path = tmp_path / f"{i}.eqx"
        teqx.tree_serialise_leaves(path, (model, state))
        files.append(path.read_bytes())
    assert files[0] == files[1]
    running = state.get(model.ema_state_index)
    assert [x.tolist() for x in running] == [[0.0] * 5, [0.0] * 5]
    x = normal((8, 5))
    out, state = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(x, state)
    mean, var = state.get(model.ema_state_index)
    close(mean, jnp.mean(x, axis=0), rtol=1e-5)  # the first batch's statistics, taken as they are
