"""Sequential/Lambda/Identity/Dropout behaviour, and every error path of the layers.

Shape checks are on in tests, so some bad calls are caught by the checker (a ShapeCheckError
naming the layer and argument) before the layer's own validation; both messages are accepted.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod as tm
import treemod.nn as nn

K = jax.random.key(0)


def test_sequential_threads_one_key_per_layer():
    k1, k2 = jax.random.split(K)
    model = nn.Sequential([nn.Linear(3, 8, key=k1), jnp.tanh, nn.Dropout(0.5), nn.Lambda(jnp.abs)])
    x = jnp.ones((2, 3))
    key = jax.random.key(5)
    keys = jax.random.split(key, 4)
    expected = jnp.abs(nn.Dropout(0.5)(jnp.tanh(model[0](x)), key=keys[2]))
    np.testing.assert_array_equal(model(x, key=key), expected)
    assert len(model) == 4 and isinstance(model[1:], nn.Sequential) and len(model[1:]) == 3
    assert list(model)[1] is jnp.tanh
    # In inference mode no key is needed.
    inf = tm.tree_at(lambda m: m.layers[2], model, nn.Dropout(0.5, inference=True))
    np.testing.assert_array_equal(inf(x), jnp.abs(jnp.tanh(model[0](x))))


def test_sequential_with_state():
    class Count(tm.Module):
        n: tm.State

        def __call__(self, x):
            tm.update_state(self.n, self.n.value + 1)
            return x

    model = nn.Sequential(
        [Count(tm.State(jnp.array(0))), nn.Identity(), Count(tm.State(jnp.array(5)))]
    )
    _, model = tm.stateful(model)(jnp.ones(2))
    assert int(model[0].n.value) == 1 and int(model[2].n.value) == 6


def test_dropout_statistics_and_modes():
    drop = nn.Dropout(0.25)
    y = drop(jnp.ones(100_000), key=K)
    assert abs(float((y == 0).mean()) - 0.25) < 0.01
    np.testing.assert_allclose(float(y.mean()), 1.0, atol=0.01)
    assert set(np.unique(np.asarray(y)).tolist()) == {0.0, 4.0 / 3.0} or np.allclose(
        np.unique(np.asarray(y)), [0.0, 4.0 / 3.0]
    )
    x = jnp.arange(3.0)
    np.testing.assert_array_equal(nn.Dropout(0.5, inference=True)(x), x)
    np.testing.assert_array_equal(drop(x, inference=True), x)
    np.testing.assert_array_equal(drop(x, deterministic=True), x)
    np.testing.assert_array_equal(nn.Dropout(0.0)(x), x)
    np.testing.assert_array_equal(nn.Dropout(1.0)(x, key=K), jnp.zeros(3))


def test_linear_scalar_features():
    lin = nn.Linear("scalar", 3, key=K)
    assert lin(jnp.array(2.0)).shape == (3,) and lin.weight.shape == (3, 1)
    out = nn.Linear(3, "scalar", key=K)
    assert out(jnp.ones((4, 3))).shape == (4,)
    np.testing.assert_allclose(out(jnp.ones(3)), out.weight[0].sum() + out.bias[0], rtol=1e-6)


def test_embedding_from_weight_and_mlp_widths():
    emb = nn.Embedding(weight=jnp.eye(3))
    np.testing.assert_array_equal(emb(jnp.array(1)), jnp.array([0.0, 1.0, 0.0]))
    mlp = nn.MLP(2, 1, width_size=[4, 5], depth=2, key=K)
    assert [layer.out_features for layer in mlp.layers] == [4, 5, 1]


@pytest.mark.parametrize(
    ("indices", "bad", "position", "count"),
    [
        ([1, 5], 5, "(1,)", "1 of 2"),
        ([[0, 1], [-1, 7]], -1, "(1, 0)", "2 of 4"),
        (9, 9, "()", "1 of 1"),
    ],
)
def test_embedding_rejects_an_out_of_range_index_eagerly(indices, bad, position, count):
    with pytest.raises(IndexError) as err:
        nn.Embedding(5, 2, key=K)(jnp.array(indices))
    assert str(err.value) == (
        f"Embedding: index {bad} at position {position} of `x` is out of range for "
        f"num_embeddings=5; indices must lie in [0, 5) ({count} are outside)."
    )


# Jitted once for the module: examples with the same number of indices reuse one compilation.
_looked_up = jax.jit(lambda w, i: nn.Embedding(weight=w)(i))
_looked_up_grad = jax.jit(jax.grad(lambda w, i: jnp.nansum(nn.Embedding(weight=w)(i))))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-8, 12), min_size=1, max_size=6))
def test_embedding_under_jit_gives_nan_rows_and_no_gradient_out_of_range(indices):
    weight = jnp.arange(10.0).reshape(5, 2)
    x = jnp.array(indices)
    inside = [i for i in indices if 0 <= i < 5]
    table = np.asarray(weight)
    expected = np.array([table[i] if 0 <= i < 5 else [np.nan, np.nan] for i in indices])
    out = _looked_up(weight, x)
    np.testing.assert_array_equal(out, expected)
    grad = _looked_up_grad(weight, x)
    counts = np.bincount(np.array(inside, dtype=int), minlength=5).astype(float)
    np.testing.assert_array_equal(grad, np.repeat(counts[:, None], 2, axis=1))


ERRORS = [
    (
        lambda: nn.Linear(3, 2, key=K)(jnp.ones((4, 5))),
        ValueError,
        r"Linear: `x` must have shape \(\*batch, in_features=3\)",
    ),
    (lambda: nn.Linear(3, 2), TypeError, "missing 1 required keyword-only argument: 'key'"),
    (
        lambda: nn.Linear(3, 2, key=None),
        TypeError,
        "Linear needs a PRNG key|Linear.__init__ argument key",
    ),
    (
        lambda: nn.Linear(-1, 2, key=K),
        ValueError,
        "Linear: `in_features` must be a positive int",
    ),
    (
        lambda: nn.Conv2d(3, 4, 3, groups=2, key=K),
        ValueError,
        r"Conv2d: `groups`=2 must divide in_channels=3",
    ),
    (
        lambda: nn.Conv2d(3, 4, 3, padding="FULL", key=K),
        ValueError,
        "Conv2d: string `padding` must be",
    ),
    (
        lambda: nn.Conv2d(3, 4, 3, padding=(1, 1, 1), key=K),
        ValueError,
        "Conv2d: `padding` must be an int",
    ),
    (
        lambda: nn.Conv2d(3, 4, (3, 3, 3), key=K),
        ValueError,
        "Conv2d: `kernel_size` must be an int or a sequence of 2 ints",
    ),
    (
        lambda: nn.Conv2d(3, 4, 3, padding_mode="MIRROR", key=K),
        ValueError,
        "Conv2d: `padding_mode` must be one of",
    ),
    (
        lambda: nn.Conv2d(3, 4, 3, key=K)(jnp.ones((2, 4, 8, 8))),
        ValueError,
        r"Conv2d: `x` must have shape \(\*batch, in_channels=3, height, width\)",
    ),
    (
        lambda: nn.Conv1d(3, 4, 3, key=K)(jnp.ones((3,))),
        (ValueError, TypeError),
        r"Conv1d(: `x` must have shape|.__call__ argument x)",
    ),
    (
        lambda: nn.ConvTranspose2d(2, 2, 3, stride=2, output_padding=2, key=K),
        ValueError,
        "ConvTranspose2d: `output_padding`",
    ),
    (
        lambda: nn.ConvTranspose1d(2, 2, 3, stride=2, padding="SAME", output_padding=1, key=K),
        ValueError,
        r"ConvTranspose1d: `output_padding` \(1,\) applies to explicit padding only",
    ),
    (
        lambda: nn.ConvTranspose1d(2, 2, 3, padding="FULL", key=K),
        ValueError,
        "ConvTranspose1d: string `padding` must be 'SAME', 'SAME_LOWER' or 'VALID'",
    ),
    (
        lambda: nn.MaxPool2d(2, padding=2),
        ValueError,
        "MaxPool2d: padding .* must be at most half the kernel size",
    ),
    (
        lambda: nn.AvgPool1d(5)(jnp.ones((1, 3))),
        ValueError,
        r"AvgPool1d: the padded input size 3 is smaller than the window, 5 wide "
        r"\(kernel size \(5,\)",
    ),
    (
        lambda: nn.LayerNorm(4)(jnp.ones((2, 5))),
        ValueError,
        r"LayerNorm: `x` must have shape \(\*batch, shape\[0\]=4\)",
    ),
    (lambda: nn.GroupNorm(3, 4), ValueError, "GroupNorm: groups=3 must divide channels=4"),
    (lambda: nn.GroupNorm(2), ValueError, "GroupNorm: channelwise_affine=True needs `channels`"),
    (
        lambda: nn.GroupNorm(2, 4, spatial_ndim=1)(jnp.ones((2, 6, 3))),
        ValueError,
        "GroupNorm: `x` must have shape",
    ),
    (
        lambda: nn.ConvTranspose(1, 2, 2, 3, padding_mode="reflect", key=K),
        ValueError,
        r"ConvTranspose: `padding_mode` must be 'ZEROS' or 'CIRCULAR'; got 'reflect'",
    ),
    (
        lambda: nn.ConvTranspose(1, 2, 2, 3, 2, padding=((5, 4),), key=K)(jnp.ones((2, 3))),
        ValueError,
        r"ConvTranspose: padding \(\(5, 4\),\) crops the whole output of spatial dim 0 "
        r"\(length 7 before cropping\)",
    ),
    (lambda: nn.Dropout(1.5), ValueError, r"Dropout: `p` must be in \[0, 1\]"),
    (lambda: nn.Dropout(0.5)(jnp.ones(2)), RuntimeError, "Dropout needs a `key` in training mode"),
    (
        lambda: nn.Embedding(5, 2, key=K)(jnp.ones(2)),
        TypeError,
        r"Embedding(: indices must be integers|.__call__ argument x: expected Integer)",
    ),
    (lambda: nn.Embedding(5), ValueError, "Embedding: give `num_embeddings` and `embedding_size`"),
    (
        lambda: nn.Embedding(weight=jnp.ones(3)),
        (ValueError, TypeError),
        r"Embedding(: `weight` must be 2-d|.__init__ argument weight)",
    ),
    (
        lambda: nn.MultiheadAttention(3, 8, key=K),
        ValueError,
        "MultiheadAttention: query_size=8 is not divisible by num_heads=3",
    ),
    (
        lambda: nn.MultiheadAttention(2, 8, key=K)(
            jnp.ones((3, 8)), jnp.ones((4, 8)), jnp.ones((5, 8))
        ),
        (ValueError, TypeError),
        r"MultiheadAttention(: `value` must have shape \(\*batch, kv_seq=4"
        r"|.__call__ argument value.*kv_seq=4)",
    ),
    (
        lambda: nn.MultiheadAttention(2, 8, key=K)(
            jnp.ones((3, 8)), jnp.ones((4, 8)), jnp.ones((4, 8)), jnp.ones((3, 4))
        ),
        TypeError,
        r"MultiheadAttention(: `mask` must be boolean|.__call__ argument mask)",
    ),
    (
        lambda: nn.MultiheadAttention(2, 8, key=K)(
            jnp.ones((3, 8)), jnp.ones((4, 8)), jnp.ones((4, 8)), jnp.ones((3, 3), bool)
        ),
        ValueError,
        r"MultiheadAttention: `mask` must have shape \(\*batch, q_seq=3, kv_seq=4\)",
    ),
    (
        lambda: nn.MultiheadAttention(2, 8, key=K)(
            jnp.ones((2, 3, 8)), jnp.ones((5, 4, 8)), jnp.ones((5, 4, 8))
        ),
        (ValueError, TypeError),
        r"MultiheadAttention(: `key_` has batch dimensions \(5,\) but `query` has \(2,\)"
        r"|.__call__ argument key_)",
    ),
    (
        lambda: nn.GRUCell(2, 3, key=K)(jnp.ones((4, 2)), jnp.ones((5, 3))),
        (ValueError, TypeError),
        r"GRUCell(: `hidden` has batch dimensions \(5,\) but `input` has \(4,\)"
        r"|.__call__ argument hidden)",
    ),
    (
        lambda: nn.LSTMCell(2, 3, key=K)(jnp.ones(2), jnp.ones(3)),
        TypeError,
        r"LSTMCell(: `hidden` must be a pair \(h, c\)|.__call__ argument hidden)",
    ),
    (
        lambda: nn.MLP(2, 2, [3, 4], 3, key=K),
        ValueError,
        "MLP: `width_size` has 2 entries but depth=3",
    ),
    (
        lambda: nn.Sequential([nn.Identity(), 3]),
        TypeError,
        r"Sequential: layers\[1\] is a int, which is not callable",
    ),
]


@pytest.mark.parametrize("fn,exc,match", ERRORS, ids=[e[2][:40] for e in ERRORS])
def test_errors(fn, exc, match):
    with pytest.raises(exc, match=match):
        fn()


def test_prelu_errors_name_the_class_and_the_problem():
    with pytest.raises(TypeError, match="PReLU: `init_alpha` must be a number or a JAX array"):
        nn.PReLU("0.25")
    with pytest.raises(ValueError, match=r"PReLU: the slope has shape \(3, 1, 1\)"):
        nn.PReLU(jnp.ones((3, 1, 1)))(jnp.ones((4, 4)))


@pytest.mark.parametrize("cls", ["AdaptiveAvgPool3d", "AdaptiveMaxPool2d"])
def test_adaptive_pool_errors_name_the_class(cls):
    with pytest.raises(ValueError, match=f"{cls}: `target_shape` must be a positive int; got 0"):
        getattr(nn, cls)(0)
    with pytest.raises(tm.ShapeCheckError, match=f"{cls}.__call__ argument x"):
        getattr(nn, cls)(1)(jnp.ones(3))


def test_general_pool_errors_name_the_class_and_the_argument():
    with pytest.raises(TypeError, match=r"Pool: `init` must be a number .* init=Array\(\[0"):
        nn.Pool(jnp.zeros(2), jax.lax.add, 1, 2)
    with pytest.raises(TypeError, match=r"AdaptivePool: `operation` must be a function .*'mean'"):
        nn.AdaptivePool(2, 1, "mean")
    pool = nn.AdaptivePool(2, 1, lambda w: w[:2], channels_last=True)
    with pytest.raises(
        ValueError,
        match=r"AdaptivePool\(channels_last=True\): `operation` must reduce a 1-d window to a "
        r"scalar; on a window of shape \(3,\) it returned shape \(2,\)",
    ):
        pool(jnp.ones((5, 4)))
    with pytest.raises(
        ValueError,
        match=r"AdaptiveAvgPool\(channels_last=True\): `x` must have shape \(\*batch, height, "
        r"width, channels\)",
    ):
        nn.AdaptiveAvgPool(1, 2, channels_last=True)(jnp.ones(3))


def test_adaptive_avg_pool_asks_for_exact_float32_matmuls():
    # Its averaging is a matmul; with JAX's default precision a GPU would round the inputs to
    # TF32. The CPU computes either exactly, so check the precision the program asks for.
    pool = nn.AdaptiveAvgPool((2, 3), 2)
    text = str(jax.make_jaxpr(pool)(jnp.ones((4, 5, 7))))  # the dots sit in a nested jaxpr
    assert text.count("dot_general[") == 2
    assert text.count("precision=(Precision.HIGHEST, Precision.HIGHEST)") == 2


@settings(max_examples=10, deadline=None)
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=3).flatmap(
        lambda sizes: st.tuples(st.just(sizes), st.tuples(*(st.integers(1, s + 2) for s in sizes)))
    ),
    st.sampled_from(["mean", "max", "sum"]),
)
def test_adaptive_pools_channels_last_is_the_transposed_channels_first(shapes, kind):
    sizes, target = shapes
    n = len(sizes)
    x = jax.random.normal(K, (2, 3, *sizes))
    if kind == "sum":
        first, last = (nn.AdaptivePool(target, n, jnp.sum, channels_last=c) for c in (False, True))
    else:
        cls = nn.AdaptiveAvgPool if kind == "mean" else nn.AdaptiveMaxPool
        first, last = (cls(target, n, channels_last=c) for c in (False, True))
    # Both layouts in one program: one compilation per example, not one per eager call.
    got, first_x = jax.jit(lambda x: (last(jnp.moveaxis(x, 1, -1)), first(x)))(x)
    np.testing.assert_allclose(got, jnp.moveaxis(first_x, 1, -1), rtol=1e-6, atol=1e-6)
    # Hand-derived check of the general path: sum of each PyTorch window, one axis at a time.
    if kind == "sum":
        ref = np.asarray(x, np.float64)
        for axis, (size, goal) in enumerate(zip(sizes, target, strict=True), start=2):
            cells = [
                ref.take(range(i * size // goal, -(-(i + 1) * size // goal)), axis).sum(axis)
                for i in range(goal)
            ]
            ref = np.stack(cells, axis)
        np.testing.assert_allclose(first_x, ref, rtol=1e-5, atol=1e-5)


def test_general_pools_port_from_equinox():
    eqx = pytest.importorskip("equinox", reason="Equinox is not installed (a peer, optional)")
    x = jax.random.normal(K, (3, 8, 6))
    args = (-jnp.inf, jax.lax.max, 2, (3, 2), (2, 1), ((1, 1), (0, 1)))
    theirs = eqx.nn.Pool(*args, use_ceil=True)
    np.testing.assert_array_equal(nn.Pool(*args, use_ceil=True)(x), theirs(x))
    # Equinox's adaptive windows agree with PyTorch's when the target divides the size.
    theirs = eqx.nn.AdaptivePool((4, 3), 2, jnp.mean)
    np.testing.assert_allclose(nn.AdaptivePool((4, 3), 2, jnp.mean)(x), theirs(x), rtol=1e-6)
