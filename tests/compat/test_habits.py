"""Habits Equinox users bring: integer inputs, their attention masks, their own annotations.

Each check runs the same program with real Equinox and with treemod (proper, or the compat
namespace), on the same inputs and weights.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

import treemod as tm
import treemod.compat.equinox as teqx

from helpers import normal

eqx = pytest.importorskip("equinox")

KEY = jax.random.key(0)

# Layers that promote an integer input to floating point in Equinox: (builder, input shape).
PROMOTING = {
    "Linear": (lambda nn: nn.Linear(3, 4, key=KEY), (3,)),
    "Linear-scalar": (lambda nn: nn.Linear("scalar", 2, key=KEY), ()),
    "MLP": (lambda nn: nn.MLP(3, 2, 4, 2, key=KEY), (3,)),
    "WeightNorm": (lambda nn: nn.WeightNorm(nn.Linear(3, 4, key=KEY)), (3,)),
}


@pytest.mark.parametrize("name", sorted(PROMOTING))
@pytest.mark.parametrize("namespace", [tm.nn, teqx.nn], ids=["treemod", "compat"])
def test_integer_inputs_promote_as_in_equinox(name, namespace, shape_checks_on):
    build, shape = PROMOTING[name]
    x = (jnp.arange(int(np.prod(shape))) % 3).reshape(shape)
    with jax.numpy_dtype_promotion("standard"):
        expected = build(eqx.nn)(x)
    got = build(namespace)(x)
    assert got.dtype == expected.dtype == jnp.float32
    np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize("namespace", [tm.nn, teqx.nn], ids=["treemod", "compat"])
def test_integer_inputs_to_cells_attention_and_dropout(namespace, shape_checks_on):
    x = jnp.arange(3)
    seq = jnp.stack([x, x])
    with jax.numpy_dtype_promotion("standard"):
        refs = [
            eqx.nn.GRUCell(3, 4, key=KEY)(x, jnp.zeros(4)),
            eqx.nn.LSTMCell(3, 4, key=KEY)(x, (jnp.zeros(4), jnp.zeros(4)))[0],
            eqx.nn.MultiheadAttention(1, 3, key=KEY)(seq, seq, seq),
            eqx.nn.Dropout(0.5)(x, key=KEY),
        ]
    got = [
        namespace.GRUCell(3, 4, key=KEY)(x, jnp.zeros(4)),
        namespace.LSTMCell(3, 4, key=KEY)(x, (jnp.zeros(4), jnp.zeros(4)))[0],
        namespace.MultiheadAttention(1, 3, key=KEY)(seq, seq, seq),
        namespace.Dropout(0.5)(x, key=KEY),
    ]
    for g, r in zip(got, refs, strict=True):
        assert g.dtype == r.dtype == jnp.float32
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
    # In inference, Dropout returns its input as it is, integer or not (as Equinox does).
    assert namespace.Dropout(0.5, inference=True)(x).dtype == jnp.int32


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm", "GroupNorm"])
def test_integer_inputs_to_normalisation_are_normalised_in_floating_point(name, shape_checks_on):
    # Equinox casts the normalised values back to the integer dtype (truncating them); treemod
    # returns them in floating point: the values are Equinox's before that cast.
    layer = {"LayerNorm": tm.nn.LayerNorm(4), "RMSNorm": tm.nn.RMSNorm(4)}.get(
        name, tm.nn.GroupNorm(2, 4)
    )
    x = jnp.array([0, 1, 2, 5])
    ref = {"LayerNorm": eqx.nn.LayerNorm(4), "RMSNorm": eqx.nn.RMSNorm(4)}.get(
        name, eqx.nn.GroupNorm(2, 4)
    )(x.astype(jnp.float32))
    got = layer(x)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, ref, rtol=1e-6)


def _bernoulli(shape, seed):
    """A random boolean mask (NumPy's generator), True with probability 0.6."""
    return jnp.asarray(np.random.default_rng(seed).random(shape) < 0.6)


def test_attention_masks_equinox_users_build():
    mha_e = eqx.nn.MultiheadAttention(2, 8, key=KEY)
    mha_t = teqx.nn.MultiheadAttention(2, 8, key=KEY)
    mha_proper = tm.nn.MultiheadAttention(2, 8, key=KEY)
    q = normal((5, 8), 1)
    kv = normal((7, 8), 2)
    masks = [
        jnp.tril(jnp.ones((5, 7), bool)),
        _bernoulli((5, 7), 3).at[:, 0].set(True),
        _bernoulli((2, 5, 7), 4).at[:, :, 0].set(True),
    ]
    for mask in masks:
        np.testing.assert_allclose(mha_t(q, kv, kv, mask), mha_e(q, kv, kv, mask), atol=1e-5)
        # treemod proper takes the same masks, and a batch of them.
        np.testing.assert_allclose(
            mha_proper(q, kv, kv, mask),
            mha_e(q, kv, kv, mask),
            atol=1e-5,
        )
    # Numeric masks count as Equinox's `jnp.where` reads them, non-zero = attend: the float
    # 0/1 mask of Equinox's BERT example, ints, and a non-0/1 value.
    numeric = [
        masks[1].astype(jnp.float32),
        masks[2].astype(jnp.int32),
        jnp.where(masks[1], -2.5, 0.0),
    ]
    for mask in numeric:
        np.testing.assert_allclose(mha_t(q, kv, kv, mask), mha_e(q, kv, kv, mask), atol=1e-5)
    with pytest.raises(
        ValueError, match=r"mask must be of shape \(q_seq, kv_seq\)=\(5, 7\).*\[7, 5\]"
    ):
        mha_t(q, kv, kv, jnp.ones((7, 5)))


def test_attention_process_heads_and_dropout_keys_match_equinox():
    mha_e = eqx.nn.MultiheadAttention(2, 8, dropout_p=0.4, key=KEY)
    mha_t = teqx.nn.MultiheadAttention(2, 8, dropout_p=0.4, key=KEY)
    q = normal((5, 8), 1)
    rope_e = eqx.nn.RotaryPositionalEmbedding(4)
    rope_t = teqx.nn.RotaryPositionalEmbedding(4)

    def heads(rope):
        def process(qh, kh, vh):
            qh = jax.vmap(rope, in_axes=1, out_axes=1)(qh)
            kh = jax.vmap(rope, in_axes=1, out_axes=1)(kh)
            return qh, kh, vh

        return process

    key = jax.random.key(7)
    got = mha_t(q, q, q, key=key, process_heads=heads(rope_t))
    ref = mha_e(q, q, q, key=key, process_heads=heads(rope_e))
    np.testing.assert_allclose(got, ref, atol=1e-5)
    with pytest.raises(ValueError, match="process_heads must keep the shapes"):
        mha_t(q, q, q, inference=True, process_heads=lambda a, b, c: (a[:1], b, c))
    with pytest.raises(ValueError, match=r"one sequence.*jax.vmap"):
        mha_t(q[None], q[None], q[None], inference=True)


def test_compat_module_subclasses_skip_shape_checks(shape_checks_on):
    class Scale(teqx.Module):
        factor: Float[Array, " n"]

        def __call__(self, x: Float[Array, " n"]) -> Float[Array, " n"]:
            return self.factor * x

    # Equinox runs this (integer arrays under Float annotations); so does the compat namespace.
    assert Scale(jnp.arange(3))(jnp.arange(3)).tolist() == [0, 1, 4]

    class Checked(teqx.Module, shapecheck=True):
        factor: Float[Array, " n"]

    with pytest.raises(tm.ShapeCheckError, match="Checked.factor"):
        Checked(jnp.arange(3))

    # treemod proper keeps its checks.
    class Strict(tm.Module):
        factor: Float[Array, " n"]

    with pytest.raises(tm.ShapeCheckError, match="Strict.factor"):
        Strict(jnp.arange(3))


def test_compat_module_isinstance_covers_every_treemod_module():
    assert isinstance(tm.nn.Linear(2, 2, key=KEY), teqx.Module)
    assert isinstance(teqx.nn.BatchNorm(2, "b", mode="batch"), teqx.Module)
    assert issubclass(tm.nn.Conv2d, teqx.Module)
    assert not isinstance(jnp.ones(2), teqx.Module)
    assert not issubclass(int, teqx.Module)
