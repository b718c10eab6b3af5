"""Layers with a PyTorch counterpart: copy the parameters into it and compare (float32)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm
import treemod.nn as nn

from helpers import close, normal

torch = pytest.importorskip(
    "torch", reason="PyTorch (CPU) is not installed: `pip install -e '.[torch]'` to run these"
)


def t(a):
    return torch.from_numpy(np.array(a, dtype=np.float32))


@pytest.mark.parametrize("use_bias", [True, False])
def test_linear(use_bias):
    layer = nn.Linear(7, 5, use_bias=use_bias, key=jax.random.key(0))
    ref = torch.nn.Linear(7, 5, bias=use_bias)
    with torch.no_grad():
        ref.weight.copy_(t(layer.weight))
        if use_bias:
            ref.bias.copy_(t(layer.bias))
    x = normal((4, 3, 7), 1)
    close(layer(x), ref(t(x)))


def test_layer_norm():
    ours = nn.LayerNorm((4, 5), eps=1e-5)
    ours = ours.__class__((4, 5))
    w, b = normal((4, 5), 1), normal((4, 5), 2)
    import treemod as tm

    ours = tm.tree_at(lambda m: (m.weight, m.bias), ours, (w, b))
    ref = torch.nn.LayerNorm((4, 5), eps=1e-5)
    with torch.no_grad():
        ref.weight.copy_(t(w))
        ref.bias.copy_(t(b))
    x = normal((2, 3, 4, 5), 3) * 3.0 + 1.0
    close(ours(x), ref(t(x)))


def test_group_norm():
    import treemod as tm

    ours = nn.GroupNorm(3, 6, spatial_ndim=2)
    w, b = normal((6,), 1), normal((6,), 2)
    ours = tm.tree_at(lambda m: (m.weight, m.bias), ours, (w, b))
    ref = torch.nn.GroupNorm(3, 6, eps=1e-5)
    with torch.no_grad():
        ref.weight.copy_(t(w))
        ref.bias.copy_(t(b))
    x = normal((2, 6, 4, 5), 3) * 2.0
    close(ours(x), ref(t(x)))
    # Equinox convention: a single unbatched example without spatial_ndim.
    unbatched = nn.GroupNorm(3, 6)
    unbatched = tm.tree_at(lambda m: (m.weight, m.bias), unbatched, (w, b))
    close(unbatched(x[0]), ref(t(x[:1]))[0])


def test_rms_norm():
    import treemod as tm

    ours = nn.RMSNorm(8, eps=1e-5, use_bias=False)
    w = normal((8,), 1)
    ours = tm.tree_at(lambda m: m.weight, ours, w)
    ref = torch.nn.RMSNorm(8, eps=1e-5)
    with torch.no_grad():
        ref.weight.copy_(t(w))
    x = normal((4, 5, 8), 3)
    close(ours(x), ref(t(x)))


def test_embedding():
    ours = nn.Embedding(11, 4, key=jax.random.key(0))
    ref = torch.nn.Embedding(11, 4)
    with torch.no_grad():
        ref.weight.copy_(t(ours.weight))
    idx = jax.random.randint(jax.random.key(1), (3, 5), 0, 11)
    close(ours(idx), ref(torch.from_numpy(np.array(idx)).long()))


def _torch_mha(ours, embed, heads, kdim, vdim):
    ref = torch.nn.MultiheadAttention(
        embed, heads, bias=True, kdim=kdim, vdim=vdim, batch_first=True
    )
    with torch.no_grad():
        if kdim == embed and vdim == embed:
            w = np.concatenate(
                [
                    np.asarray(ours.query_proj.weight),
                    np.asarray(ours.key_proj.weight),
                    np.asarray(ours.value_proj.weight),
                ]
            )
            ref.in_proj_weight.copy_(t(w))
        else:
            ref.q_proj_weight.copy_(t(ours.query_proj.weight))
            ref.k_proj_weight.copy_(t(ours.key_proj.weight))
            ref.v_proj_weight.copy_(t(ours.value_proj.weight))
        b = np.concatenate(
            [
                np.asarray(ours.query_proj.bias),
                np.asarray(ours.key_proj.bias),
                np.asarray(ours.value_proj.bias),
            ]
        )
        ref.in_proj_bias.copy_(t(b))
        ref.out_proj.weight.copy_(t(ours.output_proj.weight))
        ref.out_proj.bias.copy_(t(ours.output_proj.bias))
    return ref


def _mha(embed, heads, kdim=None, vdim=None):
    return nn.MultiheadAttention(
        heads,
        embed,
        key_size=kdim,
        value_size=vdim,
        use_query_bias=True,
        use_key_bias=True,
        use_value_bias=True,
        use_output_bias=True,
        key=jax.random.key(0),
    )


@pytest.mark.parametrize("q_len,kv_len,kdim,vdim", [(5, 5, 16, 16), (4, 9, 16, 16), (6, 3, 10, 7)])
def test_mha_no_mask(q_len, kv_len, kdim, vdim):
    ours = _mha(16, 4, kdim, vdim)
    ref = _torch_mha(ours, 16, 4, kdim, vdim)
    q, k, v = normal((2, q_len, 16), 1), normal((2, kv_len, kdim), 2), normal((2, kv_len, vdim), 3)
    expected, _ = ref(t(q), t(k), t(v), need_weights=False)
    close(ours(q, k, v), expected)


def _random_mask(seed, shape):
    m = jax.random.bernoulli(jax.random.key(seed), 0.7, shape)
    return m.at[..., 0].set(True)  # no fully masked row (PyTorch gives NaN there)


def test_mha_masks():
    ours = _mha(16, 4)
    ref = _torch_mha(ours, 16, 4, 16, 16)
    q, k = normal((3, 5, 16), 1), normal((3, 8, 16), 2)
    shared = _random_mask(4, (5, 8))
    expected, _ = ref(
        t(q), t(k), t(k), attn_mask=torch.from_numpy(~np.asarray(shared)), need_weights=False
    )
    close(ours(q, k, k, shared), expected)
    per_head = _random_mask(5, (3, 4, 5, 8))
    torch_mask = torch.from_numpy(~np.asarray(per_head).reshape(12, 5, 8))
    expected, _ = ref(t(q), t(k), t(k), attn_mask=torch_mask, need_weights=False)
    close(ours(q, k, k, per_head), expected)
    per_example = _random_mask(6, (3, 5, 8))
    torch_mask = torch.from_numpy(np.repeat(~np.asarray(per_example), 4, axis=0))
    expected, _ = ref(t(q), t(k), t(k), attn_mask=torch_mask, need_weights=False)
    close(ours(q, k, k, per_example), expected)


@pytest.mark.parametrize("q_len,kv_len", [(6, 6), (4, 7)])
def test_mha_causal(q_len, kv_len):
    ours = _mha(16, 2)
    ref = _torch_mha(ours, 16, 2, 16, 16)
    q, k = normal((2, q_len, 16), 1), normal((2, kv_len, 16), 2)
    causal = torch.ones(q_len, kv_len, dtype=torch.bool).tril()
    expected, _ = ref(t(q), t(k), t(k), attn_mask=~causal, need_weights=False)
    close(ours(q, k, k, causal=True), expected)


def test_gru_cell():
    ours = nn.GRUCell(5, 7, key=jax.random.key(0))
    ref = torch.nn.GRUCell(5, 7)
    b = np.asarray(ours.bias)
    with torch.no_grad():
        ref.weight_ih.copy_(t(ours.weight_ih))
        ref.weight_hh.copy_(t(ours.weight_hh))
        ref.bias_ih.copy_(t(b))
        ref.bias_hh.copy_(t(np.concatenate([np.zeros(14), np.asarray(ours.bias_n)])))
    x, h = normal((3, 5), 1), normal((3, 7), 2)
    close(ours(x, h), ref(t(x), t(h)))


def test_lstm_cell():
    ours = nn.LSTMCell(5, 7, key=jax.random.key(0))
    ref = torch.nn.LSTMCell(5, 7)
    with torch.no_grad():
        ref.weight_ih.copy_(t(ours.weight_ih))
        ref.weight_hh.copy_(t(ours.weight_hh))
        ref.bias_ih.copy_(t(ours.bias))
        ref.bias_hh.zero_()
    x, h, c = normal((3, 5), 1), normal((3, 7), 2), normal((3, 7), 3)
    h2, c2 = ours(x, (h, c))
    rh, rc = ref(t(x), (t(h), t(c)))
    close(h2, rh)
    close(c2, rc)


def test_mlp_matches_torch_sequential():
    ours = nn.MLP(3, 2, width_size=8, depth=2, activation=jax.nn.tanh, key=jax.random.key(0))
    layers = []
    for i, lin in enumerate(ours.layers):
        ref = torch.nn.Linear(lin.in_features, lin.out_features)
        with torch.no_grad():
            ref.weight.copy_(t(lin.weight))
            ref.bias.copy_(t(lin.bias))
        layers.append(ref)
        if i < 2:
            layers.append(torch.nn.Tanh())
    x = normal((6, 3), 1)
    close(ours(x), torch.nn.Sequential(*layers)(t(x)))


def test_default_init_matches_pytorch_in_distribution():
    """Linear/Conv default weights and biases: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) like PyTorch."""
    torch.manual_seed(0)
    cases = [
        (nn.Linear(400, 500, key=jax.random.key(0)), torch.nn.Linear(400, 500)),
        (
            nn.Conv2d(16, 300, 5, key=jax.random.key(1)),
            torch.nn.Conv2d(16, 300, 5),
        ),
    ]
    for ours, ref in cases:
        for name in ("weight", "bias"):
            a = np.asarray(getattr(ours, name)).ravel()
            b = getattr(ref, name).detach().numpy().ravel()
            n = a.size
            # Uniform(-c, c): mean 0 (std c/sqrt(3n)), std c/sqrt(3); both samples in [-c, c].
            c = 1 / np.sqrt(ours.weight[0].size)
            assert np.abs(a).max() <= c and np.abs(b).max() <= c * (1 + 1e-6)
            assert np.abs(a).max() > 0.95 * c
            assert abs(a.mean()) < 5 * c / np.sqrt(3 * n)
            assert abs(a.std() - b.std()) < 0.05 * b.std() + 6 * c / np.sqrt(n)
            assert abs(a.std() - c / np.sqrt(3)) < 0.03 * c + 6 * c / np.sqrt(n)


@pytest.mark.parametrize("channels", [None, 3])
def test_prelu_value_and_gradients(channels):
    x = normal((2, 3, 4, 5), 8)
    if channels is None:
        ours, ref = nn.PReLU(0.2), torch.nn.PReLU(init=0.2)
    else:
        slope = jnp.array([0.1, 0.2, 0.3]).reshape(3, 1, 1)
        ours, ref = nn.PReLU(slope), torch.nn.PReLU(num_parameters=3)
        with torch.no_grad():
            ref.weight.copy_(t(slope.reshape(3)))
    close(ours(x), ref(t(x)))
    weights = normal((*x.shape,), 9)
    g_slope, g_x = jax.grad(lambda m, x: jnp.sum(m(x) * weights), argnums=(0, 1))(ours, x)
    xt = t(x).requires_grad_()
    (ref(xt) * t(weights)).sum().backward()
    close(g_x, xt.grad)
    close(g_slope.negative_slope.reshape(-1), ref.weight.grad)


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_weight_norm_matches_torch_parametrization(kind):
    if kind == "linear":
        layer, ref = nn.Linear(5, 4, key=jax.random.key(0)), torch.nn.Linear(5, 4)
        x = normal((3, 5), 10)
    else:
        layer = nn.Conv2d(3, 4, 3, padding=1, key=jax.random.key(0))
        ref = torch.nn.Conv2d(3, 4, 3, padding=1)
        x = normal((2, 3, 6, 5), 10)
    with torch.no_grad():
        ref.weight.copy_(t(layer.weight))
        ref.bias.copy_(t(layer.bias))
    ours = nn.WeightNorm(layer)
    ref = torch.nn.utils.parametrizations.weight_norm(ref, dim=0)
    # Change the learnt length so that the test sees it used.
    ours = tm.tree_at(lambda m: m.g, ours, ours.g * 1.5)
    with torch.no_grad():
        ref.parametrizations.weight.original0.mul_(1.5)
    close(ours(x), ref(t(x)))
    weights = normal((*ours(x).shape,), 11)
    grads = jax.jit(jax.grad(lambda m: jnp.sum(m(x) * weights)))(ours)
    (ref(t(x)) * t(weights)).sum().backward()
    close(grads.g.reshape(-1), ref.parametrizations.weight.original0.grad.reshape(-1))
    close(grads.layer.weight, ref.parametrizations.weight.original1.grad)


@pytest.mark.parametrize("iterations", [1, 3])
def test_spectral_norm_matches_torch_parametrization(iterations):
    layer = nn.Conv2d(3, 4, 3, key=jax.random.key(0))
    ref = torch.nn.Conv2d(3, 4, 3)
    with torch.no_grad():
        ref.weight.copy_(t(layer.weight))
        ref.bias.copy_(t(layer.bias))
    ref = torch.nn.utils.parametrizations.spectral_norm(ref, n_power_iterations=iterations)
    ours = nn.SpectralNorm(layer, num_power_iterations=iterations, key=jax.random.key(1))
    # Start from PyTorch's estimates, so that both take the same power-method steps.
    sn = ref.parametrizations.weight[0]
    ours = tm.tree_at(
        lambda m: (m.u.value, m.v.value), ours, (jnp.asarray(sn._u), jnp.asarray(sn._v))
    )
    x = normal((2, 3, 6, 5), 12)
    weights = normal((2, 4, 4, 3), 13)

    def loss(model, x):
        y, model = tm.stateful(model)(x)
        return jnp.sum(y * weights), (y, model)

    # Under jax.jit: one compilation instead of one per eager operation of the power method.
    grads, (y, updated) = jax.jit(jax.grad(loss, has_aux=True))(ours, x)
    y_ref = ref(t(x))  # training mode: power iterations, then the normalised weight
    close(y, y_ref)
    close(updated.u.value, sn._u)
    close(updated.v.value, sn._v)
    (y_ref * t(weights)).sum().backward()
    close(grads.layer.weight, ref.parametrizations.weight.original.grad, atol=1e-4)
    # Inference (PyTorch's eval mode): the stored estimates, no iteration.
    ref.eval()
    close(nn.inference_mode(updated)(x), ref(t(x)))


def _complex(seed, *shape):
    real, imag = jax.random.normal(jax.random.key(seed), (2, *shape), jnp.float32)
    return jax.lax.complex(real, imag)


def _tc(a):
    return torch.from_numpy(np.array(a, dtype=np.complex64))


CF = dict(dtype=jnp.complex64)
COMPLEX_CASES = {
    "linear": (
        lambda k: nn.Linear(7, 5, key=k, **CF),
        lambda: torch.nn.Linear(7, 5, dtype=torch.cfloat),
        (4, 7),
    ),
    "conv2d": (
        lambda k: nn.Conv2d(4, 6, 3, padding=1, groups=2, key=k, **CF),
        lambda: torch.nn.Conv2d(4, 6, 3, padding=1, groups=2, dtype=torch.cfloat),
        (2, 4, 7, 6),
    ),
    "conv_transpose2d": (
        lambda k: nn.ConvTranspose2d(4, 6, 3, stride=2, key=k, **CF),
        lambda: torch.nn.ConvTranspose2d(4, 6, 3, stride=2, dtype=torch.cfloat),
        (2, 4, 5, 6),
    ),
}


@pytest.mark.parametrize("name", COMPLEX_CASES)
def test_complex_layers_match_torch(name):
    """Complex parameters and inputs: PyTorch's complex layers, same weights, same outputs."""
    make, make_ref, shape = COMPLEX_CASES[name]
    layer, ref = make(jax.random.key(0)), make_ref()
    assert layer.weight.dtype == jnp.complex64 and layer.bias.dtype == jnp.complex64
    weight = layer.weight
    if "transpose" in name:  # ours (out, in, *k); PyTorch's (in, out, *k)
        weight = jnp.swapaxes(weight, 0, 1)
    with torch.no_grad():
        ref.weight.copy_(_tc(weight))
        ref.bias.copy_(_tc(layer.bias))
    x = _complex(1, *shape)
    close(layer(x), ref(_tc(x)))


def test_complex_default_init_matches_pytorch_in_distribution():
    """Complex Linear: real and imaginary parts each U(-1/sqrt(fan_in), ...), independent."""
    torch.manual_seed(0)
    ours = nn.Linear(400, 500, key=jax.random.key(0), dtype=jnp.complex64)
    ref = torch.nn.Linear(400, 500, dtype=torch.cfloat)
    c = 1 / np.sqrt(400)
    for a, b in ((ours.weight, ref.weight), (ours.bias, ref.bias)):
        a, b = np.asarray(a).ravel(), b.detach().numpy().ravel()
        for part in (np.real, np.imag):
            assert np.abs(part(a)).max() <= c and np.abs(part(b)).max() <= c * (1 + 1e-6)
            assert abs(part(a).std() - part(b).std()) < 0.05 * part(b).std() + 6 * c / a.size**0.5
    w = np.asarray(ours.weight).ravel()
    assert abs(np.corrcoef(w.real, w.imag)[0, 1]) < 0.02  # two independent draws
