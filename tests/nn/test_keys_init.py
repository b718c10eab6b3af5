"""Keys (no reuse, determinism, one split per layer) and initialisers (distributions, dtypes)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod as tm
import treemod.nn as nn
from treemod.nn import init


def _key_bytes(k):
    return np.asarray(jax.random.key_data(k)).tobytes()


def test_keyseq_gives_distinct_keys():
    keys = nn.KeySeq(jax.random.key(0))
    drawn = [next(keys) for _ in range(20)] + list(keys.split(5))
    assert len({_key_bytes(k) for k in drawn}) == 25
    assert "drawn=21" in repr(keys)


def test_split_like():
    tree = {"a": jnp.zeros(2), "b": [jnp.zeros(3), None, jnp.zeros(1)]}
    keys = nn.split_like(jax.random.key(0), tree)
    leaves = jax.tree_util.tree_leaves(keys)
    assert len(leaves) == 3 and len({_key_bytes(k) for k in leaves}) == 3
    assert jax.tree_util.tree_structure(keys) == jax.tree_util.tree_structure(tree)


class _Recorder:
    def __init__(self):
        self.keys = []

    def __call__(self, key, shape, dtype=jnp.float32):
        self.keys.append(_key_bytes(key))
        return init.normal()(key, shape, dtype)


def test_no_two_parameter_tensors_share_a_key():
    rec = _Recorder()
    keys = nn.KeySeq(jax.random.key(0))
    kw = dict(weight_init=rec, bias_init=rec)
    nn.Sequential(
        [
            nn.Conv2d(1, 4, 3, key=next(keys), **kw),
            nn.MLP(4, 4, 8, 3, key=next(keys), **kw),
            nn.MultiheadAttention(
                2, 4, use_query_bias=True, use_output_bias=True, weight_init=rec, key=next(keys)
            ),
            nn.GRUCell(4, 4, key=next(keys), **kw),
            nn.LSTMCell(4, 4, key=next(keys), **kw),
            nn.ConvTranspose2d(4, 2, 2, key=next(keys), **kw),
            nn.Embedding(5, 4, weight_init=rec, key=next(keys)),
        ]
    )
    # Conv 2, MLP 4 Linears x 2, MHA 4 weights, GRU 4, LSTM 3, ConvTranspose 2, Embedding 1.
    assert len(rec.keys) == 2 + 8 + 4 + 4 + 3 + 2 + 1
    assert len(set(rec.keys)) == len(rec.keys)


def test_default_parameters_are_all_different():
    keys = nn.KeySeq(jax.random.key(0))
    model = nn.Sequential([nn.MLP(6, 6, 6, 4, key=next(keys)), nn.Linear(6, 6, key=next(keys))])
    flat = [np.asarray(p).ravel()[:6] for p in jax.tree_util.tree_leaves(model)]
    assert len({a.tobytes() for a in flat}) == len(flat)


def test_same_key_same_parameters():
    make = lambda: nn.MultiheadAttention(2, 8, key=jax.random.key(3))  # noqa: E731
    assert tm.tree_equal(make(), make())
    assert not tm.tree_equal(make(), nn.MultiheadAttention(2, 8, key=jax.random.key(4)))


def test_one_split_per_layer_when_built_under_jit():
    """Building a deep model traces one `random_split` per layer, never one per leaf."""

    def build(key):
        return tm.filter(nn.MLP(8, 8, 8, depth=20, key=key), tm.is_array)

    text = str(jax.make_jaxpr(build)(jax.random.key(0)))
    assert text.count("random_split") == 1 + 21  # the MLP's split, then one per Linear
    stack_text = str(
        jax.make_jaxpr(
            lambda k: tm.filter(
                nn.Stack(lambda k: nn.MLP(8, 8, 8, 2, key=k), 48, key=k), tm.is_array
            )
        )(jax.random.key(0))
    )
    assert stack_text.count("random_split") == 1 + 1 + 3  # Stack's split, then one MLP traced once


N = 200_000


@pytest.mark.parametrize(
    "fn,std",
    [
        (init.glorot_uniform, math.sqrt(2 / (400 + 500))),
        (init.glorot_normal, math.sqrt(2 / (400 + 500))),
        (init.xavier_uniform, math.sqrt(2 / (400 + 500))),
        (init.he_uniform, math.sqrt(2 / 400)),
        (init.he_normal, math.sqrt(2 / 400)),
        (init.kaiming_normal, math.sqrt(2 / 400)),
        (init.lecun_uniform, math.sqrt(1 / 400)),
        (init.lecun_normal, math.sqrt(1 / 400)),
        (init.pytorch_default, 1 / math.sqrt(3 * 400)),
        (init.variance_scaling(2.0, "fan_out", "truncated_normal"), math.sqrt(2 / 500)),
        (init.normal(0.02), 0.02),
        (init.truncated_normal(1.0), 0.8796256610342398),
        (init.uniform(-1.0, 1.0), 1 / math.sqrt(3)),
    ],
)
def test_initialiser_statistics(fn, std):
    w = np.asarray(fn(jax.random.key(0), (500, 400)), np.float64)
    n = w.size
    assert abs(w.mean()) < 5 * std / math.sqrt(n)
    assert abs(w.std() - std) < 0.01 * std


_DIRECT_DRAWS = [
    # (initialiser, plain JAX drawing `shape` directly with the same law)
    (init.uniform(-0.3, 0.5), lambda k, s: jax.random.uniform(k, s, jnp.float32, -0.3, 0.5)),
    (init.normal(0.02, 1.0), lambda k, s: jax.random.normal(k, s) * 0.02 + 1.0),
    (init.truncated_normal(0.5), lambda k, s: jax.random.truncated_normal(k, -2.0, 2.0, s) * 0.5),
    (
        init.variance_scaling(1.0, "fan_in", "uniform"),
        lambda k, s: jax.random.uniform(
            k, s, jnp.float32, -math.sqrt(3 / init.fans(s)[0]), math.sqrt(3 / init.fans(s)[0])
        ),
    ),
    (
        init.variance_scaling(2.0, "fan_out", "normal"),
        lambda k, s: jax.random.normal(k, s) * math.sqrt(2 / init.fans(s)[1]),
    ),
]


@settings(max_examples=15, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple),
    which=st.integers(0, len(_DIRECT_DRAWS) - 1),
    seed=st.integers(0, 2**31 - 1),
    partitionable=st.booleans(),
)
def test_initialisers_draw_the_numbers_of_a_direct_draw(shape, which, seed, partitionable):
    """Initialisers draw a flat vector and reshape it (it compiles faster inside jit); the
    numbers are those plain JAX draws for the whole shape, eagerly and under jit."""
    ours, direct = _DIRECT_DRAWS[which]
    key = jax.random.key(seed)
    previous = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", partitionable)
    try:
        # The plain-JAX draw is compiled with the jitted initialiser (one compilation, not one
        # per eager operation of the reference).
        jitted, expected = jax.jit(lambda k: (ours(k, shape), direct(k, shape)))(key)
        np.testing.assert_allclose(np.asarray(ours(key, shape)), expected, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(np.asarray(jitted), expected, rtol=1e-6, atol=1e-7)
    finally:
        jax.config.update("jax_threefry_partitionable", previous)


@settings(max_examples=10, deadline=None)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
    which=st.integers(0, len(_DIRECT_DRAWS) - 1),
    seed=st.integers(0, 2**31 - 1),
)
def test_complex_initialisers_draw_real_and_imaginary_parts_from_the_key_halves(shape, which, seed):
    """A complex dtype: the real part is the real draw from the first half of the key, the
    imaginary part that from the second (PyTorch and Equinox draw the two parts alike)."""
    ours, direct = _DIRECT_DRAWS[which]
    key = jax.random.key(seed)
    real_key, imag_key = jax.random.split(key)
    out = ours(key, shape, jnp.complex64)
    assert out.dtype == jnp.complex64 and out.shape == shape
    # Both plain-JAX draws in one program: one compilation, not one per eager operation.
    real, imag = jax.jit(lambda r, i: (direct(r, shape), direct(i, shape)))(real_key, imag_key)
    np.testing.assert_allclose(np.real(out), real, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.imag(out), imag, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shape", [(4, 4), (3, 7), (7, 3)])
def test_complex_orthogonal_is_unitary(shape):
    q = np.asarray(init.orthogonal(2.0)(jax.random.key(0), shape, jnp.complex64), np.complex128)
    gram = q @ q.conj().T if shape[0] <= shape[1] else q.conj().T @ q
    np.testing.assert_allclose(gram, 4.0 * np.eye(min(shape)), atol=1e-5)
    assert np.abs(q.imag).max() > 0.1  # really complex, not a real matrix cast


def test_uniform_and_truncated_bounds():
    w = init.he_uniform(jax.random.key(0), (300, 300))
    assert float(jnp.abs(w).max()) <= math.sqrt(6 / 300)
    t = init.truncated_normal(0.5, mean=1.0)(jax.random.key(0), (10_000,))
    assert float(t.min()) >= 0.0 and float(t.max()) <= 2.0


def test_conv_fans():
    assert init.fans((16, 3, 5, 5)) == (75, 400)
    assert init.fans((7,)) == (7, 7)
    w = init.he_normal(jax.random.key(0), (64, 32, 3, 3))
    assert abs(float(w.std()) - math.sqrt(2 / (32 * 9))) < 0.02 * math.sqrt(2 / (32 * 9))


@pytest.mark.parametrize("shape", [(4, 4), (3, 7), (7, 3), (4, 2, 3)])
def test_orthogonal(shape):
    q = np.asarray(init.orthogonal(2.0)(jax.random.key(0), shape), np.float64).reshape(shape[0], -1)
    gram = q @ q.T if q.shape[0] <= q.shape[1] else q.T @ q
    np.testing.assert_allclose(gram, 4.0 * np.eye(gram.shape[0]), atol=1e-5)


def test_constant_zeros_ones_and_bfloat16():
    k = jax.random.key(0)
    assert float(init.constant(3.0)(k, (2,))[0]) == 3.0
    for fn in [
        init.zeros,
        init.ones,
        init.glorot_uniform,
        init.normal(),
        init.orthogonal(),
        init.truncated_normal(),
    ]:
        assert fn(k, (4, 4), jnp.bfloat16).dtype == jnp.bfloat16
    np.testing.assert_array_equal(init.glorot_normal(k, (3, 3)), init.glorot_normal(k, (3, 3)))


def test_bfloat16_layers():
    k = jax.random.key(0)
    bf = jnp.bfloat16
    x = jnp.ones((2, 3, 8, 8), bf)
    conv = nn.Conv2d(3, 4, 3, dtype=bf, key=k)
    assert conv(x).dtype == bf and conv.weight.dtype == bf
    seq = jnp.ones((2, 5, 8), bf)
    mha = nn.MultiheadAttention(2, 8, dtype=bf, key=k)
    assert mha(seq, seq, seq, causal=True).dtype == bf
    assert nn.LayerNorm(8, dtype=bf)(seq).dtype == bf
    assert nn.Linear(8, 2, dtype=bf, key=k)(seq).dtype == bf
    assert nn.GRUCell(8, 4, dtype=bf, key=k)(seq[0, 0], jnp.zeros(4, bf)).dtype == bf


def test_initialiser_errors():
    with pytest.raises(TypeError, match="init.normal: dtype must be a floating or complex dtype"):
        init.normal()(jax.random.key(0), (2,), jnp.int32)
    with pytest.raises(ValueError, match="init.orthogonal needs a shape with at least 2 dims"):
        init.orthogonal()(jax.random.key(0), (3,))
    with pytest.raises(ValueError, match="variance_scaling: mode must be"):
        init.variance_scaling(1.0, "fan_wrong", "normal")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="variance_scaling: distribution must be"):
        init.variance_scaling(1.0, "fan_in", "cauchy")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="KeySeq needs a key"):
        nn.KeySeq(None)
    with pytest.raises(TypeError, match="Linear: dtype must be a floating or complex dtype"):
        nn.Linear(2, 2, dtype=jnp.int32, key=jax.random.key(0))
    with pytest.raises(TypeError, match=r"LayerNorm: dtype must be a real .*: Linear, Conv"):
        nn.LayerNorm(2, dtype=jnp.complex64)
