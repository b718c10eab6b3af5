"""`Stack`: equals the unrolled loop, per-layer keys, indexing, state inside the scan, gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm
import treemod.nn as nn


class Block(tm.Module):
    mlp: nn.MLP
    norm: nn.LayerNorm
    dropout: nn.Dropout

    def __init__(self, key):
        self.mlp = nn.MLP(6, 6, 12, 1, key=key)
        self.norm = nn.LayerNorm(6)
        self.dropout = nn.Dropout(0.5)

    def __call__(self, x, *, key=None):
        return x + self.dropout(self.mlp(self.norm(x)), key=key, inference=key is None)


def _stack(n=4):
    return nn.Stack(Block, n, key=jax.random.key(0))


def test_layers_are_built_from_one_subkey_each():
    stack = _stack()
    keys = jax.random.split(jax.random.key(0), 4)
    for i in range(4):
        assert tm.tree_equal(stack[i], Block(keys[i]), rtol=1e-6, atol=1e-6)
    assert stack.layers.mlp.layers[0].weight.shape == (4, 12, 6)
    assert len(stack) == 4 and len(list(stack)) == 4
    assert tm.tree_equal(stack[-1], stack[3])


def test_equals_unrolled_loop_with_per_layer_dropout_keys():
    stack = _stack()
    x = jax.random.normal(jax.random.key(1), (3, 6))
    key = jax.random.key(2)
    expected = x
    for layer, k in zip(stack, jax.random.split(key, 4), strict=True):
        expected = layer(expected, key=k)
    np.testing.assert_allclose(stack(x, key=key), expected, rtol=1e-5, atol=1e-5)
    # Per-layer keys differ, so each layer drops different units: 1/8 survive three layers
    # (one shared key would keep 1/2).
    drops = nn.Stack(lambda k: nn.Dropout(0.5), 3, key=jax.random.key(0))
    kept = float((drops(jnp.ones(4000), key=key) > 0).mean())
    assert 0.1 < kept < 0.15


def test_gradients_equal_unrolled():
    stack = _stack(3)
    x = jax.random.normal(jax.random.key(1), (2, 6))

    def loss_scan(params):
        return jnp.sum(tm.combine(params, static)(x) ** 2)

    def loss_loop(params):
        s = tm.combine(params, static)
        y = x
        for layer in s:
            y = layer(y)
        return jnp.sum(y**2)

    params, static = tm.partition(stack, tm.is_inexact_array)
    # Both gradients in one jax.jit: one compilation instead of one per eager operation.
    scanned, looped = jax.jit(lambda p: (jax.grad(loss_scan)(p), jax.grad(loss_loop)(p)))(params)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), scanned, looped
    )


def test_extra_arguments_reach_every_layer():
    mha_stack = nn.Stack(lambda k: _SelfAttention(k), 2, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (5, 8))
    mask = jnp.tril(jnp.ones((5, 5), bool))
    y = x
    for layer in mha_stack:
        y = layer(y, mask)
    np.testing.assert_allclose(mha_stack(x, mask), y, rtol=1e-5, atol=1e-5)


class _SelfAttention(tm.Module):
    mha: nn.MultiheadAttention

    def __init__(self, key):
        self.mha = nn.MultiheadAttention(2, 8, key=key)

    def __call__(self, x, mask):
        return x + self.mha(x, x, x, mask)


class Counter(tm.Module):
    count: tm.State
    scale: jax.Array

    def __call__(self, x):
        tm.update_state(self.count, self.count.value + 1)
        return x * self.scale


def test_stateful_layers_inside_stack():
    def make(k):
        return Counter(tm.State(jnp.array(0, jnp.int32)), jax.random.uniform(k, (2,)))

    stack = nn.Stack(make, 3, key=jax.random.key(0))
    x = jnp.ones(2)
    out, stack2 = tm.stateful(stack)(x)
    np.testing.assert_array_equal(stack2.layers.count.value, [1, 1, 1])
    np.testing.assert_allclose(out, stack.layers.scale.prod(0), rtol=1e-6)
    _, stack3 = jax.jit(lambda s, x: tm.stateful(s)(x))(stack2, x)
    np.testing.assert_array_equal(stack3.layers.count.value, [2, 2, 2])
    # A plain call outside `stateful` cannot keep the new state: a clear error.
    with pytest.raises(RuntimeError, match="outside treemod.stateful"):
        stack(x)
    # Inside Sequential, next to ordinary layers.
    model = nn.Sequential([nn.Linear(2, 2, key=jax.random.key(1)), stack])
    _, model2 = tm.stateful(model)(x)
    np.testing.assert_array_equal(model2[1].layers.count.value, [1, 1, 1])


def test_from_layers_and_jit():
    keys = jax.random.split(jax.random.key(0), 3)
    layers = [nn.Linear(4, 4, key=k) for k in keys]
    stack = nn.Stack.from_layers(layers)
    for i in range(3):
        assert tm.tree_equal(stack[i], layers[i])
    x = jnp.ones((2, 4))
    expected = layers[2](layers[1](layers[0](x)))
    np.testing.assert_allclose(jax.jit(lambda s, x: s(x))(stack, x), expected, rtol=1e-5)
    unrolled = nn.Stack(lambda k: nn.Linear(4, 4, key=k), 3, key=jax.random.key(0), unroll=3)
    np.testing.assert_allclose(
        unrolled(x),
        nn.Stack(lambda k: nn.Linear(4, 4, key=k), 3, key=jax.random.key(0))(x),
        rtol=1e-6,
    )


class _Pair(tm.Module):
    a: jax.Array
    b: jax.Array


class _Outer(tm.Module):
    inner: _Pair


def test_stack_errors():
    with pytest.raises(ValueError, match="Stack: `num_layers` must be a positive int"):
        nn.Stack(Block, 0, key=jax.random.key(0))
    # The shape checker (on in tests) or Stack itself rejects a missing key, naming Stack.
    with pytest.raises(TypeError, match="Stack needs a PRNG key|Stack.__init__ argument key"):
        nn.Stack(Block, 2, key=None)
    stack = _stack(2)
    with pytest.raises(IndexError, match="Stack index 2 out of range for 2 layers"):
        stack[2]
    want = r"layer 1 has f32\[3\] at \.value where layer 0 has f32\[2\]"
    with pytest.raises(ValueError, match=want):
        nn.Stack.from_layers([tm.State(jnp.zeros(2)), tm.State(jnp.zeros(3))])
    want = r"layer 1 has i32\[2\] at \.inner\.b where layer 0 has f32\[2\]"
    with pytest.raises(ValueError, match=want):
        nn.Stack.from_layers(
            [
                _Outer(_Pair(jnp.ones(2), jnp.ones(2))),
                _Outer(_Pair(jnp.ones(2), jnp.ones(2, jnp.int32))),
            ]
        )
    with pytest.raises(
        ValueError, match="Stack.from_layers: layer 1 does not have the tree structure"
    ):
        nn.Stack.from_layers([nn.Linear(2, 2, key=jax.random.key(0)), nn.LayerNorm(2)])
    with pytest.raises(ValueError, match="Stack.from_layers: layer 1 has non-array values"):
        nn.Stack.from_layers([nn.Dropout(0.1), nn.Dropout(0.2)])
    with pytest.raises(ValueError, match="Stack.from_layers needs at least one layer"):
        nn.Stack.from_layers([])
    grow = nn.Stack(lambda k: nn.Linear(2, 3, key=k), 2, key=jax.random.key(0))
    with pytest.raises(
        ValueError, match=r"Stack: each layer must return an output with the structure"
    ):
        grow(jnp.ones(2))


def test_tree_at_edits_inside_a_stack() -> None:
    # The stacked arrays have an extra leading axis, so tree_at must not shape-check the
    # layer annotations (which describe one slice) below a Stack.
    stack = nn.Stack(lambda k: nn.Linear(3, 3, key=k), 4, key=jax.random.key(0))
    new_weight = jnp.zeros((4, 3, 3))
    edited = tm.tree_at(lambda s: s.layers.weight, stack, new_weight)
    assert edited.layers.weight is new_weight
    np.testing.assert_array_equal(edited(jnp.ones(3)), np.asarray(stack.layers.bias[-1]))
    # Above the Stack, checks still run: a wrong shape in a checked module is caught.
    with pytest.raises(tm.ShapeCheckError, match="Linear.weight"):
        tm.tree_at(lambda m: m.weight, nn.Linear(3, 3, key=jax.random.key(1)), jnp.zeros(3))
