"""Gradients of every layer against finite differences (`check_grads`, in float64).

The functions checked are wrapped in `jax.jit`: `check_grads` calls them many times with
perturbed inputs of one shape, which then costs one compilation instead of one per operation
and call (the layers' eager paths are tested in test_eager_calls.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import treemod as tm
import treemod.nn as nn

F64 = jnp.float64


def _layers():
    k = jax.random.key(0)
    return {
        "Linear": (lambda: nn.Linear(3, 2, dtype=F64, key=k), [(4, 3)]),
        "MLP": (lambda: nn.MLP(2, 2, 3, 1, activation=jnp.tanh, dtype=F64, key=k), [(2,)]),
        "Conv2d": (
            lambda: nn.Conv2d(2, 2, 2, stride=2, padding=1, groups=2, dtype=F64, key=k),
            [(2, 3, 3)],
        ),
        "Conv1d": (lambda: nn.Conv1d(2, 2, 3, dilation=2, dtype=F64, key=k), [(2, 6)]),
        "ConvTranspose1d": (
            lambda: nn.ConvTranspose1d(2, 2, 3, stride=2, dtype=F64, key=k),
            [(2, 3)],
        ),
        "ConvTranspose2d": (
            lambda: nn.ConvTranspose2d(1, 2, 2, stride=2, dtype=F64, key=k),
            [(1, 2, 2)],
        ),
        "MaxPool2d": (lambda: nn.MaxPool2d(2, 2), [(1, 4, 4)]),
        "AvgPool1d": (lambda: nn.AvgPool1d(3, 2, use_ceil=True), [(1, 6)]),
        "AdaptiveAvgPool2d": (lambda: nn.AdaptiveAvgPool2d((2, 2)), [(1, 3, 3)]),
        "LayerNorm": (lambda: nn.LayerNorm(4, dtype=F64), [(2, 4)]),
        "RMSNorm": (lambda: nn.RMSNorm(4, dtype=F64), [(4,)]),
        "GroupNorm": (lambda: nn.GroupNorm(2, 4, dtype=F64), [(4, 2)]),
        "MultiheadAttention": (
            lambda: nn.MultiheadAttention(2, 4, use_query_bias=True, dtype=F64, key=k),
            [(3, 4), (2, 4), (2, 4)],
        ),
        "GRUCell": (lambda: nn.GRUCell(2, 3, dtype=F64, key=k), [(2,), (3,)]),
        "Stack": (lambda: nn.Stack(lambda k: nn.Linear(2, 2, dtype=F64, key=k), 2, key=k), [(2,)]),
    }


@pytest.mark.parametrize("name", sorted(_layers()))
def test_check_grads(name):
    with jax.enable_x64(True):
        make, shapes = _layers()[name]
        layer = make()
        params, static = tm.partition(layer, tm.is_inexact_array)
        xs = [jax.random.normal(jax.random.key(i + 1), s, F64) for i, s in enumerate(shapes)]

        def f(params, *xs):
            # check_grads perturbs with NumPy arrays; layers are annotated with jax.Array.
            params, xs = jax.tree_util.tree_map(jnp.asarray, (params, xs))
            return tm.combine(params, static)(*xs)

        check_grads(jax.jit(f), (params, *xs), order=1, modes=["rev"], atol=1e-5, rtol=1e-5)


def test_lstm_and_dropout_and_embedding_grads():
    with jax.enable_x64(True):
        cell = nn.LSTMCell(2, 3, dtype=F64, key=jax.random.key(0))
        x, h, c = (
            jax.random.normal(jax.random.key(i), s, F64) for i, s in enumerate([(2,), (3,), (3,)])
        )
        a = jnp.asarray
        lstm = jax.jit(lambda x, h, c: cell(a(x), (a(h), a(c))))
        check_grads(lstm, (x, h, c), order=1, modes=["rev"])
        drop = nn.Dropout(0.3)
        dropped = jax.jit(lambda x: drop(a(x), key=jax.random.key(0)))
        check_grads(dropped, (h,), order=1, modes=["rev"])
        emb = nn.Embedding(5, 3, dtype=F64, key=jax.random.key(0))
        idx = jnp.array([0, 3, 3])
        looked_up = jax.jit(lambda w: nn.Embedding(weight=a(w))(idx))
        check_grads(looked_up, (emb.weight,), order=1, modes=["rev"])


@pytest.mark.parametrize(
    "pool",
    [
        nn.MaxPool2d(2, stride=2),
        nn.AvgPool2d(2, stride=2),
        nn.AvgPool2d(3, stride=2, use_ceil=True),
    ],
    ids=["max", "avg", "avg-ceil"],
)
def test_pool_gradients_under_jit_match_eager(pool: nn.MaxPool2d | nn.AvgPool2d) -> None:
    # Regression: a traced init value made reduce_window non-differentiable under jit.
    x = jnp.arange(2 * 3 * 6 * 6, dtype=jnp.float32).reshape(2, 3, 6, 6) / 7.0
    grad = jax.grad(lambda x: pool(x).sum())
    np.testing.assert_allclose(jax.jit(grad)(x), grad(x), rtol=1e-6)
    # Max pooling routes each window's gradient to its maximum: one 1 per window.
    if isinstance(pool, nn.MaxPool2d):
        assert float(jax.jit(grad)(x).sum()) == 2 * 3 * 3 * 3
