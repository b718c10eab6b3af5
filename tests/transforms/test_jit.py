"""filter_jit: equality with jax.jit, static leaves, modules and methods, donation, AOT, errors."""

from __future__ import annotations

import functools
import gc
import types
import weakref
from typing import Any

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod as tm
import treemod.nn as nn

from helpers import close

# Random pytrees of float32 arrays: nested dicts, lists and tuples.
_shapes = hnp.array_shapes(min_dims=0, max_dims=2, max_side=3)
_arrays = _shapes.flatmap(
    lambda s: hnp.arrays(np.float32, s, elements=st.floats(-10, 10, width=32))
).map(jnp.asarray)
_trees = st.recursive(
    _arrays,
    lambda children: st.one_of(
        st.lists(children, min_size=1, max_size=3),
        st.lists(children, min_size=1, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from("abcd"), children, min_size=1, max_size=3),
    ),
    max_leaves=6,
)


_close = functools.partial(close, rtol=1e-6, atol=1e-6)


def _fn(tree: Any, other: Any) -> Any:
    leaves = jax.tree_util.tree_leaves(other)
    total = sum((jnp.sum(x) for x in leaves), jnp.float32(0))
    return jax.tree_util.tree_map(lambda x: jnp.sin(x) * 2.0 + total, tree)


@settings(max_examples=10, deadline=None)
@given(_trees, _trees)
def test_equals_jax_jit_on_array_trees(tree: Any, other: Any) -> None:
    _close(tm.filter_jit(_fn)(tree, other), jax.jit(_fn)(tree, other))


class Linear(tm.Module):
    weight: jax.Array
    bias: jax.Array
    act: Any = jnp.tanh

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.act(self.weight @ x + self.bias)

    @tm.filter_jit
    def jitted(self, x: jax.Array) -> tuple[jax.Array, str]:
        return self(x), "done"

    def plain(self, x: jax.Array, scale: float) -> jax.Array:
        return self(x) * scale


def _linear(n: int = 3, seed: int = 0) -> Linear:
    kw, kb = jax.random.split(jax.random.key(seed))
    return Linear(jax.random.normal(kw, (n, n)), jax.random.normal(kb, (n,)))


def _reference(model: Linear, x: jax.Array) -> np.ndarray:
    w, b = np.asarray(model.weight), np.asarray(model.bias)
    return np.tanh(w @ np.asarray(x) + b)


def test_static_leaves_and_non_array_outputs() -> None:
    @tm.filter_jit
    def f(x: jax.Array, n: int, name: str, *, scale: float) -> tuple[jax.Array, str, int]:
        return x * n * scale, name + "!", n

    y, name, n = f(jnp.ones(2), 3, "a", scale=2.0)
    np.testing.assert_allclose(y, [6.0, 6.0])
    assert (name, n) == ("a!", 3)
    f(jnp.zeros(2), 3, "a", scale=2.0)
    assert tm.debug.get_num_traces(f) == 1
    f(jnp.zeros(2), 4, "a", scale=2.0)  # new static value
    f(jnp.zeros(2), 3, "a", scale=3.0)  # new static keyword value
    assert tm.debug.get_num_traces(f) == 3


@pytest.mark.parametrize("donate", ["none", "all"])
def test_non_array_outputs_keep_jax_fast_dispatch(donate: str, monkeypatch) -> None:
    # A float or function leaf among the outputs used to send every call down JAX's Python
    # dispatch (about ten times slower). Count the calls that take that path after warm-up.
    from jax._src import pjit

    python_path = getattr(pjit, "_run_python_pjit", None)
    # Not a skip: without the counter this regression would pass unseen. A JAX that renamed it
    # needs this test pointed at its Python dispatch path.
    assert python_path is not None, "jax._src.pjit._run_python_pjit is gone: update this test"
    calls = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return python_path(*args, **kwargs)

    class Scaled(tm.Module):
        w: jax.Array
        scale: float  # plain fields: leaves of the tree that are not arrays
        activation: Any

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.activation(self.w * x * self.scale)

    model = Scaled(jnp.arange(3.0), 0.5, jax.nn.gelu)

    def double(m: Scaled, x: jax.Array) -> tuple[Scaled, jax.Array, str]:
        return tm.tree_at(lambda m: m.w, m, 2 * m.w), m(x), "tag"

    step = tm.filter_jit(double, donate=donate)
    model, y, tag = step(model, jnp.ones(3))
    monkeypatch.setattr(pjit, "_run_python_pjit", counting)
    for _ in range(3):
        model, y, tag = step(model, jnp.ones(3))  # a new x: "all" donates it
    assert calls == []
    assert (model.scale, model.activation, tag) == (0.5, jax.nn.gelu, "tag")
    np.testing.assert_allclose(model.w, np.arange(3.0) * 16)
    np.testing.assert_allclose(y, jax.nn.gelu(np.arange(3.0) * 8 * 0.5), rtol=1e-6)


def test_numpy_and_jax_arrays_share_a_trace() -> None:
    f = tm.filter_jit(lambda x: x + 1)
    np.testing.assert_allclose(f(np.ones(2, np.float32)), [2.0, 2.0])
    np.testing.assert_allclose(f(jnp.ones(2)), [2.0, 2.0])
    assert tm.debug.get_num_traces(f) == 1


def test_static_values_of_different_types_do_not_collide() -> None:
    f = tm.filter_jit(lambda n: jnp.asarray(n))
    assert f(2).dtype == jnp.int32
    out = f(2.0)  # 2.0 == 2 and hash(2.0) == hash(2), but it is a float
    assert jnp.issubdtype(out.dtype, jnp.floating)
    assert tm.debug.get_num_traces(f) == 2


def test_module_as_function_traces_its_arrays() -> None:
    model, x = _linear(), jnp.arange(3.0)
    f = tm.filter_jit(model)
    np.testing.assert_allclose(f(x), _reference(model, x), rtol=1e-5)
    assert tm.debug.get_num_traces(f) == 1


def test_bound_method_traces_the_module_and_shares_compiled_code() -> None:
    x = jnp.arange(3.0)
    results = []
    for seed in range(3):  # a new wrapper per new model: compiled once
        model = _linear(seed=seed)
        f = tm.filter_jit(model.plain)
        results.append(f(x, 2.0))
        np.testing.assert_allclose(results[-1], 2.0 * _reference(model, x), rtol=1e-5)
    assert tm.debug.get_num_traces(f) == 1


def test_method_decorated_in_class_body() -> None:
    model, x = _linear(), jnp.arange(3.0)
    out, tag = model.jitted(x)
    np.testing.assert_allclose(out, _reference(model, x), rtol=1e-5)
    assert tag == "done"
    bound = model.jitted
    assert isinstance(bound, types.MethodType)
    assert bound.__func__ is Linear.__dict__["jitted"]  # no wrapper rebuilt per access
    _linear(seed=1).jitted(x)
    assert tm.debug.get_num_traces(Linear.jitted) == 1
    assert tm.filter_jit(model.jitted)(x)[1] == "done"


def test_module_output_round_trips() -> None:
    model = _linear()

    @tm.filter_jit
    def scale(m: Linear) -> Linear:
        return tm.tree_at(lambda m: m.weight, m, m.weight * 2)

    out = scale(model)
    assert isinstance(out, Linear) and out.act is jnp.tanh
    np.testing.assert_allclose(out.weight, 2 * model.weight)


def test_composes_with_grad_vmap_and_jit() -> None:
    f = tm.filter_jit(lambda x, p: jnp.sum(x**p))
    x = jnp.arange(3.0)
    np.testing.assert_allclose(jax.grad(f)(x, 2), 2 * x)
    np.testing.assert_allclose(jax.vmap(f, in_axes=(0, None))(x, 2), x**2)
    np.testing.assert_allclose(jax.jit(lambda x: f(x, 3))(x), jnp.sum(x**3))
    np.testing.assert_allclose(tm.filter_jit(lambda x: f(x, 2))(x), 5.0)


def test_donation() -> None:
    step = lambda a, b: (a + 1, b + 1)
    a, b = jnp.ones(3), jnp.ones(3)
    tm.filter_jit(step, donate="none")(a, b)
    assert not a.is_deleted() and not b.is_deleted()
    tm.filter_jit(step, donate="all-except-first")(a, b)
    assert not a.is_deleted() and b.is_deleted()
    a, b = jnp.ones(3), jnp.ones(3)
    tm.filter_jit(step, donate="all")(a, b)
    assert a.is_deleted() and b.is_deleted()
    c = jnp.ones(4)
    tm.filter_jit(lambda c: jnp.sum(c), donate="all")(c)  # unusable donation: no warning


def test_donate_warn_lets_jax_warn() -> None:
    with pytest.warns(UserWarning, match="donated buffers were not usable"):
        tm.filter_jit(lambda c: jnp.sum(c), donate="warn")(jnp.ones(5))


def test_donation_keeps_a_module_function_with_except_first() -> None:
    model = _linear()
    x, y = jnp.ones(3), jnp.ones(3)
    f = tm.filter_jit(lambda m, x, y: (m(x), y + 1), donate="all-except-first")
    f(model, x, y)
    assert not model.weight.is_deleted() and x.is_deleted() and y.is_deleted()
    x, y = jnp.ones(3), jnp.ones(3)
    tm.filter_jit(model.plain, donate="all-except-first")(x, y)  # `model` is kept too
    assert not model.weight.is_deleted() and not x.is_deleted() and y.is_deleted()


def test_lower_and_compile() -> None:
    f = tm.filter_jit(lambda m, x, tag: (m(x), tag))
    model, x = _linear(), jnp.arange(3.0)
    lowered = f.lower(model, x, "t")
    assert "tanh" in lowered.as_text()
    compiled = lowered.compile()
    out, tag = compiled(model, x + 1, "t")
    np.testing.assert_allclose(out, _reference(model, x + 1), rtol=1e-5)
    assert tag == "t"
    with pytest.raises(TypeError, match="lowered for arguments with a different"):
        compiled(model, x, "other")


@pytest.mark.parametrize("donate", ["none", "all-except-first"])
def test_wrappers_are_freed_without_the_garbage_collector(donate: str) -> None:
    """No reference cycle: a dropped wrapper frees its compiled versions at once.

    A cycle would hold every executable until Python's next full collection, which then runs
    (and frees them) in the middle of some later, unrelated trace.
    """
    model = _linear()
    cases = [
        (lambda m, x: m(x), lambda: (model, jnp.arange(3.0))),
        (model, lambda: (jnp.arange(3.0),)),
        (model.plain, lambda: (jnp.arange(3.0), jnp.array(2.0))),
    ]
    gc.collect()
    gc.disable()
    try:
        for fn, make_args in cases:
            f = tm.filter_jit(fn, donate=donate)
            f(*make_args())
            ref = weakref.ref(f)
            del f
            assert ref() is None, fn
    finally:
        gc.enable()


def test_shared_method_versions_do_not_keep_a_model_alive() -> None:
    """Compiled versions of a method are shared between models, but not the first model."""
    model = _linear(seed=7)
    weight = weakref.ref(model.weight)
    tm.filter_jit(model.plain)(jnp.arange(3.0), 2.0)
    del model
    gc.collect()
    assert weight() is None


def test_programs_are_named_after_the_function() -> None:
    def train_step(m: Any, x: jax.Array) -> jax.Array:
        return m(x)

    text = tm.filter_jit(train_step).lower(_linear(), jnp.arange(3.0)).as_text()
    assert "module @jit_train_step" in text
    nn_text = jax.jit(lambda x: nn.Linear(3, 2, key=jax.random.key(0))(x)).lower(jnp.ones(3))
    assert "call @Linear._flat" in nn_text.as_text()  # layers show up by name, too


def test_unhashable_static_argument_names_its_path() -> None:
    class Config:
        __hash__ = None  # type: ignore[assignment]

    f = tm.filter_jit(lambda x, cfg: x)
    with pytest.raises(TypeError, match=r"args\[1\] is a Config, which is not hashable"):
        f(jnp.ones(1), Config())
    with pytest.raises(TypeError, match=r"kwargs\['cfg'\]\['opts'\]\[0\] is a Config"):
        f(jnp.ones(1), cfg={"opts": [Config()]})


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="donate must be one of"):
        tm.filter_jit(lambda x: x, donate="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expects a callable"):
        tm.filter_jit(3)  # type: ignore[arg-type]


def test_decorator_with_options_and_metadata() -> None:
    @tm.filter_jit(donate="none")
    def my_step(x: jax.Array) -> jax.Array:
        """Doc."""
        return x

    assert my_step.__name__ == "my_step" and my_step.__doc__ == "Doc."
    assert repr(my_step) == "filter_jit(my_step)"
