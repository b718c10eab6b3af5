"""Shape checks that pass (variadic and broadcast dims, transforms), their cost and their laws."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jaxtyping import Array, Float
from shapecheck_modules import (
    Batched,
    Converted,
    CustomInit,
    Indices,
    Linear,
    OptionalBias,
    Pair,
    Plain,
    Scaled,
    Treeish,
    lin,
    outer_product,
    same_size,
)

import treemod as tm
from treemod._shapecheck import engine as _shapecheck
from treemod._shapecheck.checker import checked_call_state
from treemod._tree.module_info import module_info

pytestmark = pytest.mark.usefixtures("shape_checks_on")  # tests/conftest.py


# ---------------------------------------------------------------------------- good cases


def test_good_modules_and_calls_pass():
    layer = lin(2, 3)
    np.testing.assert_allclose(layer(jnp.ones(3)), np.full(2, 3.0))
    OptionalBias(jnp.zeros((2, 3)), None)
    OptionalBias(jnp.zeros((2, 3)), jnp.zeros(2))
    Indices(jnp.arange(4))
    Converted([1, 2, 3])
    CustomInit(3, 3)
    assert Pair(jnp.ones(3)).dot((jnp.ones(3), jnp.ones(3))).shape == ()
    Treeish({"a": jnp.ones(3), "b": [jnp.ones(3)]})
    assert outer_product(jnp.ones(2), jnp.ones(3)).shape == (2, 3)


@pytest.mark.parametrize("batch", [(), (5,), (2, 4)])
def test_variadic_dims(batch):
    x = jnp.ones((*batch, 3))
    m = Batched(x, x)
    out = m(x)
    assert out.shape == batch
    np.testing.assert_allclose(out, np.full(batch, 3.0))


@pytest.mark.parametrize("scale_shape", [(1, 1), (4, 1)])
def test_broadcastable_dims(scale_shape):
    m = Scaled(jnp.ones((4, 3)), jnp.ones(scale_shape))
    assert m.scale.shape == scale_shape


def test_dims_are_per_instance_and_per_call():
    # Different instances and different calls bind dimensions independently.
    a, b = lin(2, 3), lin(5, 7)
    assert a(jnp.ones(3)).shape == (2,)
    assert b(jnp.ones(7)).shape == (5,)
    assert same_size(jnp.ones(2), jnp.ones(2)).shape == (2,)
    assert same_size(jnp.ones(4), jnp.ones(4)).shape == (4,)


def test_nested_checked_calls_have_their_own_dims():
    class Two(tm.Module):
        first: Linear
        second: Linear

        def __call__(self, x: Float[Array, " n"]) -> Float[Array, " m"]:
            return self.second(self.first(x))

    model = Two(lin(4, 3), lin(2, 4))
    assert model(jnp.ones(3)).shape == (2,)


def test_tree_at_on_filter_specs_and_partitions_passes():
    layer = lin(2, 3)
    spec = jax.tree_util.tree_map(lambda _: False, layer)
    spec = tm.tree_at(lambda m: m.weight, spec, replace=True)
    assert spec.weight is True and spec.bias is False
    params, static = tm.partition(layer, spec)
    swapped = tm.tree_at(lambda m: m.weight, params, jnp.zeros((2, 3)))
    assert swapped.bias is None
    # ... but a real array of the wrong shape is still caught in a partitioned tree.
    with pytest.raises(tm.ShapeCheckError, match=r"Linear\.weight"):
        tm.tree_at(lambda m: m.weight, params, jnp.zeros(4))


def test_good_calls_under_transforms():
    layer = lin(2, 3)
    assert jax.jit(lambda m, x: m(x))(layer, jnp.ones(3)).shape == (2,)
    assert jax.vmap(layer)(jnp.ones((7, 3))).shape == (7, 2)
    assert jax.vmap(lambda b: Linear(jnp.zeros((2, 3)), b))(jnp.zeros((5, 2))).bias.shape == (5, 2)
    grads = jax.grad(lambda m: jnp.sum(m(jnp.ones(3))))(layer)
    assert grads.weight.shape == (2, 3)
    assert jax.eval_shape(lambda: lin(2, 3)).weight.shape == (2, 3)


# ---------------------------------------------------------------------------- costs


def test_unannotated_modules_pay_nothing():
    assert module_info(Plain).field_spec in (None, ())
    Plain(jnp.ones(2))
    assert module_info(Plain).field_spec == ()
    assert checked_call_state(Plain.__call__) is None  # not wrapped
    assert checked_call_state(Linear.__call__) is not None


def test_checks_run_only_while_tracing(monkeypatch):
    calls = []
    original = _shapecheck._check

    def counting(*args: Any) -> None:
        calls.append(args[3])  # who: the field or argument checked
        return original(*args)

    monkeypatch.setattr(_shapecheck, "_check", counting)
    step = jax.jit(lambda m, x: m(x))
    layer = lin(2, 3)
    spec = checked_call_state(Linear.__call__)[0]
    if spec:  # forget signatures that passed in earlier tests (the per-signature cache)
        spec.passed.clear()
    calls.clear()
    step(layer, jnp.ones(3))
    traced = len(calls)
    assert traced == 4  # weight, bias, x, return value
    for _ in range(3):
        step(layer, jnp.ones(3))
    assert len(calls) == traced  # compiled calls run no Python checks


# ---------------------------------------------------------------------------- laws


@settings(max_examples=30, deadline=None)
@given(
    out=st.integers(1, 5),
    inp=st.integers(1, 5),
    bias=st.integers(1, 5),
    x=st.integers(1, 5),
)
def test_law_errors_iff_sizes_disagree(out, inp, bias, x):
    # Under eval_shape (tracers, nothing compiles); the reference is "sizes equal".
    def build():
        return Linear(jnp.ones((out, inp)), jnp.zeros(bias))

    if bias != out:
        with pytest.raises(tm.ShapeCheckError, match=rf"with out={out} "):
            jax.eval_shape(build)
        return
    if x != inp:
        with pytest.raises(tm.ShapeCheckError, match=rf"with in={inp} "):
            jax.eval_shape(lambda: build()(jnp.ones(x)))
    else:
        assert jax.eval_shape(lambda: build()(jnp.ones(x))).shape == (out,)


@settings(max_examples=20, deadline=None)
@given(batch=st.lists(st.integers(0, 3), max_size=3), n=st.integers(1, 4))
def test_law_any_batch_shape_is_accepted(batch, n):
    def run():
        x = jnp.ones((*batch, n))
        return Batched(x, x)(x)

    assert jax.eval_shape(run).shape == tuple(batch)


def test_checks_run_only_while_tracing_under_filter_jit(monkeypatch):
    filter_jit = tm.filter_jit
    calls = []
    original = _shapecheck._check

    def counting(*args: Any) -> None:
        calls.append(args[3])  # who: the field or argument checked
        return original(*args)

    monkeypatch.setattr(_shapecheck, "_check", counting)
    step = filter_jit(lambda m, x: m(x))
    layer = lin(2, 3)
    spec = checked_call_state(Linear.__call__)[0]
    if spec:  # forget signatures that passed in earlier tests (the per-signature cache)
        spec.passed.clear()
    calls.clear()
    step(layer, jnp.ones(3))
    assert len(calls) == 4
    step(layer, jnp.ones(3))
    step(layer, jnp.ones(3))
    assert len(calls) == 4
    with pytest.raises(tm.ShapeCheckError, match=r"^Linear\.__call__ argument x"):
        step(layer, jnp.ones(5))  # a new shape retraces, and the check fires


def test_compiled_step_is_the_same_program_with_checks_on_and_off():
    def step(m, x):
        return jax.grad(lambda m: jnp.sum(m(x)))(m)

    texts = []
    for flag in (True, False):
        with tm.shape_checks(flag):
            texts.append(jax.jit(step).lower(lin(2, 3), jnp.ones(3)).as_text())
    assert texts[0] == texts[1]


def test_shapecheck_on_static_methods_and_callable_objects():
    class WithStatic(tm.Module):
        w: Float[Array, " n"]

        @staticmethod
        @tm.shapecheck
        def norm(x: Float[Array, " n"]) -> Float[Array, ""]:
            return jnp.sum(x * x)

    assert WithStatic.norm(jnp.ones(3)).shape == ()
    with pytest.raises(tm.ShapeCheckError, match=r"norm argument x: expected Float\[Array, 'n'\]"):
        WithStatic.norm(jnp.ones((2, 2)))

    class Doubler:
        def __call__(self, x):
            return 2.0 * x

    doubled = tm.shapecheck(Doubler())
    assert doubled(jnp.ones(2)).shape == (2,)


def test_custom_init_arguments_are_checked_through_fields_or_on_request():
    class FromWeight(tm.Module):
        weight: Float[Array, "n n"]

        def __init__(self, weight: Float[Array, "n n"], key: Float[Array, "2"]):
            self.weight = weight

    assert checked_call_state(FromWeight.__init__) is None  # not wrapped
    FromWeight(jnp.eye(2), None)  # `key` is not checked: __init__ validates its arguments
    with pytest.raises(tm.ShapeCheckError, match=r"^FromWeight\.weight: expected"):
        FromWeight(jnp.ones((2, 3)), None)  # ... and the field it sets is

    class Strict(tm.Module):
        weight: Float[Array, "n n"]

        @tm.shapecheck
        def __init__(self, weight: Float[Array, "n n"], key: Float[Array, "2"]):
            self.weight = weight

    Strict(jnp.eye(2), jnp.ones(2))
    with pytest.raises(tm.ShapeCheckError, match=r"^Strict\.__init__ argument key"):
        Strict(jnp.eye(2), None)
