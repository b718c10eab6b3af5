"""Rotary embeddings, transposed convolutions, weight and spectral norms and `Shared`: against
references (complex rotation, Equinox, the transpose of the convolution) and their errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod as tm
import treemod.nn as nn

K = jax.random.key(0)


def _rope_reference(x, theta=10_000.0):
    """Hand-derived: feature pairs (i, i + d/2) at position p rotate by p * theta^(-2i/d)."""
    x = np.asarray(x, np.float64)
    seq, d = x.shape[-2:]
    half = d // 2
    angle = np.arange(seq)[:, None] * theta ** (-2.0 * np.arange(half) / d)[None, :]
    a, b = x[..., :half], x[..., half:]
    rotated = (a + 1j * b) * np.exp(1j * angle)
    return np.concatenate([rotated.real, rotated.imag], axis=-1)


@pytest.mark.parametrize("shape,theta", [((5, 8), 10_000.0), ((2, 3, 7, 4), 100.0)])
def test_rotary_embedding_matches_complex_rotation(shape, theta):
    x = jax.random.normal(jax.random.key(0), shape)
    rope = nn.RotaryPositionalEmbedding(shape[-1], theta=theta)
    np.testing.assert_allclose(rope(x), _rope_reference(x, theta), rtol=1e-5, atol=1e-5)
    # A rotation keeps the norm of every pair, and relative positions are what a dot sees.
    np.testing.assert_allclose(
        jnp.linalg.norm(rope(x), axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5
    )


def test_rotary_embedding_matches_equinox():
    eqx = pytest.importorskip("equinox", reason="Equinox is not installed (a peer, optional)")
    x = jax.random.normal(jax.random.key(1), (6, 8))
    ours = nn.RotaryPositionalEmbedding(8, theta=500.0)
    theirs = eqx.nn.RotaryPositionalEmbedding(8, theta=500.0)
    np.testing.assert_allclose(ours(x), theirs(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("padding", ["SAME", "SAME_LOWER", "VALID", 1])
@pytest.mark.parametrize("kernel_size,stride", [(3, 2), (4, 2), (1, 3), (4, 1)])
def test_conv_transpose_padding_matches_equinox(padding, kernel_size, stride):
    eqx = pytest.importorskip("equinox", reason="Equinox is not installed (a peer, optional)")
    key = jax.random.key(3)
    theirs = eqx.nn.ConvTranspose(2, 3, 4, kernel_size, stride, padding, key=key)
    ours = nn.ConvTranspose(2, 3, 4, kernel_size, stride, padding, key=key)
    # Equinox convolves with its kernel as stored; treemod flips it, as PyTorch does.
    ours = tm.tree_at(lambda m: m.weight, ours, theirs.weight[:, :, ::-1, ::-1])
    ours = tm.tree_at(lambda m: m.bias, ours, theirs.bias.reshape(-1))
    x = jax.random.normal(key, (3, 5, 6))
    np.testing.assert_allclose(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


@settings(max_examples=12, deadline=None)
@given(
    st.sampled_from(["ZEROS", "CIRCULAR"]),
    st.sampled_from(["SAME", "SAME_LOWER", "explicit"]),
    st.integers(1, 5),  # kernel size
    st.integers(1, 3),  # stride
    st.integers(1, 2),  # dilation
    st.integers(0, 4),  # explicit low padding
    st.booleans(),  # channels last
)
def test_conv_transpose_is_the_transpose_of_conv(mode, padding, k, s, d, low, last):
    """Law: a transposed convolution is the VJP of the convolution with the same padding."""
    if padding == "explicit":
        padding = ((low, max(0, low - 1)),)
    opts = {"dilation": d, "padding_mode": mode, "channels_last": last, "key": K}
    ours = nn.ConvTranspose(1, 3, 2, k, s, padding, **opts)
    z = jax.random.normal(jax.random.key(1), (4, 3) if last else (3, 4))
    try:
        y = ours(z)
    except ValueError as err:  # the padding crops the whole output
        assert (
            "ConvTranspose(channels_last=True)" in str(err) if last else "ConvTranspose" in str(err)
        )
        assert "crops the whole output" in str(err)
        return
    y = y - (ours.bias[None, :] if last else ours.bias[:, None])
    conv = nn.Conv(1, 2, 3, k, s, padding, use_bias=False, **opts)
    weight = ours.weight.swapaxes(-1, -2) if last else ours.weight.swapaxes(0, 1)
    conv = tm.tree_at(lambda m: m.weight, conv, weight)
    assert jax.eval_shape(conv, y).shape == z.shape
    # The VJP under jax.jit: one compilation per example instead of one per eager operation.
    pulled_back = jax.jit(lambda y, z: jax.vjp(conv, y)[1](z)[0])(jnp.zeros_like(y), z)
    np.testing.assert_allclose(pulled_back, y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("padding", ["SAME", "SAME_LOWER"])
@pytest.mark.parametrize("kernel_size,stride", [(3, 2), (4, 1)])
def test_circular_conv_transpose_matches_equinox(padding, kernel_size, stride):
    eqx = pytest.importorskip("equinox", reason="Equinox is not installed (a peer, optional)")
    key = jax.random.key(4)
    args = (2, 3, 4, kernel_size, stride, padding)
    theirs = eqx.nn.ConvTranspose(*args, padding_mode="CIRCULAR", key=key)
    ours = nn.ConvTranspose(*args, padding_mode="CIRCULAR", key=key)
    ours = tm.tree_at(lambda m: m.weight, ours, theirs.weight[:, :, ::-1, ::-1])
    ours = tm.tree_at(lambda m: m.bias, ours, theirs.bias.reshape(-1))
    x = jax.random.normal(key, (3, 5, 6))
    np.testing.assert_allclose(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


def test_rotary_embedding_errors_name_the_class():
    with pytest.raises(ValueError, match="RotaryPositionalEmbedding: `embedding_size` must be"):
        nn.RotaryPositionalEmbedding(5)
    with pytest.raises(ValueError, match=r"RotaryPositionalEmbedding: `x` must have shape .*=4"):
        nn.RotaryPositionalEmbedding(4)(jnp.ones((3, 6)))


def test_weight_norm_matches_equinox():
    eqx = pytest.importorskip("equinox", reason="Equinox is not installed (a peer, optional)")
    key = jax.random.key(2)
    theirs = eqx.nn.WeightNorm(eqx.nn.Conv1d(2, 3, 3, key=key), axis=None)
    ours = nn.WeightNorm(nn.Conv1d(2, 3, 3, key=key), axis=None)
    ours = tm.tree_at(lambda m: m.layer.weight, ours, theirs.layer.weight)
    ours = tm.tree_at(lambda m: m.layer.bias, ours, theirs.layer.bias.reshape(-1))
    x = jax.random.normal(key, (2, 9))
    np.testing.assert_allclose(ours(x), theirs(x), rtol=1e-5, atol=1e-6)


def test_weight_norm_errors_name_the_layer_and_field():
    linear = nn.Linear(3, 2, key=jax.random.key(0))
    with pytest.raises(ValueError, match="WeightNorm: Linear has no array field 'kernel'"):
        nn.WeightNorm(linear, weight_name="kernel")
    with pytest.raises(ValueError, match=r"`axis=2` is out of range for the weight Linear.weight"):
        nn.WeightNorm(linear, axis=2)


def test_spectral_norm_estimates_the_largest_singular_value():
    w = jnp.diag(jnp.array([3.0, 1.0, 0.5]))
    linear = tm.tree_at(lambda m: m.weight, nn.Linear(3, 3, key=jax.random.key(0)), w)
    sn = nn.SpectralNorm(linear, key=jax.random.key(1))
    np.testing.assert_allclose(jnp.abs(sn.u.value), [1.0, 0.0, 0.0], atol=1e-4)
    np.testing.assert_allclose(sn.weight, w / 3.0, rtol=1e-5, atol=1e-6)


def test_spectral_norm_training_needs_stateful_and_errors_name_the_class():
    linear = nn.Linear(3, 2, key=jax.random.key(0))
    sn = nn.SpectralNorm(linear, key=jax.random.key(1))
    with pytest.raises(RuntimeError, match=r"SpectralNorm is in training mode.*stateful"):
        sn(jnp.ones(3))
    assert nn.inference_mode(sn)(jnp.ones(3)).shape == (2,)
    with pytest.raises(ValueError, match=r"SpectralNorm: Linear.bias must be an array of at least"):
        nn.SpectralNorm(linear, "bias", key=jax.random.key(1))
    with pytest.raises(ValueError, match="SpectralNorm: `num_power_iterations` must be an int"):
        nn.SpectralNorm(linear, num_power_iterations=-1, key=jax.random.key(1))


def test_spectral_norm_matches_equinox():
    eqx = pytest.importorskip("equinox", reason="Equinox is not installed (a peer, optional)")
    key, k2 = jax.random.key(3), jax.random.key(4)
    theirs, state = eqx.nn.make_with_state(eqx.nn.SpectralNorm)(
        eqx.nn.Linear(5, 4, key=key), "weight", key=k2
    )
    ours = nn.SpectralNorm(nn.Linear(5, 4, key=key), key=k2)
    ours = tm.tree_at(lambda m: m.layer.weight, ours, theirs.layer.weight)
    ours = tm.tree_at(lambda m: m.layer.bias, ours, theirs.layer.bias)
    u, v = state.get(theirs.uv_index)
    ours = tm.tree_at(lambda m: (m.u.value, m.v.value), ours, (u, v))
    x = jax.random.normal(key, (5,))
    y_theirs, state = theirs(x, state)
    y_ours, ours = tm.stateful(ours)(x)
    np.testing.assert_allclose(y_ours, y_theirs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours.u.value, state.get(theirs.uv_index)[0], rtol=1e-5, atol=1e-6)


def test_shared_ties_weights_and_sums_their_gradients():
    k1, k2 = jax.random.split(jax.random.key(5))
    embed, head = nn.Embedding(6, 3, key=k1), nn.Linear(3, 6, key=k2)
    shared = nn.Shared((embed, head), lambda p: p[1].weight, lambda p: p[0].weight)
    assert shared.pytree[1].weight is None  # one stored copy
    tokens = jnp.array([0, 4, 4, 2])

    def loss(shared):
        embed, head = shared()
        return jnp.sum(jnp.tanh(head(embed(tokens))))

    grads = tm.filter_grad(loss)(shared)

    def plain(w, b):  # the same model written with one matrix
        return jnp.sum(jnp.tanh(w[tokens] @ w.T + b[None]))

    want = jax.grad(plain)(embed.weight, head.bias)
    np.testing.assert_allclose(grads.pytree[0].weight, want, rtol=1e-5, atol=1e-6)
    assert grads.pytree[1].weight is None


def test_shared_mismatch_error_shows_both_sides():
    k1, k2 = jax.random.split(jax.random.key(5))
    embed, head = nn.Embedding(6, 3, key=k1), nn.Linear(3, 5, key=k2)
    match = r"Shared: Every node being shared together(.|\n)*f32\[6,3\]"
    with pytest.raises(ValueError, match=match):
        nn.Shared((embed, head), lambda p: p[1].weight, lambda p: p[0].weight)
