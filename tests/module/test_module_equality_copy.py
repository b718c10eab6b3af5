"""Module equality and hashing, pickling and copying, and building modules inside transforms."""

import copy
import functools
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm

# --- classes at module level so that pickle can find them -------------------------------------


class Linear(tm.Module):
    weight: jax.Array
    bias: jax.Array
    activation: object = tm.field(static=True, default=jax.nn.relu)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.activation(self.weight @ x + self.bias)


class Net(tm.Module):
    layers: list
    config: dict = tm.field(static=True, default_factory=dict)
    extra: object = None


class Counted(tm.Module):
    x: jax.Array
    inits = 0

    def __init__(self, x: jax.Array) -> None:
        type(self).inits += 1
        self.x = x


def _linear(n_in: int = 2, n_out: int = 3, seed: int = 0) -> Linear:
    weight = np.arange(n_out * n_in, dtype=np.float32).reshape(n_out, n_in) / 7 + seed
    return Linear(jnp.asarray(weight), jnp.arange(n_out, dtype=jnp.float32) - seed)


# --- 6. equality and hashing --------------------------------------------------------------------


def test_eq_is_tree_equal() -> None:
    a, b = _linear(), _linear()
    assert a == b and (a == b) is True
    assert a != _linear(seed=1)
    assert a != Linear(a.weight, a.bias, jax.nn.tanh)  # static functions compared by ==
    assert a != "not a module"
    assert Net([a], {"k": 1}) == Net([b], {"k": 1})
    assert Net([a], {"k": 1}) != Net([b], {"k": 2})
    c = Linear(a.weight.astype(jnp.float16), a.bias)
    assert a != c  # dtypes differ
    # inside jit the comparison of traced leaves is a traced boolean
    assert bool(jax.jit(lambda x, y: x == y)(a, b)) is True
    assert bool(jax.jit(lambda x, y: x == y)(a, _linear(seed=1))) is False


def test_static_functions_compare_by_equality() -> None:
    same = functools.partial(jnp.sum, axis=0)
    a = Linear(jnp.ones(1), jnp.ones(1), same)
    assert a == Linear(jnp.ones(1), jnp.ones(1), same)
    # partial objects are compared by identity, so an equal-looking new partial differs
    assert a != Linear(jnp.ones(1), jnp.ones(1), functools.partial(jnp.sum, axis=0))
    assert a != Linear(jnp.ones(1), jnp.ones(1), lambda x: x)


def test_hash_for_hashable_leaves() -> None:
    class Key(tm.Module):
        a: int
        b: tuple
        name: str = tm.field(static=True, default="k")
        cfg: dict = tm.field(static=True, default_factory=dict)

    k1, k2 = Key(1, (2, 3)), Key(1, (2, 3))
    assert hash(k1) == hash(k2)
    table = {k1: "value"}
    assert table[k2] == "value"
    assert Key(1, (2, 4)) not in table
    assert len({k1, k2, Key(1, (2, 3), "other")}) == 2
    assert hash(Key(1, (), cfg={"a": [1]})) == hash(Key(1, (), cfg={"a": [1]}))


def test_hash_error_names_the_leaf_path() -> None:
    net = Net([Linear(jnp.ones(1), jnp.ones(1))])
    with pytest.raises(
        TypeError, match=r"Net is not hashable: the leaf at Net\.layers\[0\]\.weight"
    ):
        hash(net)
    with pytest.raises(TypeError, match=r"leaf at Net\.extra is an unhashable builtins\.set"):
        hash(Net([], extra={1, 2}))


# --- 8. pickle and copy --------------------------------------------------------------------------


def test_pickle_round_trip() -> None:
    net = Net([_linear(), _linear(seed=1)], {"depth": 2}, extra=(1, "a"))
    back = pickle.loads(pickle.dumps(net))
    assert back == net and type(back) is Net
    assert back.layers[0].activation is jax.nn.relu
    with pytest.raises(tm.FrozenModuleError):
        back.extra = 0
    c = Counted(jnp.ones(1))
    before = Counted.inits
    pickle.loads(pickle.dumps(c))
    assert Counted.inits == before


def test_pickle_jax_wrapped_functions_in_fields() -> None:
    # jax.nn.relu (custom_jvp) and jnp.tanh (jitted) cannot be pickled on their own
    with pytest.raises(pickle.PicklingError):
        pickle.dumps(jax.nn.relu)
    lin = Linear(jnp.eye(2), jnp.ones(2), jnp.tanh)
    back = pickle.loads(pickle.dumps(_linear()))
    assert back.activation is jax.nn.relu and back == _linear()
    back = pickle.loads(pickle.dumps(lin))
    assert back.activation is jnp.tanh and back == lin
    np.testing.assert_allclose(back(jnp.ones(2)), lin(jnp.ones(2)))


def test_copy_and_deepcopy() -> None:
    net = Net([_linear()], {"depth": 1})
    shallow = copy.copy(net)
    assert shallow == net and shallow is not net and shallow.layers is net.layers
    deep = copy.deepcopy(net)
    assert deep == net and deep.layers is not net.layers
    assert deep.layers[0].weight is not net.layers[0].weight
    assert deep.config is net.config  # static configuration is shared, not copied
    with pytest.raises(tm.FrozenModuleError):
        deep.config = {}
    c = Counted(jnp.ones(1))
    before = Counted.inits
    copy.copy(c), copy.deepcopy(c)
    assert Counted.inits == before


# --- 9. building modules inside transforms -------------------------------------------------------


def test_build_inside_jit_vmap_and_scan() -> None:
    def make(key: jax.Array) -> Linear:
        return Linear(jnp.full((3, 2), key), jnp.zeros(3))

    key = jnp.float32(0.5)
    jitted = jax.jit(make)(key)
    assert jitted == make(key)

    keys = jnp.arange(4, dtype=jnp.float32)
    batched = jax.vmap(make)(keys)
    assert batched.weight.shape == (4, 3, 2)
    np.testing.assert_allclose(batched.weight[2], make(keys[2]).weight, rtol=1e-6)

    def step(carry: Linear, k: jax.Array) -> tuple[Linear, Linear]:
        new = make(k)
        return Linear(carry.weight + new.weight, carry.bias), new

    init = Linear(jnp.zeros((3, 2)), jnp.zeros(3))
    total, stacked = jax.lax.scan(step, init, keys)
    assert stacked.weight.shape == (4, 3, 2)
    np.testing.assert_allclose(total.weight, stacked.weight.sum(0), rtol=1e-5)


def test_converter_and_check_init_run_under_jit() -> None:
    class Pos(tm.Module):
        x: jax.Array = tm.field(converter=jnp.abs)

        def __check_init__(self) -> None:
            assert self.x.shape == (2,)

    out = jax.jit(lambda v: Pos(v))(jnp.array([-1.0, 2.0]))
    np.testing.assert_allclose(out.x, np.array([1.0, 2.0]))
