"""tree_at, tree_equal and apply_updates."""

from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod as tm


class Layer(tm.Module):
    weight: jax.Array
    bias: jax.Array | None
    size: int = tm.field(static=True, default=2)


class Model(tm.Module):
    encoder: Layer
    layers: list
    pair: tuple = ()
    table: dict | None = None


def _model() -> Model:
    return Model(
        Layer(jnp.ones((2, 2)), None),
        [Layer(jnp.zeros(2), jnp.ones(2)), Layer(jnp.full(2, 3.0), jnp.zeros(2))],
        pair=(1, 2),
        table={"a": jnp.arange(3)},
    )


# --- tree_at -------------------------------------------------------------------------------------


def test_tree_at_one_node_keeps_everything_else() -> None:
    model = _model()
    new = tm.tree_at(lambda m: m.layers[1].weight, model, jnp.full(2, 9.0))
    np.testing.assert_array_equal(new.layers[1].weight, np.full(2, 9.0))
    assert model.layers[1].weight[0] == 3.0  # the original is untouched
    assert new.layers[0] is model.layers[0] and new.encoder is model.encoder
    assert new.layers[1].bias is model.layers[1].bias
    assert type(new) is Model and new.layers[1].size == 2


def test_tree_at_many_nodes_with_replace_and_replace_fn() -> None:
    model = _model()
    new = tm.tree_at(lambda m: (m.encoder.weight, m.table["a"]), model, (1, 2))
    assert new.encoder.weight == 1 and new.table == {"a": 2}
    doubled = tm.tree_at(
        lambda m: [layer.weight for layer in m.layers], model, replace_fn=lambda w: 2 * w
    )
    np.testing.assert_array_equal(doubled.layers[1].weight, np.full(2, 6.0))
    np.testing.assert_array_equal(doubled.layers[0].bias, np.ones(2))


def test_tree_at_subtree_and_whole_tree() -> None:
    model = _model()
    new_layer = Layer(jnp.zeros(5), jnp.zeros(5), size=5)
    new = tm.tree_at(lambda m: m.encoder, model, new_layer)
    assert new.encoder is new_layer
    assert tm.tree_at(lambda m: m, model, "everything") == "everything"
    # the tuple field itself is one node: replaced whole
    assert tm.tree_at(lambda m: m.pair, model, (7,)).pair == (7,)


def test_tree_at_on_none_and_empty_nodes() -> None:
    model = _model()
    new = tm.tree_at(lambda m: m.encoder.bias, model, jnp.zeros(2))
    np.testing.assert_array_equal(new.encoder.bias, np.zeros(2))
    back = tm.tree_at(lambda m: m.encoder.bias, new, None)
    assert back.encoder.bias is None and back == model
    empty = Model(model.encoder, [], pair=(), table={})
    new = tm.tree_at(lambda m: (m.layers, m.pair, m.table), empty, ([1], (2,), {"k": 3}))
    assert (new.layers, new.pair, new.table) == ([1], (2,), {"k": 3})
    # two distinct `()` in one tree (the empty tuple is a singleton object)
    tree = {"x": (), "y": ()}
    assert tm.tree_at(lambda t: t["y"], tree, 1) == {"x": (), "y": 1}


def test_tree_at_with_is_leaf() -> None:
    tree = {"a": (1, 2), "b": 3}
    out = tm.tree_at(lambda t: t["a"], tree, replace_fn=sum, is_leaf=lambda x: isinstance(x, tuple))
    assert out == {"a": 3, "b": 3}


def test_tree_at_same_node_twice_needs_one_replacement() -> None:
    class Layer(tm.Module):
        w1: jax.Array
        w2: jax.Array

    layer = Layer(jnp.ones(2), jnp.ones(3))
    a, b = jnp.zeros(2), jnp.full(2, 5.0)
    with pytest.raises(ValueError, match=r"selected \.w1 twice \(items 0 and 1\)"):
        tm.tree_at(lambda m: (m.w1, m.w1), layer, (a, b))
    assert tm.tree_at(lambda m: (m.w1, m.w1), layer, (b, b)).w1 is b
    # replace_fn is applied once to a node selected twice
    calls = []
    tm.tree_at(lambda m: [m.w2, m.w2], layer, replace_fn=lambda x: calls.append(x) or x)
    assert len(calls) == 1


def test_collecting_leaves_never_selects_none() -> None:
    """As in Equinox: a `None` is an empty subtree, not a leaf (a filtered gradient's fields)."""
    import equinox as eqx

    updates = {"initial": {"a": jnp.ones(2), "b": None, "c": (jnp.zeros(1), None)}, "x": None}

    def where(u):
        return jax.tree_util.tree_leaves(u["initial"])

    ours = tm.tree_at(where, updates, replace_fn=lambda x: x * 10)
    theirs = eqx.tree_at(where, updates, replace_fn=lambda x: x * 10)
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(theirs)
    for x, y in zip(
        jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs), strict=True
    ):
        np.testing.assert_array_equal(x, y)
    # A None is still selected by its path.
    assert tm.tree_at(lambda u: u["x"], updates, 5)["x"] == 5


def test_tree_at_error_not_in_tree() -> None:
    model = _model()
    with pytest.raises(ValueError, match=r"not a node of the tree \(ArrayImpl\).*lambda m"):
        tm.tree_at(lambda m: jnp.ones(1), model, 0)
    with pytest.raises(ValueError, match=r"not a node of the tree \(str\)"):
        tm.tree_at(lambda m: "elsewhere", model, 0)


def test_tree_at_error_static_field_names_class_and_field() -> None:
    model = _model()
    with pytest.raises(ValueError, match=r"selected Layer\.size, a static field"):
        tm.tree_at(lambda m: m.layers[0].size, model, 3)


def test_tree_at_error_wrong_replace_length() -> None:
    with pytest.raises(ValueError, match="selected 2 nodes, so `replace` must be a sequence of 2"):
        tm.tree_at(lambda t: (t[0], t[1]), [1, 2], (3,))
    with pytest.raises(TypeError, match="sequence of 2 values; got int"):
        tm.tree_at(lambda t: (t[0], t[1]), [1, 2], 3)


def test_tree_at_error_overlapping_nodes_names_paths() -> None:
    model = _model()
    with pytest.raises(
        ValueError, match=r"one inside the other: \.layers\[0\] contains \.layers\[0\]\.weight"
    ):
        tm.tree_at(lambda m: (m.layers[0].weight, m.layers[0]), model, (1, 2))


def test_tree_at_error_replace_and_replace_fn() -> None:
    with pytest.raises(ValueError, match="exactly one of `replace` and `replace_fn`"):
        tm.tree_at(lambda t: t[0], [1], 2, replace_fn=lambda x: x)
    with pytest.raises(ValueError, match="exactly one of `replace` and `replace_fn`"):
        tm.tree_at(lambda t: t[0], [1])


def test_tree_at_never_calls_init_and_keeps_module_frozen() -> None:
    class Once(tm.Module):
        x: jax.Array
        calls = 0

        def __init__(self, x: jax.Array) -> None:
            type(self).calls += 1
            self.x = x

    m = Once(jnp.ones(1))
    new = tm.tree_at(lambda m: m.x, m, jnp.zeros(1))
    assert Once.calls == 1 and float(new.x[0]) == 0.0
    with pytest.raises(tm.FrozenModuleError):
        new.x = 1


def test_tree_at_inside_jit() -> None:
    @jax.jit
    def f(model: Model, w: jax.Array) -> Model:
        return tm.tree_at(lambda m: m.layers[0].weight, model, w)

    out = f(_model(), jnp.full(2, 4.0))
    np.testing.assert_array_equal(out.layers[0].weight, np.full(2, 4.0))


# --- tree_equal ----------------------------------------------------------------------------------


def test_tree_equal_returns_python_bools() -> None:
    a, b = _model(), _model()
    assert tm.tree_equal(a, b) is True
    assert tm.tree_equal(a, b, a) is True
    assert tm.tree_equal(a, tm.tree_at(lambda m: m.pair, a, (1, 3))) is False
    assert tm.tree_equal(a, tm.tree_at(lambda m: m.encoder.bias, a, jnp.ones(2))) is False
    assert tm.tree_equal(jnp.ones(2), jnp.ones(3)) is False  # shape
    assert tm.tree_equal(jnp.ones(2), jnp.ones(2, jnp.int32)) is False  # dtype
    assert tm.tree_equal(jnp.ones(2), np.ones(2, np.float32)) is True  # numpy vs jax: same values
    assert tm.tree_equal(jnp.ones(2), [1.0, 1.0]) is False  # structure
    assert tm.tree_equal(1.0, jnp.float32(1.0)) is False  # array vs Python scalar
    assert tm.tree_equal([1, "a"], [1, "a"]) is True
    assert tm.tree_equal(jnp.array([jnp.nan]), jnp.array([jnp.nan])) is False  # like ==


def test_tree_equal_typematch() -> None:
    assert tm.tree_equal(jnp.ones(2), np.ones(2, np.float32), typematch=True) is False
    assert tm.tree_equal([1, jnp.ones(2)], [1, jnp.ones(2)], typematch=True) is True
    assert tm.tree_equal([1], [True]) is True  # 1 == True
    assert tm.tree_equal([1], [True], typematch=True) is False


def test_tree_equal_needs_a_tree() -> None:
    assert tm.tree_equal([1]) is True
    with pytest.raises(TypeError, match="needs at least one pytree"):
        tm.tree_equal()


def test_tree_equal_static_values_are_compared() -> None:
    a = Layer(jnp.ones(1), None, size=2)
    assert tm.tree_equal(a, Layer(jnp.ones(1), None, size=3)) is False


def test_tree_equal_with_tolerances_matches_numpy_allclose() -> None:
    x = jnp.array([1.0, 100.0])
    y = x + jnp.array([1e-4, 1e-2])
    assert tm.tree_equal(x, y) is False
    for rtol, atol in [(0.0, 1e-3), (0.0, 1e-1), (1e-4, 0.0), (1e-3, 0.0), (1e-5, 1e-4)]:
        expected = bool(np.allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol))
        assert tm.tree_equal(x, y, rtol=rtol, atol=atol) is expected, (rtol, atol)


def test_tree_equal_inside_jit_is_traced() -> None:
    @jax.jit
    def eq(a: jax.Array, b: jax.Array) -> jax.Array:
        out = tm.tree_equal({"a": a, "s": "x"}, {"a": b, "s": "x"})
        assert isinstance(out, jax.Array)
        return out

    assert bool(eq(jnp.ones(2), jnp.ones(2))) is True
    assert bool(eq(jnp.ones(2), jnp.zeros(2))) is False
    close = jax.jit(lambda a, b: tm.tree_equal(a, b, atol=0.1))
    assert bool(close(jnp.ones(2), jnp.ones(2) + 0.05)) is True
    assert bool(close(jnp.ones(2), jnp.ones(2) + 0.5)) is False

    @jax.jit
    def static_mismatch(a: jax.Array) -> jax.Array:
        out = tm.tree_equal(a, jnp.ones(3))  # shapes differ: known without tracing values
        assert out is False
        return a

    static_mismatch(jnp.ones(2))


def test_tree_equal_compares_prng_keys_by_their_bits() -> None:
    keys = jax.random.split(jax.random.key(0), 2)
    same = jax.random.wrap_key_data(jax.random.key_data(keys))  # rebuilt from the raw bits
    assert tm.tree_equal({"k": keys}, {"k": same}) is True
    near = [jax.random.wrap_key_data(jnp.array([0, i], jnp.uint32)) for i in (1, 2)]
    assert tm.tree_equal(*near, atol=10) is False  # bits within 10 of each other: no tolerance
    assert tm.tree_equal(keys[0], jax.random.key(0, impl="rbg")) is False  # other dtype
    eq = jax.jit(lambda a, b: tm.tree_equal(a, b))
    assert bool(eq(keys, same)) is True
    assert bool(eq(keys, keys[::-1])) is False


# --- apply_updates -------------------------------------------------------------------------------


def test_apply_updates_adds_and_skips_none() -> None:
    model = _model()
    params, static = tm.partition(model, tm.is_inexact_array)
    updates = jtu.tree_map(lambda p: jnp.full_like(p, 0.5), params)
    new = tm.apply_updates(model, updates)
    np.testing.assert_array_equal(new.encoder.weight, np.full((2, 2), 1.5))
    np.testing.assert_array_equal(new.layers[1].bias, np.full(2, 0.5))
    assert new.table["a"] is model.table["a"]  # integer array: update was None
    assert new.pair == (1, 2) and new.encoder.bias is None


def test_apply_updates_with_optax_matches_plain_jax() -> None:
    optax = pytest.importorskip("optax")
    model = Layer(jnp.array([1.0, 2.0]), jnp.array([0.5]))

    def loss(m: Layer) -> jax.Array:
        return jnp.sum(m.weight**2) + jnp.sum(m.bias**2)  # type: ignore[operator]

    opt = optax.sgd(0.1)
    grads = jax.grad(loss)(model)
    updates, _ = opt.update(grads, opt.init(model))
    new = tm.apply_updates(model, updates)
    np.testing.assert_allclose(new.weight, np.array([1.0, 2.0]) * (1 - 0.2), rtol=1e-6)
    np.testing.assert_allclose(new.bias, np.array([0.5]) * (1 - 0.2), rtol=1e-6)


@settings(max_examples=20, deadline=None)
@given(
    param_dtype=st.sampled_from([jnp.bfloat16, jnp.float16, jnp.float32]),
    update_dtype=st.sampled_from([jnp.bfloat16, jnp.float16, jnp.float32]),
    values=st.lists(st.floats(-100, 100, width=16), min_size=2, max_size=2),
)
def test_apply_updates_keeps_the_parameter_dtype_as_optax_does(
    param_dtype: Any, update_dtype: Any, values: list
) -> None:
    optax = pytest.importorskip("optax")
    params = {"w": jnp.asarray(values, param_dtype), "n": jnp.int32(3)}
    updates = {"w": jnp.asarray(values[::-1], update_dtype) / 3, "n": None}
    ours = tm.apply_updates(params, updates)
    assert ours["w"].dtype == param_dtype and ours["n"] is params["n"]
    with jax.numpy_dtype_promotion("standard"):  # optax adds with the standard promotion
        theirs = optax.apply_updates({"w": params["w"]}, {"w": updates["w"]})
    np.testing.assert_array_equal(
        np.asarray(ours["w"], np.float32), np.asarray(theirs["w"], np.float32)
    )
