"""Property: any leading batch dims give the same result as `jax.vmap` of the unbatched call."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod.nn as nn

from helpers import normal

K = jax.random.key(0)

batch_shapes = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)


def _vmapped(fn, n_batch, in_axes):
    for _ in range(n_batch):
        fn = jax.vmap(fn, in_axes=in_axes)
    return fn


def _both(got, expected, *args):
    """`got(*args)` and `expected(*args)`, compiled as one program (one compilation per
    example instead of one per operation: the batch handling traced is the same)."""
    return jax.jit(lambda *a: (got(*a), expected(*a)))(*args)


# name -> (layer, unbatched input shapes)
SINGLE = {
    "Linear": (nn.Linear(4, 3, key=K), (4,)),
    "Linear-scalar": (nn.Linear("scalar", "scalar", key=K), ()),
    "MLP": (nn.MLP(3, 2, 5, 2, key=K), (3,)),
    "Conv1d": (nn.Conv1d(2, 3, 3, stride=2, padding=1, key=K), (2, 7)),
    "Conv2d": (nn.Conv2d(2, 4, 3, padding="SAME", groups=2, key=K), (2, 5, 6)),
    "Conv3d": (nn.Conv3d(1, 2, 2, key=K), (1, 3, 3, 4)),
    "ConvTranspose1d": (nn.ConvTranspose1d(2, 3, 3, stride=2, key=K), (2, 5)),
    "ConvTranspose2d": (nn.ConvTranspose2d(2, 2, 3, stride=2, padding=1, key=K), (2, 4, 3)),
    "MaxPool1d": (nn.MaxPool1d(2, 2), (2, 7)),
    "MaxPool2d": (nn.MaxPool2d(3, 2, padding=1, use_ceil=True), (2, 6, 5)),
    "AvgPool1d": (nn.AvgPool1d(3, 2, use_ceil=True), (2, 8)),
    "AvgPool2d": (nn.AvgPool2d(2, 1), (2, 4, 4)),
    "AdaptiveAvgPool1d": (nn.AdaptiveAvgPool1d(3), (2, 7)),
    "AdaptiveAvgPool2d": (nn.AdaptiveAvgPool2d((2, 3)), (2, 5, 7)),
    "AdaptiveAvgPool3d": (nn.AdaptiveAvgPool3d((2, 1, 3)), (2, 3, 2, 5)),
    "AdaptiveMaxPool1d": (nn.AdaptiveMaxPool1d(3), (2, 7)),
    "AdaptiveMaxPool2d": (nn.AdaptiveMaxPool2d((2, 3)), (2, 5, 7)),
    "MaxPool3d": (nn.MaxPool3d(2, 1), (2, 3, 3, 4)),
    "AvgPool3d": (nn.AvgPool3d(2, 2, use_ceil=True), (2, 3, 3, 4)),
    "ConvTranspose3d": (nn.ConvTranspose3d(2, 3, 2, stride=2, key=K), (2, 2, 3, 2)),
    "PReLU-per-channel": (nn.PReLU(jnp.full((2, 1), 0.3)), (2, 5)),
    "RotaryPositionalEmbedding": (nn.RotaryPositionalEmbedding(4), (3, 4)),
    "WeightNorm-Conv1d": (nn.WeightNorm(nn.Conv1d(2, 3, 3, key=K)), (2, 6)),
    "SpectralNorm-inference": (
        nn.SpectralNorm(nn.Linear(3, 2, key=K), inference=True, key=K),
        (3,),
    ),
    "LayerNorm": (nn.LayerNorm((3, 4)), (3, 4)),
    "RMSNorm": (nn.RMSNorm(5), (5,)),
    "GroupNorm": (nn.GroupNorm(2, 4, spatial_ndim=1), (4, 3)),
    "Identity": (nn.Identity(), (3,)),
    "Lambda": (nn.Lambda(jnp.tanh), (3,)),
    "Sequential": (nn.Sequential([nn.Linear(3, 4, key=K), jax.nn.relu, nn.LayerNorm(4)]), (3,)),
    "Stack": (nn.Stack(lambda k: nn.Linear(3, 3, key=k), 3, key=K), (3,)),
    "Dropout-inference": (nn.Dropout(0.5, inference=True), (3,)),
}


@pytest.mark.parametrize("name", sorted(SINGLE))
@settings(max_examples=3, deadline=None)
@given(batch=batch_shapes)
def test_single_input_layers(name, batch):
    layer, core = SINGLE[name]
    x = normal(batch + core, 1)
    got, expected = _both(layer, _vmapped(layer, len(batch), 0), x)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@settings(max_examples=3, deadline=None)
@given(batch=batch_shapes)
def test_embedding(batch):
    emb = nn.Embedding(7, 3, key=K)
    idx = jax.random.randint(jax.random.key(1), batch, 0, 7)
    np.testing.assert_array_equal(*_both(emb, _vmapped(emb, len(batch), 0), idx))


@settings(max_examples=3, deadline=None)
@given(batch=batch_shapes)
def test_dropout_is_elementwise(batch):
    # One mask for the whole input: element i is kept iff it is kept in the flattened call.
    drop = nn.Dropout(0.5)
    x = jnp.ones(batch + (4,))
    y, flat = _both(lambda x: drop(x, key=K), lambda x: drop(x.reshape(-1), key=K), x)
    np.testing.assert_array_equal(y.reshape(-1), flat)


@settings(max_examples=3, deadline=None)
@given(batch=batch_shapes, masked=st.booleans(), causal=st.booleans())
def test_multihead_attention(batch, masked, causal):
    mha = nn.MultiheadAttention(2, 4, key_size=3, value_size=5, output_size=6, key=K)
    q, k, v = normal(batch + (3, 4), 1), normal(batch + (5, 3), 2), normal(batch + (5, 5), 3)
    mask = jax.random.bernoulli(jax.random.key(4), 0.6, batch + (3, 5)) if masked else None

    def one(q, k, v, m):
        return mha(q, k, v, m, causal=causal)

    got, expected = _both(
        one, _vmapped(one, len(batch), (0, 0, 0, 0 if masked else None)), q, k, v, mask
    )
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # Key/value without batch dims are broadcast, like vmap with in_axes=None.
    unbatched = k[(0,) * len(batch)], v[(0,) * len(batch)]
    got, expected = _both(
        lambda q, k, v: mha(q, k, v, causal=causal),
        lambda q, k, v: _vmapped(one, len(batch), (0, None, None, None))(q, k, v, None),
        q,
        *unbatched,
    )
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@settings(max_examples=3, deadline=None)
@given(batch=batch_shapes)
def test_gru_cell(batch):
    cell = nn.GRUCell(3, 4, key=K)
    x, h = normal(batch + (3,), 1), normal(batch + (4,), 2)
    got, expected = _both(cell, _vmapped(cell, len(batch), 0), x, h)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@settings(max_examples=3, deadline=None)
@given(batch=batch_shapes)
def test_lstm_cell(batch):
    cell = nn.LSTMCell(3, 4, key=K)
    x, h, c = normal(batch + (3,), 1), normal(batch + (4,), 2), normal(batch + (4,), 3)
    got, expected = _both(
        lambda x, h, c: cell(x, (h, c)),
        _vmapped(lambda x, h, c: cell(x, (h, c)), len(batch), 0),
        x,
        h,
        c,
    )
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _eqns(jaxpr):
    """The equations of `jaxpr`, with each nested `jit` replaced by its own equations."""
    for e in jaxpr.eqns:
        if e.primitive.name in ("jit", "pjit"):
            yield from _eqns(e.params["jaxpr"].jaxpr)
        else:
            yield e


def _primitives(fn, *args):
    return [e.primitive.name for e in _eqns(jax.make_jaxpr(fn)(*args).jaxpr)]


@pytest.mark.parametrize("shape", [(8, 4), (4,)])
def test_linear_stages_as_few_ops_as_plain_jax(shape):
    """Batch handling adds nothing to the program: `x @ W.T + b` is one dot and one add.

    Tracing cost is paid on every compile, so extra reshapes or transposes per layer show up
    directly in the first-call time of deep models.
    """
    layer = nn.Linear(4, 3, key=K)
    ops = _primitives(layer, jnp.ones(shape))
    assert ops.count("dot_general") == 1
    assert "transpose" not in ops
    # The bias is lined up with one reshape (no rank promotion); the input is not reshaped
    # when it already has exactly one batch axis.
    assert ops.count("reshape") == (1 if len(shape) == 2 else 3), ops


NORM_AND_LINEAR = [nn.LayerNorm(8), nn.RMSNorm(8), nn.Linear(8, 8, key=K)]


@pytest.mark.parametrize("layer", NORM_AND_LINEAR, ids=lambda m: type(m).__name__)
def test_layer_core_sees_batch_dims_flattened_to_rows(layer):
    """On `(batch, sequence, width)` activations a layer's core computes on `(rows, width)`.

    Not cosmetic: XLA:CPU builds very large, depth-growing fusions for the backward pass of a
    Transformer whose LayerNorms work on rank-3 activations; on rows it does not (see
    `benchmarks/experiments/layernorm_rank.py`).
    """
    top = jax.make_jaxpr(layer)(jnp.ones((2, 5, 8))).jaxpr
    assert [e.primitive.name for e in top.eqns] == ["reshape", "jit", "reshape"]
    core = top.eqns[1]
    assert [v.aval.shape for v in core.invars][-1] == (10, 8)  # the parameters come first
    assert [v.aval.shape for v in core.outvars] == [(10, 8)]


def _nested_programs(jaxpr):
    return [e.params["jaxpr"] for e in jaxpr.eqns if e.primitive.name in ("jit", "pjit")]


@pytest.mark.parametrize("depth", [3, 6])
def test_identical_layers_share_one_nested_program(depth):
    """Each distinct layer core is traced once and reused, also by the gradient.

    JAX caches the derivative, transpose and lowering of a nested program, so a deep stack of
    same-shaped layers costs about as much to trace as a shallow one.
    """
    mlp = nn.MLP(6, 2, 6, depth, key=K)  # Linear(6, 6) x depth, then Linear(6, 2)
    x = jnp.ones((3, 6))
    top = jax.make_jaxpr(mlp)(x).jaxpr
    assert [e.params["name"] for e in top.eqns if e.primitive.name in ("jit", "pjit")] == [
        "Linear._flat"
    ] * (depth + 1)
    assert len({id(p) for p in _nested_programs(top)}) == 2  # 6 -> 6 and 6 -> 2

    def loss(m):
        return jnp.sum(m(x) ** 2)

    backward = _nested_programs(jax.make_jaxpr(jax.grad(loss))(mlp).jaxpr)
    assert len(backward) == 2 * (depth + 1)  # forward and backward of each layer
    # The first and last layers differ (no input gradient; other shapes): 6 programs, at any
    # depth.
    assert len({id(p) for p in backward}) == 6
    np.testing.assert_allclose(
        jax.grad(loss)(mlp).layers[0].weight,
        jax.grad(lambda m: jnp.sum(_inline_mlp(m, x) ** 2))(mlp).layers[0].weight,
        rtol=1e-5,
    )


def _inline_mlp(mlp, x):
    for layer in mlp.layers[:-1]:
        x = jax.nn.relu(x @ layer.weight.T + layer.bias[None])
    return x @ mlp.layers[-1].weight.T + mlp.layers[-1].bias[None]


def test_linear_mixed_dtypes_follow_matmul_promotion():
    layer = nn.Linear(4, 3, key=K)
    x = jnp.ones((2, 4), jnp.bfloat16)
    with jax.numpy_dtype_promotion("standard"):
        got = layer(x)
        want = x @ layer.weight.T + layer.bias[None]
    assert got.dtype == want.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-6)
